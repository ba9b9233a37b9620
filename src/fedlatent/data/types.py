"""Plain containers for data: what readers return and what a federation is made of."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from fedlatent.data.augment import Augmentation
from fedlatent.data.compact import Images


@dataclass
class ImageSet:
    """Images as read from disk: ``x`` uint8 N×C×H×W, ``y`` int64 N, optional per-sample
    ``domain`` (int64 N, an index into ``domain_names``) for feature-shift datasets."""

    x: np.ndarray
    y: np.ndarray
    class_names: list[str] = field(default_factory=list)
    domain: np.ndarray | None = None
    domain_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"x has {len(self.x)} samples but y has {len(self.y)}")
        if self.domain is not None and len(self.domain) != len(self.y):
            raise ValueError(f"domain has {len(self.domain)} entries but y has {len(self.y)}")


@dataclass
class Split:
    """Tensors for one split: ``x`` float32 (N×…) or compact :class:`Images` (uint8, float32 per
    batch), ``y`` int64 (N)."""

    x: Tensor | Images
    y: Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, indices: np.ndarray | Tensor) -> "Split":
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.long)
        return Split(self.x.take(idx) if isinstance(self.x, Images) else self.x[idx], self.y[idx])

    def to(self, device: torch.device | str) -> "Split":
        """The split held on ``device`` (compact images stay compact)."""
        return Split(self.x.to(device), self.y.to(device))

    @staticmethod
    def concat(parts: list["Split"]) -> "Split":
        """The parts one after another (compact images stay compact)."""
        xs = [p.x for p in parts]
        x = Images.concat(xs) if isinstance(xs[0], Images) else torch.cat(xs)
        return Split(x, torch.cat([p.y for p in parts]))


@dataclass
class ClientData:
    """One client's splits; ``val`` and ``test`` are optional."""

    train: Split
    val: Split | None = None
    test: Split | None = None


@dataclass
class Federation:
    """Everything a run trains and evaluates on: the clients that train and, with
    ``data.holdout_clients``, the ``new_clients`` that never do (numbered after them), evaluated
    as clients the federation has not seen (:mod:`fedlatent.data.holdout`; set apart where the
    federation is built), and ``held_out``: where those sit in the partition (their partition ids,
    in order). ``clients`` is a sequence (a list, or :class:`fedlatent.data.clients.Clients`, which
    builds a client when it is read) and ``new_clients`` a mapping (a dict, or
    :class:`fedlatent.data.clients.Numbered`)."""

    clients: Sequence[ClientData]
    test: Split | None
    num_classes: int
    input_shape: tuple[int, ...]
    name: str = ""
    augment: Augmentation | bool = False   # truthy when training batches are augmented
    new_clients: Mapping[int, ClientData] = field(default_factory=dict)
    test_of_clients: bool = False  # the global test split is the clients' test splits together (in client order)
    held_out: tuple[int, ...] = ()  # the partition ids of new_clients, in their order

    @property
    def partition_size(self) -> int:
        """The clients of the partition: those that train and those held out."""
        return len(self.clients) + len(self.new_clients)

    @property
    def num_clients(self) -> int:
        return len(self.clients)


class GlobalData(Protocol):
    """What a server reads of the data, from a :class:`Federation` or a :class:`ServerView`: the
    global test split, the classes, the input shape, the data set's name and the augmentation (the
    model and the clients' training settings are built from them)."""

    test: Split | None
    num_classes: int
    input_shape: tuple[int, ...]
    name: str
    augment: Augmentation | bool


@dataclass
class ServerView:
    """The data as a Flower server sees it: a :class:`Federation` without its clients
    (:func:`fedlatent.data.federation.server_view`, read from the data set), or without its test
    split either (:func:`fedlatent.data.federation.declared_view`, the data unopened: ``num_classes``
    0 and ``input_shape`` () where the data set does not declare them, until the nodes' census
    tells them); the number of clients where it is known (None: the census tells it)."""

    test: Split | None
    num_classes: int
    input_shape: tuple[int, ...]
    name: str = ""
    augment: Augmentation | bool = False
    num_clients: int | None = None


@dataclass
class Outline:
    """What a federation will be, known without building it (:func:`fedlatent.data.federation.outline`):
    the classes, the input shape (None where only decoding the samples tells it) and the partition's
    clients, those held out (``data.holdout_clients``) included, with each client's (training, test)
    sample counts where the partition tells them (``()`` where not) and the partition ids of those
    held out."""

    num_classes: int
    input_shape: tuple[int, ...] | None
    num_clients: int
    client_sizes: tuple[tuple[int, int], ...] = ()
    held_out: tuple[int, ...] = ()
