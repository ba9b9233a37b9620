"""Image data sets in their published on-disk formats under ``data.root``: labelled pools with an
official test split (CIFAR-10/100 as python files or image-folder trees, any image-folder tree,
STL-10, Tiny-ImageNet) or with natural domains (image folders per domain, HAM10000), the latter
resized to ``data.image_size``. Every reader's result goes through the decoded-image cache
(:mod:`fedlatent.data.cache`): a tree is decoded once, later runs memory-map the arrays."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from fedlatent.config import DataConfig
from fedlatent.data.cache import decoded as cached
from fedlatent.data.registry import register_dataset
from fedlatent.data.sources import Labels, Pool, check_root
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


def _listed(cfg: DataConfig, folder: Path, names: Sequence[str] | None, what: str) -> Labels:
    """An image-folder tree's labels from its listing, no image decoded but the first where
    ``data.image_size`` is unset (its size is the samples' shape)."""
    r = _readers()
    train, test, classes = r.list_image_folder(folder, class_names=names, what=what)
    side = cfg.image_size or int(r.read_images(train[0][:1], None, what).shape[-1])
    return Labels(train[1], None if test is None else test[1], max(len(classes), int(train[1].max()) + 1),
                  input_shape=(3, side, side))


def _grouped(images: ImageSet) -> Pool:
    return Pool(images.x, images.y.astype(np.int64), None, None,
                num_classes=_classes(images), groups=images.domain, group_names=list(images.domain_names))


def _cifar(cfg: DataConfig, what: str) -> Pool:
    """CIFAR-10/100 from whichever layout ``data.root`` holds, said in one line."""
    r = _readers()
    kind, folder = r.cifar_source(_root(cfg), what)
    if kind == "pickles":
        read = r.read_cifar10 if what == "cifar10" else r.read_cifar100
        return _with_test(*cached(what, "the official python files in", folder, {}, lambda: read(folder)))
    names = r.CIFAR10_CLASSES if what == "cifar10" else r.CIFAR100_CLASSES
    size = cfg.image_size or None
    return _with_test(*cached(what, "the image-folder tree", folder, {"image_size": size, "layout": "tree"},
                              lambda: r.read_image_folder(folder, size, class_names=names, what=what)))


def _cifar_labels(cfg: DataConfig, what: str) -> Labels | Pool:
    """CIFAR's labels: a tree's listing; the python files hold labels and images in one pickle per
    batch, so they are read whole (from the decoded-image cache when it holds them)."""
    r = _readers()
    kind, folder = r.cifar_source(_root(cfg), what)
    if kind == "pickles":
        return _cifar(cfg, what)
    return _listed(cfg, folder, r.CIFAR10_CLASSES if what == "cifar10" else r.CIFAR100_CLASSES, what)


@register_dataset("cifar10", reads=("root", "image_size"), shape=lambda cfg: ((3, cfg.side(), cfg.side()), 10),
                  labels=lambda cfg: _cifar_labels(cfg, "cifar10"))
def _cifar10(cfg: DataConfig, seed: int) -> Pool:
    """CIFAR-10: the python pickles (root/cifar-10-batches-py/) or an image-folder tree (root/train/<class>/)."""
    return _cifar(cfg, "cifar10")


@register_dataset("cifar100", reads=("root", "image_size"), shape=lambda cfg: ((3, cfg.side(), cfg.side()), 100),
                  labels=lambda cfg: _cifar_labels(cfg, "cifar100"))
def _cifar100(cfg: DataConfig, seed: int) -> Pool:
    """CIFAR-100: the python pickles (root/cifar-100-python/) or an image-folder tree (root/train/<class>/)."""
    return _cifar(cfg, "cifar100")


@register_dataset("image_folder", reads=("root", "image_size", "test_fraction"),
                  labels=lambda cfg: _listed(cfg, _root(cfg), None, "image_folder"))
def _image_folder(cfg: DataConfig, seed: int) -> Pool:
    """Any image-folder tree root/train/<class>/ (+ root/test/<class>/; without it a held-out
    test_fraction); classes = the sorted folder names of train/."""
    root, size = _root(cfg), cfg.image_size or None
    return _with_test(*cached("image_folder", "the image-folder tree", root, {"image_size": size},
                              lambda: _readers().read_image_folder(root, size)))


@register_dataset("stl10", reads=("root",), shape=lambda cfg: ((3, 96, 96), 10))
def _stl10(cfg: DataConfig, seed: int) -> Pool:
    """STL-10 binaries (root/stl10_binary/)."""
    root = _root(cfg)
    return _with_test(*cached("stl10", "the binaries under", root, {}, lambda: _readers().read_stl10(root)))


@register_dataset("tinyimagenet", reads=("root",), shape=lambda cfg: ((3, 64, 64), 200))
def _tinyimagenet(cfg: DataConfig, seed: int) -> Pool:
    """Tiny-ImageNet folders (root/tiny-imagenet-200/, val_annotations.txt as the test split)."""
    root = _root(cfg)
    return _with_test(*cached("tinyimagenet", "the folders under", root, {},
                              lambda: _readers().read_tinyimagenet(root)))


@register_dataset("domains", reads=("root", "image_size", "test_fraction"), groups=True)
def _domains(cfg: DataConfig, seed: int) -> Pool:
    """Image folders root/<domain>/<class>/ (PACS, Office-Home layout), one domain per group."""
    root, size = _root(cfg), cfg.side()
    return _grouped(cached("domains", "the domain folders in", root, {"image_size": size},
                           lambda: _readers().read_domains(root, size)))


@register_dataset("ham10000", reads=("root", "image_size", "test_fraction"), groups=True)
def _ham10000(cfg: DataConfig, seed: int) -> Pool:
    """HAM10000 (metadata CSV + images); the domain is the 'dataset' column."""
    root, size = _root(cfg), cfg.side()
    return _grouped(cached("ham10000", "the metadata and images in", root, {"image_size": size},
                           lambda: _readers().read_ham10000(root, size)))
