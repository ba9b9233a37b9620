"""What the clinical data sets (Fed-ISIC2019, RxRx1) share: reading their CSV files with a named
error for each missing piece, and per-client splits converted to float in chunks."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from fedlatent.errors import DataError

_CHUNK = 256  # images converted to float32 at a time (bounds the conversion's temporary memory)


def read_rows(path: Path, needed: tuple[str, ...], what: str, layout: str) -> list[dict[str, str]]:
    """The rows of CSV ``path`` restricted to the ``needed`` columns (stripped strings)."""
    if not path.is_file():
        raise DataError(f"{what}: expected the file {path} ({layout}); see data.root")
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        missing = [c for c in needed if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(f"{what}: {path} lacks the column(s) {', '.join(missing)}")
        rows = [{k: (row[k] or "").strip() for k in needed} for row in reader]
    if not rows:
        raise DataError(f"{what}: {path} lists no images")
    return rows


def channel_stats(sets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std over uint8 N×C×H×W image arrays in [0, 1] units, accumulated in
    float64 over chunks (never a whole set as floats)."""
    total = np.zeros(sets[0].shape[1])
    squares = np.zeros(sets[0].shape[1])
    for x in sets:
        for start in range(0, len(x), _CHUNK):
            chunk = x[start:start + _CHUNK].astype(np.float64) / 255.0
            total += chunk.sum(axis=(0, 2, 3))
            squares += (chunk ** 2).sum(axis=(0, 2, 3))
    count = sum(len(x) for x in sets) * sets[0].shape[2] * sets[0].shape[3]
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean ** 2, 0.0))
    return mean.astype(np.float32), np.maximum(std, 1e-6).astype(np.float32)


def to_float(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """uint8 images → float32 ``(x / 255 - mean) / std`` per channel, converted chunk by chunk."""
    out = np.empty(x.shape, dtype=np.float32)
    m, s = mean.reshape(1, -1, 1, 1), std.reshape(1, -1, 1, 1)
    for start in range(0, len(x), _CHUNK):
        out[start:start + _CHUNK] = (x[start:start + _CHUNK].astype(np.float32) / 255.0 - m) / s
    return out
