"""Batch augmentation in plain torch: random crop with zero padding and horizontal flip.

Applied to a whole batch of tensors at once (no per-sample Python loop), driven by an explicit
``torch.Generator`` so runs stay deterministic for a seed.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F


def random_crop(x: Tensor, padding: int, generator: torch.Generator) -> Tensor:
    """Pad N×C×H×W by ``padding`` zeros and crop a random H×W window per sample."""
    n, c, h, w = x.shape
    padded = F.pad(x, (padding,) * 4)
    top = torch.randint(0, 2 * padding + 1, (n,), generator=generator).to(x.device)
    left = torch.randint(0, 2 * padding + 1, (n,), generator=generator).to(x.device)
    rows = (top[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (left[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    chan = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, chan, rows, cols]


def random_flip(x: Tensor, generator: torch.Generator) -> Tensor:
    """Flip each sample left-right with probability 1/2."""
    flip = (torch.rand(x.shape[0], generator=generator) < 0.5).to(x.device)
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


def augment_batch(x: Tensor, generator: torch.Generator, padding: int = 4) -> Tensor:
    """The CIFAR-style augmentation of the seed papers; inputs that are not images pass unchanged."""
    if x.dim() != 4:
        return x
    return random_flip(random_crop(x, padding, generator), generator)
