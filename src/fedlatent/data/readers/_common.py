"""What the readers share: finding a dataset's folder, and decoding image files into arrays."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from fedlatent.errors import DataError

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp"})


def dataset_folder(root: Path | str, name: str, marker: str, what: str, layout: str) -> Path:
    """``root/name``, or ``root`` itself, whichever holds ``marker``.

    Users point ``data.root`` at either a dataset's folder or the folder that contains it.
    """
    root = Path(root).expanduser()
    for folder in (root / name, root):
        if (folder / marker).exists():
            return folder
    raise DataError(f"{what}: expected the folder '{name}' ({layout}) under {root}; see data.root")


def read_image(path: Path, size: int | None, what: str, *, resize: bool = True) -> np.ndarray:
    """Decode ``path`` as RGB, uint8 3×H×W. With ``resize`` it is resized to size×size (bilinear)
    when it is not that size; without, it must be size×size already (None: any size)."""
    try:
        with Image.open(path) as img:
            rgb = img.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        detail = type(exc).__name__ if str(path) in str(exc) else f"{type(exc).__name__}: {exc}"
        raise DataError(f"{what}: cannot read the image {path} ({detail})") from exc
    if size is not None and rgb.size != (size, size):
        if not resize:
            raise DataError(f"{what}: {path} is {rgb.size[0]}×{rgb.size[1]} but the images before it are "
                            f"{size}×{size}; set data.image_size to resize them all to one size")
        rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)


def read_images(paths: Sequence[Path], size: int | None, what: str, *, resize: bool = True) -> np.ndarray:
    """Decode many images into one preallocated uint8 N×3×size×size array (half the peak memory
    of stacking a list). ``size`` None: the first image's size, which every other must share."""
    if size is None:
        first = read_image(paths[0], None, what)
        if first.shape[1] != first.shape[2]:
            raise DataError(f"{what}: {paths[0]} is {first.shape[2]}×{first.shape[1]}, not square; "
                            f"set data.image_size to resize the images to a square")
        size, resize = first.shape[1], False
    out = np.empty((len(paths), 3, size, size), dtype=np.uint8)
    for i, path in enumerate(paths):
        out[i] = read_image(path, size, what, resize=resize)
    return out
