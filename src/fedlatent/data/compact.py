"""Images held compactly until the batch: uint8 storage (1 byte per pixel-channel, a quarter of
float32), standardised when a batch is taken, and channel statistics computed in chunks, never by
converting a whole set to floats."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

_CHUNK = 256  # images converted to floats at a time when computing statistics


class Images:
    """uint8 N×C×H×W images; ``images[idx]`` is the float32 batch ``(u8 / 255 − mean) / std`` (per
    channel) for any index a tensor accepts, so training, evaluation and diagnostics read it as
    they read a float tensor. With ``crop``, the stored images are larger than the model's input
    (a margin for a training augmentation's random crop): indexing yields their centre
    crop×crop, :meth:`full` the whole stored images."""

    dtype = torch.float32  # what indexing yields

    def __init__(self, data: Tensor, mean: Sequence[float] | np.ndarray, std: Sequence[float] | np.ndarray,
                 crop: int | None = None) -> None:
        if data.dtype != torch.uint8 or data.dim() != 4:
            raise ValueError(f"Images holds uint8 N×C×H×W data, got {data.dtype} of shape {tuple(data.shape)}")
        if crop is not None and not 0 < crop <= min(data.shape[2:]):
            raise ValueError(f"crop {crop} does not fit images of shape {tuple(data.shape)}")
        self.data = data
        self.mean = torch.as_tensor(np.asarray(mean, dtype=np.float32)).reshape(-1, 1, 1)
        self.std = torch.as_tensor(np.asarray(std, dtype=np.float32)).reshape(-1, 1, 1)
        self.crop = crop

    @property
    def shape(self) -> torch.Size:
        if self.crop is None:
            return self.data.shape
        return torch.Size((*self.data.shape[:2], self.crop, self.crop))

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def full(self, idx) -> Tensor:
        """The standardised float32 batch of the whole stored images at ``idx`` (no centre crop)."""
        return (self.data[idx].to(torch.float32) / 255.0 - self.mean) / self.std  # C×1×1 statistics broadcast

    def __getitem__(self, idx) -> Tensor:
        rest: tuple = ()
        if isinstance(idx, tuple):  # images first, then channels / pixels of the float result
            idx, rest = idx[0], idx[1:]
        data = self.data
        if self.crop is not None:
            h, w = data.shape[2:]
            top, left = (h - self.crop) // 2, (w - self.crop) // 2
            data = data[:, :, top:top + self.crop, left:left + self.crop]
        out = (data[idx].to(torch.float32) / 255.0 - self.mean) / self.std
        return out[(slice(None),) * (out.dim() - 3) + rest] if rest else out

    def to(self, device: torch.device | str) -> "Images":
        """The same images held on ``device``, still uint8 (a quarter of float32), with their
        statistics there too: indexing standardises on that device."""
        if self.data.device == torch.device(device):
            return self
        moved = Images(self.data.to(device), self.mean.flatten().numpy(), self.std.flatten().numpy(), self.crop)
        moved.mean, moved.std = self.mean.to(device), self.std.to(device)
        return moved

    def take(self, idx: Tensor | slice) -> "Images":
        """The images at ``idx``, still compact, where they are held (their statistics too)."""
        taken = Images(self.data[idx], self.mean.flatten().cpu().numpy(), self.std.flatten().cpu().numpy(), self.crop)
        taken.mean, taken.std = self.mean, self.std
        return taken

    @staticmethod
    def concat(parts: Sequence["Images"]) -> "Images":
        """Parts that share their statistics and crop, one after another (parts that do not are refused:
        one set of statistics would standardise some of them wrongly)."""
        first = parts[0]
        if any(p.crop != first.crop or not torch.equal(p.mean, first.mean) or not torch.equal(p.std, first.std)
               for p in parts[1:]):
            raise ValueError("Images.concat: the parts' standardisation statistics or crops differ")
        return Images(torch.cat([p.data for p in parts]), parts[0].mean.flatten(), parts[0].std.flatten(),
                      parts[0].crop)


def uint8_channel_stats(sets: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of uint8 N×C×H×W arrays in [0, 1] units, accumulated in float64
    chunk by chunk."""
    channels = sets[0].shape[1]
    total, squares, count = np.zeros(channels), np.zeros(channels), 0
    for x in sets:
        for start in range(0, len(x), _CHUNK):
            chunk = x[start:start + _CHUNK].astype(np.float64) / 255.0
            total += chunk.sum(axis=(0, 2, 3))
            squares += (chunk ** 2).sum(axis=(0, 2, 3))
        count += len(x) * x.shape[2] * x.shape[3]
    mean = total / max(count, 1)
    std = np.sqrt(np.maximum(squares / max(count, 1) - mean ** 2, 0.0))
    return mean.astype(np.float32), np.maximum(std, 1e-6).astype(np.float32)
