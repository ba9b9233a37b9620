"""CIFAR-10 and CIFAR-100 from the official python-pickle folders.

Each batch is a pickled dict with ``b"data"`` (N×3072 uint8: the red, green and blue 32×32 planes,
each row-major) and the labels under ``b"labels"`` (CIFAR-10) or ``b"fine_labels"`` (CIFAR-100).

The official format is pickle, which can run code on load: the batches are read by an
unpickler that builds only plain containers and numpy arrays and refuses every other class.

>>> train, test = read_cifar10("~/data")  # ~/data/cifar-10-batches-py/ or the folder itself

The same data sets may come as an image-folder tree (``train/<class>/``, ``test/<class>/``, e.g. a
JPEG copy of CIFAR-10): :func:`cifar_source` tells which layout ``data.root`` holds, and the tree's
folder names are matched to :data:`CIFAR10_CLASSES` / :data:`CIFAR100_CLASSES` (the official label
order, which is alphabetical for both).
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedlatent.data.readers._common import dataset_folder
from fedlatent.data.types import ImageSet
from fedlatent.errors import DataError


CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR100_CLASSES = tuple("""
apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can
castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin
elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster
man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck
pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk
skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger
tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm""".split())


@dataclass(frozen=True)
class _Layout:
    what: str
    folder: str
    train: tuple[str, ...]
    test: str
    meta: str
    label_key: bytes
    names_key: bytes
    num_classes: int
    description: str


_CIFAR10 = _Layout("cifar10", "cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)),
                   "test_batch", "batches.meta", b"labels", b"label_names", 10,
                   "the official python pickles data_batch_1..5, test_batch, batches.meta")
_CIFAR100 = _Layout("cifar100", "cifar-100-python", ("train",), "test", "meta",
                    b"fine_labels", b"fine_label_names", 100, "the official python pickles train, test, meta")


def cifar_source(root: Path | str, what: str) -> tuple[str, Path]:
    """Which layout ``root`` holds for ``what`` (cifar10 | cifar100): ``("pickles", folder)`` for the
    official python files (under ``root`` or in it), ``("tree", root)`` for an image-folder tree."""
    layout = _CIFAR10 if what == "cifar10" else _CIFAR100
    root = Path(root).expanduser()
    for folder in (root / layout.folder, root):
        if (folder / layout.train[0]).exists():
            return "pickles", folder
    if (root / "train").is_dir():
        return "tree", root
    raise DataError(f"{what}: expected the official python files ({layout.folder}/ with {layout.description}) "
                    f"or an image-folder tree (train/<class>/, test/<class>/) under {root}; see data.root")


def read_cifar10(root: Path | str) -> tuple[ImageSet, ImageSet]:
    """(train, test) of CIFAR-10 from ``cifar-10-batches-py/`` under ``root`` (or ``root`` itself)."""
    return _read(root, _CIFAR10)


def read_cifar100(root: Path | str) -> tuple[ImageSet, ImageSet]:
    """(train, test) of CIFAR-100 (the 100 fine labels) from ``cifar-100-python/`` under ``root``
    (or ``root`` itself)."""
    return _read(root, _CIFAR100)


def _read(root: Path | str, layout: _Layout) -> tuple[ImageSet, ImageSet]:
    folder = dataset_folder(root, layout.folder, layout.train[0], layout.what, layout.description)
    names = _class_names(folder / layout.meta, layout)
    parts = [_batch(folder / name, layout) for name in layout.train]
    train = ImageSet(np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts]), names)
    test = ImageSet(*_batch(folder / layout.test, layout), list(names))
    return train, test


class _ArraysOnly(pickle.Unpickler):
    """Unpickles dicts, lists, strings, bytes, numbers and numpy arrays, nothing else."""

    ALLOWED = frozenset({(f"numpy.{core}.multiarray", n) for core in ("core", "_core")
                         for n in ("_reconstruct", "scalar")}
                        | {(f"numpy.{core}.numeric", "_frombuffer") for core in ("core", "_core")}
                        | {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")})  # bytes in protocol 2

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} (only numpy arrays are allowed)")
        return super().find_class(module, name)


def _unpickle(path: Path, layout: _Layout) -> Any:
    if not path.is_file():
        raise DataError(f"{layout.what}: expected the file '{path.name}' in {path.parent} "
                        f"({layout.description}); see data.root")
    try:
        with path.open("rb") as f:
            return _ArraysOnly(f, encoding="bytes").load()
    except Exception as exc:  # a damaged pickle can fail in almost any way
        raise DataError(f"{layout.what}: {path} is not a readable pickle ({type(exc).__name__}: {exc}); "
                        f"expected {layout.description}") from exc


def _batch(path: Path, layout: _Layout) -> tuple[np.ndarray, np.ndarray]:
    """Images N×3×32×32 uint8 and labels int64 of one batch file."""
    batch = _unpickle(path, layout)
    key = layout.label_key.decode()
    if not isinstance(batch, dict) or b"data" not in batch or layout.label_key not in batch:
        raise DataError(f"{layout.what}: {path} is not a CIFAR batch (a pickled dict with b'data' "
                        f"and b'{key}' expected)")
    x, y = np.asarray(batch[b"data"]), np.asarray(batch[layout.label_key])
    if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3 * 32 * 32:
        raise DataError(f"{layout.what}: {path}: b'data' is {x.dtype} {x.shape}, expected uint8 N×3072")
    if y.shape != (len(x),) or (y.size and not np.issubdtype(y.dtype, np.integer)):
        raise DataError(f"{layout.what}: {path}: b'{key}' has shape {y.shape}, expected {len(x)} integers")
    if y.size and (y.min() < 0 or y.max() >= layout.num_classes):
        raise DataError(f"{layout.what}: {path}: labels outside 0..{layout.num_classes - 1}")
    return x.reshape(-1, 3, 32, 32), y.astype(np.int64)


def _class_names(path: Path, layout: _Layout) -> list[str]:
    """Names from the meta file; its absence is tolerated (names become "0", "1", …)."""
    if not path.exists():
        return [str(i) for i in range(layout.num_classes)]
    meta = _unpickle(path, layout)
    names = meta.get(layout.names_key) if isinstance(meta, dict) else None
    if not isinstance(names, list) or len(names) != layout.num_classes:
        raise DataError(f"{layout.what}: {path} has no list of {layout.num_classes} "
                        f"b'{layout.names_key.decode()}'")
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]
