"""Tiny-ImageNet (200 classes, 64×64) from the official ``tiny-imagenet-200/`` folder.

``wnids.txt`` fixes the class order; training images are ``train/<wnid>/images/*.JPEG``; the
validation images are ``val/images/*.JPEG``, labelled by ``val/val_annotations.txt`` (tab-separated:
file name, wnid, bounding box). The official test split has no labels and is not read.

>>> train, val = read_tinyimagenet("~/data")  # ~/data/tiny-imagenet-200/ or the folder itself
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fedlatent.data.readers._common import dataset_folder, read_images
from fedlatent.data.types import ImageSet
from fedlatent.errors import DataError

_FOLDER = "tiny-imagenet-200"
_LAYOUT = "wnids.txt, train/<wnid>/images/*.JPEG, val/images/*.JPEG, val/val_annotations.txt"
_SIDE = 64


def read_tinyimagenet(root: Path | str) -> tuple[ImageSet, ImageSet]:
    """(train, val) of Tiny-ImageNet; class names are the wnids in ``wnids.txt`` order."""
    folder = dataset_folder(root, _FOLDER, "wnids.txt", "tinyimagenet", _LAYOUT)
    wnids = [w.strip() for w in (folder / "wnids.txt").read_text(encoding="utf-8").splitlines() if w.strip()]
    if not wnids:
        raise DataError(f"tinyimagenet: {folder / 'wnids.txt'} lists no classes")
    index = {w: i for i, w in enumerate(wnids)}
    train_paths, train_y = _train_files(folder, wnids)
    val_paths, val_y = _val_files(folder, index)
    train = ImageSet(read_images(train_paths, _SIDE, "tinyimagenet"), np.array(train_y, dtype=np.int64), wnids)
    val = ImageSet(read_images(val_paths, _SIDE, "tinyimagenet"), np.array(val_y, dtype=np.int64), list(wnids))
    return train, val


def _train_files(folder: Path, wnids: list[str]) -> tuple[list[Path], list[int]]:
    paths: list[Path] = []
    labels: list[int] = []
    for label, wnid in enumerate(wnids):
        images = folder / "train" / wnid / "images"
        if not images.is_dir():
            raise DataError(f"tinyimagenet: expected the folder {images} ({_LAYOUT}); see data.root")
        found = sorted(p for p in images.iterdir() if not p.name.startswith(".") and p.suffix.lower() in (".jpeg", ".jpg"))
        paths += found
        labels += [label] * len(found)
    return paths, labels


def _val_files(folder: Path, index: dict[str, int]) -> tuple[list[Path], list[int]]:
    annotations = folder / "val" / "val_annotations.txt"
    if not annotations.is_file():
        raise DataError(f"tinyimagenet: expected the file {annotations} ({_LAYOUT}); see data.root")
    paths: list[Path] = []
    labels: list[int] = []
    for number, line in enumerate(annotations.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2 or fields[1] not in index:
            raise DataError(f"tinyimagenet: {annotations} line {number}: expected "
                            f"'<file>\\t<wnid from wnids.txt>\\t…', got {line[:60]!r}")
        path = folder / "val" / "images" / fields[0]
        if not path.is_file():
            raise DataError(f"tinyimagenet: {annotations} lists {fields[0]} but {path} does not exist")
        paths.append(path)
        labels.append(index[fields[1]])
    return paths, labels
