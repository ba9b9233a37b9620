"""Batch augmentation in plain torch: random crop with zero padding, horizontal flip, AutoAugment
and a data set's own training transform (FLamby's Fed-ISIC2019 one).

Applied to a whole batch of tensors at once (no per-sample Python loop), driven by an explicit
``torch.Generator`` so runs stay deterministic for a seed. Crop + flip and AutoAugment draw a fixed
amount per image, so a batch's augmentation is :func:`draw` (on the host, in the order
:func:`augment_batch` draws) then :func:`apply` (on the images' device): the lockstep trainer draws
a client's whole round at its start and applies the draws to many clients' batches at once. A data
set's transform decides per batch how to resample, so it is applied batch by batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from fedlatent.data import autoaugment
from fedlatent.data.flamby_isic import flamby_isic

# data.augment_policy → transform of images in [0, 1] ending in a crop to the model's input side
POLICIES: dict[str, Callable[[Tensor, torch.Generator, int], Tensor]] = {"flamby_isic": flamby_isic}
READ_ON_HOST = frozenset(autoaugment.DRAWS)  # the draws :func:`apply` reads on the host (best kept there)


@dataclass(frozen=True)
class Augmentation:
    """What a run does to its training batches: crop + flip (``data.augment``), then an AutoAugment
    policy (``data.autoaugment``) applied in pixel space — the batches hold standardised values,
    so ``mean`` and ``std`` (per channel, C×1×1, or scalars) map them back to 0..1 and forth —
    and a data set's training transform (``data.augment_policy``), which crops the stored images
    to ``size`` × ``size``. False when it does nothing."""

    crop_flip: bool = False
    policy: str = "none"
    mean: np.ndarray | float = 0.0
    std: np.ndarray | float = 1.0
    transform: str = "none"
    size: int = 0

    def __bool__(self) -> bool:
        return self.crop_flip or self.policy != "none" or self.transform != "none"


def crop_offsets(n: int, padding: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """The (top, left) offsets of n random crops of images padded by ``padding``: top first."""
    top = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    left = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    return top, left


def flips(n: int, generator: torch.Generator) -> Tensor:
    """Which of n images flip left-right, each with probability 1/2."""
    return torch.rand(n, generator=generator) < 0.5


def crop_at(x: Tensor, padding: int, top: Tensor, left: Tensor) -> Tensor:
    """Pad N×C×H×W by ``padding`` zeros and take the H×W window at (top, left) of each image: one
    indexing op for the whole batch (``top``, ``left``: N offsets, moved to ``x``'s device)."""
    n, c, h, w = x.shape
    padded = F.pad(x, (padding,) * 4)
    rows = (top.to(x.device)[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (left.to(x.device)[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    chan = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, chan, rows, cols]


def flip_where(x: Tensor, flip: Tensor) -> Tensor:
    """``x`` with the images where ``flip`` is true flipped left-right."""
    return torch.where(flip.to(x.device)[:, None, None, None], x.flip(-1), x)


def random_crop(x: Tensor, padding: int, generator: torch.Generator) -> Tensor:
    """Pad N×C×H×W by ``padding`` zeros and crop a random H×W window per sample."""
    return crop_at(x, padding, *crop_offsets(x.shape[0], padding, generator))


def random_flip(x: Tensor, generator: torch.Generator) -> Tensor:
    """Flip each sample left-right with probability 1/2."""
    return flip_where(x, flips(x.shape[0], generator))


def pixel_autoaugment(x: Tensor, drawn: dict[str, Tensor], aug: Augmentation) -> Tensor:
    """AutoAugment on standardised images with its draws (:func:`~fedlatent.data.autoaugment.draw`):
    to integers 0..255, the policy, and back."""
    mean = torch.as_tensor(aug.mean, dtype=x.dtype, device=x.device)
    std = torch.as_tensor(aug.std, dtype=x.dtype, device=x.device)
    pixels = torch.round((x * std + mean).clamp(0, 1) * 255)
    return (autoaugment.apply(pixels, drawn, aug.policy) / 255 - mean) / std


def pixel_transform(x: Tensor, generator: torch.Generator, aug: Augmentation) -> Tensor:
    """The data set's transform on standardised images: to [0, 1], the transform, and back (the
    standardisation is the transform's final normalisation)."""
    mean = torch.as_tensor(aug.mean, dtype=x.dtype, device=x.device)
    std = torch.as_tensor(aug.std, dtype=x.dtype, device=x.device)
    return (POLICIES[aug.transform]((x * std + mean).clamp(0, 1), generator, aug.size) - mean) / std


def pooled(augmentation: Augmentation | bool) -> bool:
    """Whether a batch's augmentation is :func:`draw` then :func:`apply` alone, so that a round's
    draws can be made at its start and applied to many clients' batches at once: crop + flip and
    AutoAugment draw a fixed amount per image; a data set's transform (FLamby's) chooses per batch
    whether to resample, so it is applied batch by batch."""
    aug = augmentation if isinstance(augmentation, Augmentation) else Augmentation(crop_flip=augmentation)
    return aug.transform == "none"


def draw(n: int, generator: torch.Generator, augmentation: Augmentation | bool = True,
         padding: int = 4) -> dict[str, Tensor]:
    """The draws of a batch of n images after the data set's transform, in the order
    :func:`augment_batch` makes them: the crops' top then left offsets, the flips, the policy's."""
    aug = augmentation if isinstance(augmentation, Augmentation) else Augmentation(crop_flip=augmentation)
    drawn: dict[str, Tensor] = {}
    if aug.crop_flip:
        drawn["top"], drawn["left"] = crop_offsets(n, padding, generator)
        drawn["flip"] = flips(n, generator)
    if aug.policy != "none":
        drawn.update(autoaugment.draw(n, generator, aug.policy))
    return drawn


def apply(x: Tensor, drawn: dict[str, Tensor], augmentation: Augmentation | bool = True, padding: int = 4) -> Tensor:
    """Crop + flip, then the AutoAugment policy, of N×C×H×W images with their draws (:func:`draw`;
    row k's draws for image k, whatever batch or client it comes from)."""
    aug = augmentation if isinstance(augmentation, Augmentation) else Augmentation(crop_flip=augmentation)
    if aug.crop_flip:
        x = flip_where(crop_at(x, padding, drawn["top"], drawn["left"]), drawn["flip"])
    if aug.policy != "none":
        x = pixel_autoaugment(x, drawn, aug)
    return x


def augment_batch(x: Tensor, generator: torch.Generator, augmentation: Augmentation | bool = True,
                  padding: int = 4) -> Tensor:
    """The data set's transform an :class:`Augmentation` names, the CIFAR-style augmentation of the
    seed papers (crop + flip; ``True``), then its AutoAugment policy; inputs that are not images
    pass unchanged."""
    aug = augmentation if isinstance(augmentation, Augmentation) else Augmentation(crop_flip=augmentation)
    if x.dim() != 4:
        return x
    if aug.transform != "none":
        x = pixel_transform(x, generator, aug)
    return apply(x, draw(x.shape[0], generator, aug, padding), aug, padding)
