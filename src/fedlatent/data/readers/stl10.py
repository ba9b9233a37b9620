"""STL-10 (the labelled train and test splits) from the official ``stl10_binary/`` folder.

``*_X.bin`` holds uint8 images of 3×96×96, each channel stored column-major; ``*_y.bin`` holds one
uint8 label per image, 1..10 (returned as 0..9). ``class_names.txt`` (one name a line) is optional.

>>> train, test = read_stl10("~/data")  # ~/data/stl10_binary/ or the folder itself
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fedlatent.data.readers._common import dataset_folder
from fedlatent.data.types import ImageSet
from fedlatent.errors import DataError

_FOLDER = "stl10_binary"
_LAYOUT = "train_X.bin, train_y.bin, test_X.bin, test_y.bin, optional class_names.txt"
_SIDE = 96
_NUM_CLASSES = 10


def read_stl10(root: Path | str) -> tuple[ImageSet, ImageSet]:
    """(train, test) of STL-10 from ``stl10_binary/`` under ``root`` (or ``root`` itself)."""
    folder = dataset_folder(root, _FOLDER, "train_X.bin", "stl10", _LAYOUT)
    names = _class_names(folder / "class_names.txt")
    return _split(folder, "train", names), _split(folder, "test", list(names))


def _split(folder: Path, split: str, names: list[str]) -> ImageSet:
    x = _raw(folder / f"{split}_X.bin")
    image_bytes = 3 * _SIDE * _SIDE
    if x.size % image_bytes:
        raise DataError(f"stl10: {folder / f'{split}_X.bin'} has {x.size} bytes, "
                        f"not a multiple of {image_bytes} (3×96×96 uint8 images); truncated?")
    # column-major per channel: after the reshape the last two axes are (column, row)
    images = np.ascontiguousarray(x.reshape(-1, 3, _SIDE, _SIDE).transpose(0, 1, 3, 2))
    y = _raw(folder / f"{split}_y.bin").astype(np.int64)
    if len(y) != len(images):
        raise DataError(f"stl10: {folder / f'{split}_y.bin'} has {len(y)} labels "
                        f"but {split}_X.bin has {len(images)} images")
    if y.size and (y.min() < 1 or y.max() > _NUM_CLASSES):
        raise DataError(f"stl10: {folder / f'{split}_y.bin'} has labels outside 1..{_NUM_CLASSES}")
    return ImageSet(images, y - 1, names)


def _raw(path: Path) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"stl10: expected the file '{path.name}' in {path.parent} ({_LAYOUT}); see data.root")
    return np.fromfile(path, dtype=np.uint8)


def _class_names(path: Path) -> list[str]:
    if not path.exists():
        return [str(i) for i in range(_NUM_CLASSES)]
    names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(names) != _NUM_CLASSES:
        raise DataError(f"stl10: {path} has {len(names)} names, expected {_NUM_CLASSES} (one a line)")
    return names
