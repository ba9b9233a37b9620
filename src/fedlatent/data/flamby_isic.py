"""FLamby's Fed-ISIC2019 training augmentation (``data.augment_policy = "flamby_isic"``) in plain
torch on whole batches.

FLamby (du Terrail et al., NeurIPS 2022 Datasets & Benchmarks; ``flamby/datasets/fed_isic2019``)
composes, with albumentations' defaults: ``RandomScale(0.07)``, ``Rotate(50)``,
``RandomBrightnessContrast(0.15, 0.1)``, ``Flip``, ``Affine(shear=0.1)`` (each with probability
1/2), ``RandomCrop(200, 200)``, ``CoarseDropout`` (1–8 holes of 16×16, probability 1/2) and
ImageNet's ``Normalize``. Written as torch ops rather than with albumentations because that
adds no dependency, every draw comes from the run's ``torch.Generator`` (albumentations draws
from Python's global ``random``, so runs would not repeat for a seed) and a batch is augmented
at once instead of image by image through NumPy/OpenCV.

Images are float N×C×H×W in [0, 1] (the batch's ImageNet standardisation is undone around this,
see :func:`fedlatent.data.augment.augment_batch`), on any device; the draws are made on the host
(the client's generator), and their per-image values and the maps go to the images' device
without waiting (:func:`fedlatent.data.transfer.to_device`), where the sampling grid is made. Differences from albumentations, by design:
scale, rotation and shear are one bilinear resampling (one interpolation instead of three) on a
canvas of fixed size, with the border mirrored (albumentations: reflect-101); the scale zooms
about the centre before the crop rather than resizing the canvas; the flip comes after the
shear (the same in distribution: the shear's range is symmetric); the number of holes is drawn
per image (FLamby draws it once per data set). Shear is in degrees, as albumentations reads it.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from fedlatent.data.transfer import to_device

SCALE = 0.07          # RandomScale: factor in [1 − 0.07, 1 + 0.07]
ROTATE = 50.0         # Rotate: degrees in [−50, 50]
BRIGHTNESS = 0.15     # RandomBrightnessContrast: + β, β in [−0.15, 0.15] (of the maximum value)
CONTRAST = 0.1        # × α, α in [0.9, 1.1]
SHEAR = 0.1           # Affine: shear degrees in [−0.1, 0.1], along x and along y
HOLES = (1, 8)        # CoarseDropout: holes per image
HOLE = 16             # hole side in pixels


def _uniform(n: int, limit: float, generator: torch.Generator) -> Tensor:
    """n draws from U(−limit, limit), float64."""
    return (torch.rand(n, generator=generator, dtype=torch.float64) * 2 - 1) * limit


def _coin(n: int, generator: torch.Generator) -> Tensor:
    return torch.rand(n, generator=generator) < 0.5


def warp(x: Tensor, matrix: Tensor) -> Tensor:
    """Output pixel at ``p`` (pixel units about the image centre, x right, y down) reads the
    input at ``matrix[k] @ p`` (N×2×2), bilinear, the border mirrored. The N×2×3 maps go to the
    images' device, where the sampling grid is made."""
    n, _, h, w = x.shape
    # to grid_sample's normalised coordinates (align_corners=False): p = D q, D = diag(w/2, h/2)
    d = torch.tensor([w / 2, h / 2], dtype=torch.float64, device=matrix.device)
    theta = matrix.to(torch.float64) * d[None, None, :] / d[None, :, None]  # D⁻¹ M D
    theta = torch.cat([theta, torch.zeros(n, 2, 1, dtype=torch.float64, device=matrix.device)], dim=2)
    grid = F.affine_grid(to_device(theta.to(x.dtype), x.device), [n, x.shape[1], h, w], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def rotation(degrees: Tensor) -> Tensor:
    """N×2×2 inverse maps of a rotation counter-clockwise (as displayed, y down) by ``degrees``."""
    t = torch.deg2rad(degrees.to(torch.float64))
    cos, sin = torch.cos(t), torch.sin(t)
    return torch.stack([torch.stack([cos, -sin], 1), torch.stack([sin, cos], 1)], 1)


def zoom(factor: Tensor) -> Tensor:
    """N×2×2 inverse maps of a zoom by ``factor`` about the centre (> 1 enlarges)."""
    eye = torch.eye(2, dtype=torch.float64)
    return eye[None] / factor.to(torch.float64)[:, None, None]


def shear(degrees_x: Tensor, degrees_y: Tensor) -> Tensor:
    """N×2×2 inverse maps of albumentations' shear: x' = x + tan(sx) y, y' = y + tan(sy) x."""
    tx = torch.tan(torch.deg2rad(degrees_x.to(torch.float64)))
    ty = torch.tan(torch.deg2rad(degrees_y.to(torch.float64)))
    one = torch.ones_like(tx)
    forward = torch.stack([torch.stack([one, tx], 1), torch.stack([ty, one], 1)], 1)
    return torch.linalg.inv(forward)


def brightness_contrast(x: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
    """albumentations' brightness/contrast (by the maximum value): clip(α x + β, 0, 1) per image."""
    a = to_device(alpha.to(x.dtype), x.device)[:, None, None, None]
    b = to_device(beta.to(x.dtype), x.device)[:, None, None, None]
    return (a * x + b).clamp(0, 1)


def flip(x: Tensor, mode: Tensor) -> Tensor:
    """albumentations' ``Flip`` per image: mode 0 keeps, 1 left-right, 2 up-down, 3 both."""
    m = to_device(mode, x.device)[:, None, None, None]
    x = torch.where((m == 1) | (m == 3), x.flip(-1), x)
    return torch.where((m == 2) | (m == 3), x.flip(-2), x)


def crop(x: Tensor, top: Tensor, left: Tensor, size: int) -> Tensor:
    """The size×size window at (top, left) of each image."""
    n, c = x.shape[:2]
    rows = (to_device(top, x.device)[:, None] + torch.arange(size, device=x.device))[:, None, :, None]
    cols = (to_device(left, x.device)[:, None] + torch.arange(size, device=x.device))[:, None, None, :]
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    chan = torch.arange(c, device=x.device)[None, :, None, None]
    return x[batch, chan, rows, cols]


def holes(x: Tensor, top: Tensor, left: Tensor, used: Tensor, side: int) -> Tensor:
    """Zero side×side squares at (top, left) (N×K) where ``used`` (N×K) is true."""
    h, w = x.shape[-2:]
    rows = torch.arange(h, device=x.device)[None, None, :, None]
    cols = torch.arange(w, device=x.device)[None, None, None, :]
    t, lft = to_device(top, x.device)[:, :, None, None], to_device(left, x.device)[:, :, None, None]
    inside = (rows >= t) & (rows < t + side) & (cols >= lft) & (cols < lft + side)
    cut = (inside & to_device(used, x.device)[:, :, None, None]).any(dim=1)
    return x * (~cut)[:, None].to(x.dtype)


def flamby_isic(x: Tensor, generator: torch.Generator, size: int) -> Tensor:
    """FLamby's Fed-ISIC2019 training augmentation of N×C×H×W images in [0, 1], ending in a random
    size×size crop (H, W ≥ size). Draws, in order: which of scale / rotate / brightness-contrast /
    flip / shear / dropout apply (N×6 coins), their parameters, the crop offsets, the holes."""
    n, _, h, w = x.shape
    if h < size or w < size:
        raise ValueError(f"cannot crop {size}×{size} from {h}×{w} images")
    on = torch.rand(n, 6, generator=generator) < 0.5
    factor = torch.where(on[:, 0], 1 + _uniform(n, SCALE, generator), torch.ones(n, dtype=torch.float64))
    angle = torch.where(on[:, 1], _uniform(n, ROTATE, generator), torch.zeros(n, dtype=torch.float64))
    alpha = torch.where(on[:, 2], 1 + _uniform(n, CONTRAST, generator), torch.ones(n, dtype=torch.float64))
    beta = torch.where(on[:, 2], _uniform(n, BRIGHTNESS, generator), torch.zeros(n, dtype=torch.float64))
    mode = torch.where(on[:, 3], torch.randint(1, 4, (n,), generator=generator), torch.zeros(n, dtype=torch.long))
    sx, sy = (torch.where(on[:, 4], _uniform(n, SHEAR, generator), torch.zeros(n, dtype=torch.float64))
              for _ in range(2))
    # inverse maps compose in reverse: output → shear⁻¹ → rotation⁻¹ → zoom⁻¹ → input
    inverse = zoom(factor) @ rotation(angle) @ shear(sx, sy)
    if not torch.allclose(inverse, torch.eye(2, dtype=torch.float64).expand(n, 2, 2)):
        x = warp(x, inverse)
    x = flip(brightness_contrast(x, alpha, beta), mode)
    top = torch.randint(0, h - size + 1, (n,), generator=generator)
    left = torch.randint(0, w - size + 1, (n,), generator=generator)
    x = crop(x, top, left, size)
    side = min(HOLE, size)
    count = torch.randint(HOLES[0], HOLES[1] + 1, (n,), generator=generator)
    hole_top = torch.randint(0, size - side + 1, (n, HOLES[1]), generator=generator)
    hole_left = torch.randint(0, size - side + 1, (n, HOLES[1]), generator=generator)
    used = on[:, 5:6] & (torch.arange(HOLES[1])[None] < count[:, None])
    return holes(x, hole_top, hole_left, used, side)


__all__ = ["flamby_isic", "warp", "rotation", "zoom", "shear", "brightness_contrast", "flip", "crop", "holes"]
