"""What a data set's loader returns: a labelled pool to partition, or a federation that comes with
its clients (and the reader of per-client .npz arrays).

Loaders (registered in :mod:`fedlatent.data.datasets`) return numpy arrays;
:mod:`fedlatent.data.federation` turns them into tensors, partitions and splits. Nothing here
trains or knows about clients' models.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import os

import numpy as np

from fedlatent.errors import DataError


@dataclass
class Pool:
    """Labelled samples to partition, an optional official test split and optional groups
    (natural domains) per sample."""

    x: np.ndarray
    y: np.ndarray
    test_x: np.ndarray | None
    test_y: np.ndarray | None
    num_classes: int
    groups: np.ndarray | None = None
    group_names: list[str] = field(default_factory=list)

    def labels(self) -> Labels:
        """The pool without its samples (no copy)."""
        return Labels(self.y, self.test_y, self.num_classes, self.groups, tuple(self.x.shape[1:]))


@dataclass
class Labels:
    """A pool's labels without its samples: what a data set's ``labels`` trait declares cheaply (an
    image tree's listing rather than its decoded images) so that ``fedlatent check`` makes the
    partition a run would make. ``input_shape``: None where the samples' shape is not known
    without decoding them."""

    y: np.ndarray
    test_y: np.ndarray | None
    num_classes: int
    groups: np.ndarray | None = None
    input_shape: tuple[int, ...] | None = None


@dataclass
class GivenClients:
    """A federation that already has its clients: per client (train, val, test) arrays;
    val/test entries may be None. uint8 image arrays stay compact until the batch, standardised
    with ``stats`` = per-channel (mean, std) in [0, 1] units (None: kept in [0, 1]). With
    ``train_crop``, training images are stored larger (a margin for a training augmentation's
    random crop) and read as their centre train_crop × train_crop unless augmented. ``clients`` may
    be :class:`Generated` (each client made when read), with ``sizes`` (per client its (train, val,
    test) counts, −1 for a split it lacks) and ``input_shape`` saying what it holds without making
    any; else they are read from the arrays."""

    clients: Sequence[dict[str, tuple[np.ndarray, np.ndarray] | None]]
    num_classes: int
    stats: tuple[np.ndarray, np.ndarray] | None = None
    train_crop: int | None = None
    sizes: np.ndarray | None = None
    input_shape: tuple[int, ...] | None = None

    def split_sizes(self) -> np.ndarray:
        """Per client its (train, val, test) sample counts, −1 for a split it does not have."""
        if self.sizes is not None:
            return self.sizes
        return np.array([[-1 if c[s] is None else len(c[s][1]) for s in ("train", "val", "test")] for c in self.clients],
                        dtype=np.int64).reshape(-1, 3)

    def sample_shape(self) -> tuple[int, ...]:
        """One sample's shape as stored (a training crop's margin included)."""
        return self.input_shape if self.input_shape is not None else tuple(self.clients[0]["train"][0].shape[1:])


Client = dict[str, tuple[np.ndarray, np.ndarray] | None]


class Generated(Sequence[Client]):
    """``count`` clients of a data set that generates them (Synthetic), client ``i`` made by
    ``make(i)`` when it is read: nothing is held for a client no round reads."""

    def __init__(self, count: int, make: Callable[[int], Client]) -> None:
        self.count, self.make = count, make

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self.make(j) for j in range(self.count)[i]]
        if not -self.count <= i < self.count:
            raise IndexError(f"client {i} of {self.count}")
        return self.make(i % self.count)


def read_client_arrays(path: str | Path) -> GivenClients:
    """Per-client arrays from an .npz: keys ``client{i}_{train,val,test}_{x,y}`` (val/test optional).

    Keys not starting with ``client`` (e.g. the shared file's ``meta_alpha``) are metadata and
    ignored; a ``client...`` key outside that layout is an error."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"data.path = '{path}': is a folder; expected an .npz file of per-client arrays")
    if not path.is_file():
        raise DataError(f"data.path = '{path}': file not found (expected an .npz with keys "
                        f"client{{i}}_train_x, client{{i}}_train_y, ...)")
    try:
        archive = np.load(path, allow_pickle=False)
        arrays = {k: archive[k] for k in archive.files}
    except (OSError, ValueError) as err:
        raise DataError(f"data.path = '{path}': not a readable .npz archive ({err})") from None
    count = 0
    while f"client{count}_train_x" in arrays or f"client{count}_train_y" in arrays:
        count += 1
    if count == 0:
        raise DataError(f"{path}: no key client0_train_x; expected keys client{{i}}_{{train,val,test}}_{{x,y}}")
    known = {f"client{i}_{s}_{v}" for i in range(count) for s in ("train", "val", "test") for v in "xy"}
    stray = sorted(k for k in set(arrays) - known if k.startswith("client"))  # other keys: metadata
    if stray:
        raise DataError(f"{path}: unexpected key {stray[0]} (clients must be numbered 0..n-1 with keys "
                        f"client{{i}}_{{train,val,test}}_{{x,y}})")
    clients = []
    for i in range(count):
        client: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}
        for split in ("train", "val", "test"):
            kx, ky = f"client{i}_{split}_x", f"client{i}_{split}_y"
            if kx not in arrays and ky not in arrays and split != "train":
                client[split] = None
                continue
            for key in (kx, ky):
                if key not in arrays:
                    raise DataError(f"{path}: missing key {key}")
            x, y = arrays[kx], arrays[ky]
            if len(x) != len(y):
                raise DataError(f"{path}: {kx} has {len(x)} rows but {ky} has {len(y)}")
            if not np.issubdtype(y.dtype, np.integer):
                raise DataError(f"{path}: {ky} must hold integer class labels, found {y.dtype}")
            if len(y) and y.min() < 0:
                raise DataError(f"{path}: {ky} holds negative labels")
            if y.ndim != 1:
                raise DataError(f"{path}: {ky} must be one label per row, found shape {y.shape}")
            if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
                raise DataError(f"{path}: {kx} must be numeric, found {x.dtype}")
            if x.ndim < 2:
                raise DataError(f"{path}: {kx} must hold one feature row per sample (2-D or more), "
                                f"found shape {x.shape}")
            if not np.isfinite(x).all():
                raise DataError(f"{path}: {kx} holds non-finite values (NaN or infinity)")
            if split == "train" and not len(y):
                raise DataError(f"{path}: {kx} is empty; every client needs training samples")
            if x.shape[1:] != arrays["client0_train_x"].shape[1:]:
                raise DataError(f"{path}: {kx} has rows of shape {x.shape[1:]}, but client0_train_x "
                                f"has {arrays['client0_train_x'].shape[1:]}")
            client[split] = (x.astype(np.float32), y.astype(np.int64))
        clients.append(client)
    labels = [c[s][1] for c in clients for s in ("train", "val", "test") if c[s] is not None]
    num_classes = int(max(int(l.max()) for l in labels if len(l))) + 1
    total = sum(len(l) for l in labels)
    if num_classes > total:  # labels are class indices 0..C-1, not arbitrary codes
        raise DataError(f"{path}: the largest label is {num_classes - 1}, but there are only {total} "
                        f"samples; labels must be class indices 0..C-1")
    return GivenClients(clients, num_classes=num_classes)


def check_root(root: Path) -> None:
    """``data.root`` must be a folder this user can list and read."""
    if not root.exists():
        raise DataError(f"data.root = '{root}': folder not found")
    if not root.is_dir():
        raise DataError(f"data.root = '{root}': is a file, not a folder")
    if not os.access(root, os.R_OK | os.X_OK):
        raise DataError(f"data.root = '{root}': not readable (permission denied)")
