"""AutoAugment (Cubuk et al., CVPR 2019) with the CIFAR-10 policy, in plain torch on whole batches.

Each image draws one of the 25 learned sub-policies; each of its two operations is applied with
its probability, at the magnitude bin (0–9) the policy gives it, with a random sign for the
signed operations — the sampling and magnitude ranges of torchvision's ``AutoAugment``
(``AutoAugmentPolicy.CIFAR10``, ``_augmentation_space`` with 10 bins), which FedDecorr's release
applies after crop and flip. The operations work on images holding integers 0..255 (float
tensors N×C×H×W) and return integers 0..255, as the PIL operations the release ran on do:
geometric ones sample the nearest source pixel (PIL's rule: the floor of the inverse-mapped
pixel centre) and fill with black; blends truncate like ``Image.blend``; Sharpness smooths with
PIL's SMOOTH kernel (rounded, border pixels kept), Contrast blends with the rounded mean grey.
Every random draw comes from the caller's ``torch.Generator``.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from fedlatent.data.transfer import to_device

Op = tuple[str, float, int | None]            # (operation, probability, magnitude bin or None)

# The CIFAR-10 policy: 25 sub-policies of two operations (Cubuk et al. 2019, appendix, Table 7;
# the order and bins of torchvision's AutoAugmentPolicy.CIFAR10)
CIFAR10_POLICY: tuple[tuple[Op, Op], ...] = (
    (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
    (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
    (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
    (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
    (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
    (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
    (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
    (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
    (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
    (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
    (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
    (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
    (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
    (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
    (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
    (("Color", 0.9, 9), ("Equalize", 0.6, None)),
    (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
    (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
    (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
    (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
    (("Equalize", 0.8, None), ("Invert", 0.1, None)),
    (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
)

POLICIES = {"cifar10": CIFAR10_POLICY}
DRAWS = ("choice", "probs", "signs")  # what :func:`draw` makes and :func:`apply` reads on the host
SIGNED = frozenset({"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate",
                    "Brightness", "Color", "Contrast", "Sharpness"})


def magnitude(op: str, level: int | None, height: int, width: int) -> float:
    """The unsigned magnitude of bin ``level`` (0..9) of ``op`` (torchvision's 10-bin space)."""
    if level is None:
        return 0.0
    top = {"ShearX": 0.3, "ShearY": 0.3, "TranslateX": 150.0 / 331.0 * width,
           "TranslateY": 150.0 / 331.0 * height, "Rotate": 30.0, "Brightness": 0.9, "Color": 0.9,
           "Contrast": 0.9, "Sharpness": 0.9}
    if op in top:
        return top[op] * level / 9
    if op == "Posterize":
        return float(8 - round(level / (9 / 4)))
    if op == "Solarize":
        return 255.0 * (1 - level / 9)
    raise ValueError(f"operation {op!r} has no magnitude")


# ---------------------------------------------------------------- geometric operations

def affine_nearest(x: Tensor, matrix: Tensor) -> Tensor:
    """Output pixel (i, j) takes input pixel floor(M · (j + ½, i + ½, 1)) (PIL's AFFINE with
    NEAREST); outside the image it is black. ``matrix``: N×6 rows (a, b, c, d, e, f) mapping
    output (u, v) to input (a u + b v + c, d u + e v + f)."""
    n, c, h, w = x.shape
    v, u = torch.meshgrid(torch.arange(h, dtype=torch.float64, device=x.device) + 0.5,
                          torch.arange(w, dtype=torch.float64, device=x.device) + 0.5, indexing="ij")
    m = matrix.to(x.device, torch.float64)[:, :, None, None]
    src_u = torch.floor(m[:, 0] * u + m[:, 1] * v + m[:, 2]).long()
    src_v = torch.floor(m[:, 3] * u + m[:, 4] * v + m[:, 5]).long()
    inside = (src_u >= 0) & (src_u < w) & (src_v >= 0) & (src_v < h)
    flat = src_v.clamp(0, h - 1) * w + src_u.clamp(0, w - 1)
    out = x.reshape(n, c, h * w).gather(2, flat.reshape(n, 1, h * w).expand(n, c, h * w))
    return out.reshape(n, c, h, w) * inside.to(x.dtype)[:, None]


def _rows(*columns: Tensor) -> Tensor:
    return torch.stack(columns, dim=1)


def shear_x(x: Tensor, m: Tensor) -> Tensor:
    """Shear about the top-left corner: output (u, v) reads input (u + m v, v)."""
    one, zero = torch.ones_like(m), torch.zeros_like(m)
    return affine_nearest(x, _rows(one, m, zero, zero, one, zero))


def shear_y(x: Tensor, m: Tensor) -> Tensor:
    """Shear about the top-left corner: output (u, v) reads input (u, m u + v)."""
    one, zero = torch.ones_like(m), torch.zeros_like(m)
    return affine_nearest(x, _rows(one, zero, zero, m, one, zero))


def translate_x(x: Tensor, m: Tensor) -> Tensor:
    """Shift right by int(m) pixels (truncated toward zero, as torchvision does)."""
    one, zero = torch.ones_like(m), torch.zeros_like(m)
    return affine_nearest(x, _rows(one, zero, -torch.trunc(m), zero, one, zero))


def translate_y(x: Tensor, m: Tensor) -> Tensor:
    """Shift down by int(m) pixels."""
    one, zero = torch.ones_like(m), torch.zeros_like(m)
    return affine_nearest(x, _rows(one, zero, zero, zero, one, -torch.trunc(m)))


def rotate(x: Tensor, degrees: Tensor) -> Tensor:
    """Rotate counter-clockwise by ``degrees`` about the image centre (PIL's ``Image.rotate``)."""
    h, w = x.shape[-2:]
    t = -torch.deg2rad(degrees.to(torch.float64))
    cos, sin = torch.cos(t), torch.sin(t)
    cx, cy = w / 2, h / 2
    return affine_nearest(x, _rows(cos, sin, cx - cos * cx - sin * cy,
                                   -sin, cos, cy + sin * cx - cos * cy))


# ---------------------------------------------------------------- colour operations

def _per_sample(m: Tensor, x: Tensor) -> Tensor:
    return m.to(x.device, x.dtype)[:, None, None, None]


def blend(degenerate: Tensor, x: Tensor, factor: Tensor) -> Tensor:
    """``Image.blend(degenerate, x, factor)``: degenerate + factor (x − degenerate), clipped, truncated."""
    return torch.floor((degenerate + _per_sample(factor, x) * (x - degenerate)).clamp(0, 255))


def grey(x: Tensor) -> Tensor:
    """PIL's L conversion (ITU-R 601-2, fixed point); one-channel images are their own grey."""
    if x.shape[1] == 1:
        return x
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    return torch.floor((r * 19595 + g * 38470 + b * 7471 + 32768) / 65536)


def brightness(x: Tensor, m: Tensor) -> Tensor:
    return blend(torch.zeros_like(x), x, 1 + m)


def color(x: Tensor, m: Tensor) -> Tensor:
    return blend(grey(x).expand_as(x), x, 1 + m)


def contrast(x: Tensor, m: Tensor) -> Tensor:
    mean = torch.floor(grey(x).mean(dim=(1, 2, 3), keepdim=True) + 0.5)
    return blend(mean.expand_as(x), x, 1 + m)


def sharpness(x: Tensor, m: Tensor) -> Tensor:
    """Blend with the image smoothed by PIL's SMOOTH kernel (1s around a centre 5, / 13)."""
    c = x.shape[1]
    kernel = torch.ones(3, 3, dtype=x.dtype, device=x.device)
    kernel[1, 1] = 5.0
    kernel = (kernel / 13).expand(c, 1, 3, 3)
    smooth = x.clone()
    smooth[..., 1:-1, 1:-1] = torch.round(torch.nn.functional.conv2d(x, kernel, groups=c))
    return blend(smooth, x, 1 + m)


def posterize(x: Tensor, bits: Tensor) -> Tensor:
    """Keep the top ``bits`` bits of each value."""
    step = 2.0 ** (8 - _per_sample(bits, x))
    return torch.floor(x / step) * step


def solarize(x: Tensor, threshold: Tensor) -> Tensor:
    """Invert the values at or above ``threshold``."""
    return torch.where(x >= _per_sample(threshold, x), 255 - x, x)


def invert(x: Tensor, _: Tensor) -> Tensor:
    return 255 - x


def autocontrast(x: Tensor, _: Tensor) -> Tensor:
    """Stretch each channel to 0..255 (a constant channel is left as it is)."""
    lo = x.amin(dim=(2, 3), keepdim=True)
    hi = x.amax(dim=(2, 3), keepdim=True)
    flat = hi <= lo
    scale = torch.where(flat, torch.ones_like(hi), 255 / (hi - lo).clamp_min(1))
    lo = torch.where(flat, torch.zeros_like(lo), lo)
    return torch.floor(((x - lo) * scale).clamp(0, 255))


def equalize(x: Tensor, _: Tensor) -> Tensor:
    """Histogram equalisation per channel (PIL's ``ImageOps.equalize``): step = ⌊(pixels not in
    the top occupied bin) / 255⌋, lut[v] = ⌊(cdf(v − 1) + ⌊step / 2⌋) / step⌋; step 0 leaves the channel."""
    n, c, h, w = x.shape
    values = x.reshape(n * c, h * w).long().clamp(0, 255)
    hist = torch.zeros(n * c, 256, dtype=torch.long, device=x.device).scatter_add_(
        1, values, torch.ones_like(values))
    top = 255 - torch.argmax((hist.flip(1) > 0).long(), dim=1)          # the last occupied bin
    step = torch.div(h * w - hist.gather(1, top[:, None])[:, 0], 255, rounding_mode="floor")
    below = torch.cumsum(hist, 1) - hist                               # cdf(v − 1)
    safe = step.clamp_min(1)[:, None]
    lut = torch.div(below + torch.div(step, 2, rounding_mode="floor")[:, None], safe,
                    rounding_mode="floor").clamp(0, 255)
    out = torch.where(step[:, None] > 0, lut.gather(1, values), values)
    return out.reshape(n, c, h, w).to(x.dtype)


OPS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "ShearX": shear_x, "ShearY": shear_y, "TranslateX": translate_x, "TranslateY": translate_y,
    "Rotate": rotate, "Brightness": brightness, "Color": color, "Contrast": contrast,
    "Sharpness": sharpness, "Posterize": posterize, "Solarize": solarize, "Invert": invert,
    "AutoContrast": autocontrast, "Equalize": equalize,
}


