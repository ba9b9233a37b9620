"""Image data sets in their published on-disk formats under ``data.root``: labelled pools with an
official test split (CIFAR-10/100, STL-10, Tiny-ImageNet) or with natural domains (image folders
per domain, HAM10000), the latter resized to ``data.image_size``."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fedlatent.config import DataConfig
from fedlatent.data.registry import register_dataset
from fedlatent.data.sources import Pool, check_root
from fedlatent.data.types import ImageSet


def _readers():  # image readers are imported only when an image data set is loaded
    from fedlatent.data import readers
    return readers


def _root(cfg: DataConfig) -> Path:
    """``data.root``, once it is known to be a readable folder (one line otherwise)."""
    root = Path(cfg.root).expanduser()
    check_root(root)
    return root


def _classes(images: ImageSet) -> int:
    return max(len(images.class_names), int(images.y.max()) + 1)


def _with_test(train: ImageSet, test: ImageSet | None) -> Pool:
    """The images stay uint8: the federation converts them to floats per batch."""
    return Pool(train.x, train.y.astype(np.int64), None if test is None else test.x,
                None if test is None else test.y.astype(np.int64), num_classes=_classes(train))


def _grouped(images: ImageSet) -> Pool:
    return Pool(images.x, images.y.astype(np.int64), None, None,
                num_classes=_classes(images), groups=images.domain, group_names=list(images.domain_names))


@register_dataset("cifar10", reads=("root",))
def _cifar10(cfg: DataConfig, seed: int) -> Pool:
    """CIFAR-10 python pickles (root/cifar-10-batches-py/)."""
    return _with_test(*_readers().read_cifar10(_root(cfg)))


@register_dataset("cifar100", reads=("root",))
def _cifar100(cfg: DataConfig, seed: int) -> Pool:
    """CIFAR-100 python pickles (root/cifar-100-python/)."""
    return _with_test(*_readers().read_cifar100(_root(cfg)))


@register_dataset("stl10", reads=("root",))
def _stl10(cfg: DataConfig, seed: int) -> Pool:
    """STL-10 binaries (root/stl10_binary/)."""
    return _with_test(*_readers().read_stl10(_root(cfg)))


@register_dataset("tinyimagenet", reads=("root",))
def _tinyimagenet(cfg: DataConfig, seed: int) -> Pool:
    """Tiny-ImageNet folders (root/tiny-imagenet-200/, val_annotations.txt as the test split)."""
    return _with_test(*_readers().read_tinyimagenet(_root(cfg)))


@register_dataset("domains", reads=("root", "image_size", "test_fraction"), groups=True)
def _domains(cfg: DataConfig, seed: int) -> Pool:
    """Image folders root/<domain>/<class>/ (PACS, Office-Home layout), one domain per group."""
    return _grouped(_readers().read_domains(_root(cfg), cfg.image_size))


@register_dataset("ham10000", reads=("root", "image_size", "test_fraction"), groups=True)
def _ham10000(cfg: DataConfig, seed: int) -> Pool:
    """HAM10000 (metadata CSV + images); the domain is the 'dataset' column."""
    return _grouped(_readers().read_ham10000(_root(cfg), cfg.image_size))
