"""A federation's clients built when they are asked for: a round touches only its cohort.

A federation of 100,000 clients trains 100 of them a round and evaluates a sample of 1,000
(``eval.clients``); building every client's splits up front held a copy of the whole data set in
per-client tensors. :class:`Clients` keeps what makes a client — the source's arrays once and each
client's sample indices (:mod:`fedlatent.data.federation`) — and builds a client's
:class:`~fedlatent.data.types.ClientData` when ``clients[cid]`` is read, the same tensors as an
eager build, bit for bit. Built clients are kept in a small cache shared by the federation's views
(least recently read first out, :data:`CACHE_BYTES` of samples), so that a round's training, its
evaluation and a small federation's every round read the same objects; whatever else is built is
let go once its reader is done. The clients' sample counts are known without building any of them.
"""
from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Callable

import numpy as np
import torch

from fedlatent.data.compact import Images
from fedlatent.data.types import ClientData, Split

CACHE_BYTES = 256 * 2 ** 20  # built clients' samples kept for their next reader (a federation that fits: all of it)


def nbytes(client: ClientData) -> int:
    """The bytes of a client's samples and labels (compact images at one byte a value)."""
    total = 0
    for split in (client.train, client.val, client.test):
        if split is not None:
            x = split.x.data if isinstance(split.x, Images) else split.x
            total += x.numel() * x.element_size() + split.y.numel() * split.y.element_size()
    return total


class _Cache:
    """Built clients by partition id, least recently read first out beyond ``budget`` bytes. Each
    build raises the audit event ``fedlatent.client_built`` with the partition id (``sys.audit``:
    what a deployment's test hooks to see that a node's process builds its own clients alone)."""

    def __init__(self, make: Callable[[int], ClientData], budget: int = CACHE_BYTES) -> None:
        self.make, self.budget, self.held = make, budget, 0
        self.kept: OrderedDict[int, tuple[ClientData, int]] = OrderedDict()
        self.lock = threading.Lock()  # a Flower simulation's nodes may share a process's threads

    def get(self, pid: int) -> ClientData:
        with self.lock:
            if pid in self.kept:
                self.kept.move_to_end(pid)
                return self.kept[pid][0]
        sys.audit("fedlatent.client_built", pid)
        client = self.make(pid)
        size = nbytes(client)
        with self.lock:
            if pid not in self.kept and size <= self.budget:
                self.kept[pid] = (client, size)
                self.held += size
                while self.held > self.budget:
                    _, (_, dropped) = self.kept.popitem(last=False)
                    self.held -= dropped
        return client


class Clients(Sequence[ClientData]):
    """The clients ``ids`` (partition ids, in that order; all of them by default) of a partition
    whose client ``pid`` ``make(pid)`` builds; ``sizes``: every partition client's (train, val,
    test) sample counts, −1 for a split it does not have; ``labels(pid)``: its training labels
    without building its samples (else read from the built client). ``len`` and indexing work as on
    a list; iterating builds one client at a time."""

    def __init__(self, make: Callable[[int], ClientData], sizes: np.ndarray, *,
                 labels: Callable[[int], np.ndarray] | None = None, ids: np.ndarray | None = None,
                 cache: _Cache | None = None) -> None:
        self.partition_sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 3)
        self.ids = np.arange(len(self.partition_sizes)) if ids is None else np.asarray(ids, dtype=np.int64)
        self.cache = cache if cache is not None else _Cache(make)
        self._labels = labels

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.subset(np.arange(len(self))[index])
        i = int(index)
        if not -len(self) <= i < len(self):
            raise IndexError(f"client {index} of {len(self)}")
        return self.cache.get(int(self.ids[i]))

    def __iter__(self) -> Iterator[ClientData]:
        return (self.cache.get(int(pid)) for pid in self.ids)

    def subset(self, positions: Sequence[int] | np.ndarray) -> "Clients":
        """The clients at ``positions`` of this sequence, sharing its cache (nothing built)."""
        return Clients(self.cache.make, self.partition_sizes, labels=self._labels,
                       ids=self.ids[np.asarray(positions, dtype=np.int64)], cache=self.cache)

    def sizes(self) -> np.ndarray:
        """These clients' (train, val, test) sample counts (0 for a split they do not have)."""
        return np.maximum(self.partition_sizes[self.ids], 0)

    def train_labels(self, i: int) -> np.ndarray:
        """The training labels of the client at position ``i``."""
        pid = int(self.ids[i])
        return self._labels(pid) if self._labels is not None else self.cache.get(pid).train.y.numpy()


class Numbered(Mapping[int, ClientData]):
    """``clients`` under the ids ``first``, ``first + 1``, … (the held-out clients, numbered after
    those that train: :attr:`~fedlatent.data.types.Federation.new_clients`), built when read."""

    def __init__(self, clients: Clients, first: int) -> None:
        self.clients, self.first = clients, first

    def __getitem__(self, cid: int) -> ClientData:
        if not self.first <= cid < self.first + len(self.clients):
            raise KeyError(cid)
        return self.clients[cid - self.first]

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.first, self.first + len(self.clients)))

    def __len__(self) -> int:
        return len(self.clients)


class JoinedTests(Split):
    """The test splits of ``clients`` one after another (the global test split of a federation
    whose clients' tests are it, ``Federation.test_of_clients``): its length known at once, its
    samples joined when first read (every client built, one at a time) and kept."""

    def __init__(self, clients: Clients) -> None:  # a Split whose x and y are read when asked for
        self._clients = clients
        self._joined: Split | None = None

    def __len__(self) -> int:
        return int(self._clients.sizes()[:, 2].sum())

    def _join(self) -> Split:
        if self._joined is None:
            tests = [c.test for c in self._clients if c.test is not None]
            self._joined = Split.concat(tests)
        return self._joined

    @property
    def x(self) -> torch.Tensor | Images:  # type: ignore[override]
        return self._join().x

    @property
    def y(self) -> torch.Tensor:  # type: ignore[override]
        return self._join().y


def sizes_of(clients: Sequence[ClientData] | Mapping[int, ClientData]) -> np.ndarray:
    """(train, val, test) sample counts of ``clients`` (a mapping's: in its order), read from
    :class:`Clients` and :class:`Numbered` without building them, else from each client."""
    if isinstance(clients, Numbered):
        clients = clients.clients
    if isinstance(clients, Clients):
        return clients.sizes()
    if isinstance(clients, Mapping):
        clients = list(clients.values())
    return np.array([[len(s) if s is not None else 0 for s in (c.train, c.val, c.test)] for c in clients],
                    dtype=np.int64).reshape(-1, 3)


def train_labels(clients: Sequence[ClientData], i: int) -> np.ndarray:
    """Client ``i``'s training labels, without building its samples where :class:`Clients` can."""
    return clients.train_labels(i) if isinstance(clients, Clients) else clients[i].train.y.numpy()