def draw(n: int, generator: torch.Generator, policy: str = "cifar10") -> dict[str, Tensor]:
    """The draws of n images, in order: the sub-policy (``choice``), two uniform numbers against
    the probabilities (``probs``, n×2), two signs (``signs``, n×2) — a fixed amount per image, so
    a round's draws can be made ahead of its batches."""
    choice = torch.randint(0, len(POLICIES[policy]), (n,), generator=generator)
    probs = torch.rand(n, 2, generator=generator)
    signs = torch.randint(0, 2, (n, 2), generator=generator)
    return {"choice": choice, "probs": probs, "signs": signs}


def apply(x: Tensor, drawn: dict[str, Tensor], policy: str = "cifar10") -> Tensor:
    """The named policy on N×C×H×W images holding integers 0..255, with the draws of :func:`draw`
    (read on the host: which images each operation takes is decided there, as for any batch; the
    draws are made there, so a caller that keeps them there copies nothing back). Every
    operation's images and magnitudes go to the images' device in one copy, and the operations
    build their maps there."""
    table = POLICIES[policy]
    _, _, h, w = x.shape
    choice, probs, signs = (drawn[k].cpu() for k in DRAWS)
    ops, picks, mags = [], [], []
    for stage in range(2):
        for k, sub in enumerate(table):
            name, p, level = sub[stage]
            idx = ((choice == k) & (probs[:, stage] <= p)).nonzero()[:, 0]
            if len(idx) == 0:
                continue
            mag = torch.full((len(idx),), magnitude(name, level, h, w), dtype=torch.float64)
            if name in SIGNED:
                mag = torch.where(signs[idx, stage] == 0, -mag, mag)
            ops.append(name)
            picks.append(idx)
            mags.append(mag)
    out = x.clone()
    if not ops:
        return out
    sizes = [len(idx) for idx in picks]
    for name, idx, mag in zip(ops, to_device(torch.cat(picks), x.device).split(sizes),
                              to_device(torch.cat(mags), x.device).split(sizes)):
        out[idx] = OPS[name](out[idx], mag)
    return out



def autoaugment(x: Tensor, generator: torch.Generator, policy: str = "cifar10") -> Tensor:
    """Apply the named policy to N×C×H×W images holding integers 0..255; one sub-policy per image.
    Draws (per image): the sub-policy, two uniform numbers against the probabilities, two signs."""
    return apply(x, draw(x.shape[0], generator, policy), policy)
