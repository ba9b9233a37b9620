"""Image folders: the split layout ``root/{train,test}/<class>/<images>`` (image-folder CIFAR and
any labelled image tree) and the multi-domain layout ``root/<domain>/<class>/<images>`` (PACS,
Office-Home).

In the split layout the class order is either given (a data set's official class names, e.g.
CIFAR-10's, matched to the folder names) or the sorted folder names of ``train/``. A tree may hold
any number of images per class, and a data set's tree may hold a subset of its classes. Images are
converted to RGB; with a size they are resized (bilinear) to it, without one they must all share
one size.

>>> train, test = read_image_folder("~/data/cifar10-jpeg")  # train/<class>/*.jpg, test/<class>/*.jpg
>>> pacs = read_domains("~/data/PACS", image_size=224)
>>> pacs.domain_names  # ['art_painting', 'cartoon', 'photo', 'sketch']
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from fedlatent.data.readers._common import IMAGE_SUFFIXES, read_images
from fedlatent.data.types import ImageSet
from fedlatent.errors import DataError

_LAYOUT = "root/<domain>/<class>/<image files>, e.g. PACS or Office-Home"
_SPLIT_LAYOUT = "root/train/<class>/<image files> and optionally root/test/<class>/<image files>"


def is_image_folder(root: Path | str) -> bool:
    """Whether ``root`` holds the split layout (a ``train/`` folder)."""
    return (Path(root).expanduser() / "train").is_dir()


def read_image_folder(root: Path | str, image_size: int | None = None, *,
                      class_names: Sequence[str] | None = None,
                      what: str = "image_folder") -> tuple[ImageSet, ImageSet | None]:
    """(train, test) from ``root/train/<class>/`` and ``root/test/<class>/`` (test: None when absent).

    ``class_names`` fixes the label order (a folder name outside it is an error); without it the
    classes are the sorted folder names of ``train/``. ``image_size`` (None: as stored) resizes."""
    train, test, names = list_image_folder(root, class_names=class_names, what=what)
    train_set = ImageSet(read_images(train[0], image_size, what), train[1], names)
    if test is None:
        return train_set, None
    size = image_size if image_size is not None else int(train_set.x.shape[-1])
    return train_set, ImageSet(read_images(test[0], size, what, resize=image_size is not None), test[1], names)


Listing = tuple[list[Path], np.ndarray]  # image files and their labels


def list_image_folder(root: Path | str, *, class_names: Sequence[str] | None = None,
                      what: str = "image_folder") -> tuple[Listing, Listing | None, list[str]]:
    """The images :func:`read_image_folder` reads, listed and labelled but not decoded — train,
    test (None when absent) and the class names — with the same refusals of a malformed tree."""
    root = Path(root).expanduser()
    train_dir = root / "train"
    if not train_dir.is_dir():
        raise DataError(f"{what}: expected the folder {train_dir} ({_SPLIT_LAYOUT}); see data.root")
    train_classes = [p.name for p in _subfolders(train_dir)]
    if not train_classes:
        raise DataError(f"{what}: {train_dir} holds no class folders ({_SPLIT_LAYOUT})")
    names = list(class_names) if class_names is not None else train_classes
    index = {name: i for i, name in enumerate(names)}
    for name in train_classes:
        if name not in index:
            raise DataError(f"{what}: {train_dir / name}: '{name}' is not a class of {what} "
                            f"(its classes: {', '.join(names[:12])}{', …' if len(names) > 12 else ''})")
    train = _listing(train_dir, index, what)
    test_dir = root / "test"
    if not test_dir.is_dir():
        return train, None, names
    for folder in _subfolders(test_dir):
        if folder.name not in train_classes:
            raise DataError(f"{what}: {folder}: class '{folder.name}' has no folder in {train_dir}")
    return train, _listing(test_dir, index, what), names


def _listing(folder: Path, index: dict[str, int], what: str) -> Listing:
    """Every image of ``folder/<class>/``, labelled by ``index``."""
    paths: list[Path] = []
    labels: list[int] = []
    for class_folder in _subfolders(folder):
        found = _images(class_folder)
        paths += found
        labels += [index[class_folder.name]] * len(found)
    if not paths:
        raise DataError(f"{what}: {folder} holds no images in its class folders")
    return paths, np.array(labels, dtype=np.int64)


def read_domains(root: Path | str, image_size: int) -> ImageSet:
    """Every image under ``root/<domain>/<class>/``, with ``domain`` and ``domain_names`` filled."""
    root = Path(root).expanduser()
    domains = _subfolders(root) if root.is_dir() else []
    if not domains:
        raise DataError(f"domains: expected domain folders ({_LAYOUT}) under {root}; see data.root")
    classes = sorted({c.name for d in domains for c in _subfolders(d)})
    label = {name: i for i, name in enumerate(classes)}
    paths: list[Path] = []
    y: list[int] = []
    domain: list[int] = []
    for d, folder in enumerate(domains):
        start = len(paths)
        for class_folder in _subfolders(folder):
            found = _images(class_folder)
            paths += found
            y += [label[class_folder.name]] * len(found)
        if len(paths) == start:
            raise DataError(f"domains: the domain folder {folder} holds no images in class folders ({_LAYOUT})")
        domain += [d] * (len(paths) - start)
    x = read_images(paths, image_size, "domains")
    return ImageSet(x, np.array(y, dtype=np.int64), classes, np.array(domain, dtype=np.int64),
                    [d.name for d in domains])


def _images(folder: Path) -> list[Path]:
    """The visible image files of one class folder, sorted by name (hidden ones, e.g. macOS's
    ``._name.jpg``, are skipped, as the decoded-image cache's fingerprint skips them)."""
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES)


def _subfolders(folder: Path) -> list[Path]:
    """Visible subfolders, sorted by name."""
    return sorted((p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.name)
