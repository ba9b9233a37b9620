"""The clients' states within a memory budget (``train.client_state_memory``): the most recently used
held in memory, the others in files under the run folder.

Every client's state (SCAFFOLD's c_i, Ditto's personal model, FedALA's weights, a codec's residual, a
kept optimiser state) is a flat dict of tensors, and a run of N clients holds N of them: 100,000
clients with SCAFFOLD's c_i of a 100k-parameter model are 40 GB. :class:`ClientStates` is the
list of them the backends index (``states[cid]``, ``states[cid] = new``, ``len``, iteration), which
keeps at most ``budget`` bytes of states in memory — the least recently used spilled first — and the
rest on disk.

On disk, one file per *column* — a key with its dtype and shape, ``scaffold.ci.fc.weight`` float32
(64, 784) — holding a fixed row per client at ``cid · row bytes``: a state is written in place, with
one ``pwrite`` a key, and read back with one ``pread`` a key, whichever clients a round samples; the
files are sparse (a client never spilled takes no block). Shard files of many clients (safetensors)
would make a state's write a rewrite of its shard, and a cohort's read a parse of one file header per
client; a memory-mapped file would count every row touched in the process's resident memory — the
budget that this store keeps. Which columns a client holds, in its dict's order, is its *layout*
(kept in memory: a tuple per client, shared between clients of one layout).

The files are scratch: the checkpoints hold the states (``federated.state``: every folder the full
set, checksummed), a resume refills the store from them, and the run removes the folder when it ends.
The values read back are the bytes written, so a run with a budget gives the numbers of the same run
without one, bit for bit.
"""
from __future__ import annotations

import os
import shutil
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import torch

from fedlatent.methods.parts import Tensors

FOLDER = "client_states"  # the store's folder in the run folder (removed when the run ends)


def state_bytes(state: Tensors) -> int:
    return sum(t.nbytes for t in state.values())


class _Column:
    """One key of one dtype and shape: a file of a fixed row per client."""

    def __init__(self, path: Path, key: str, like: torch.Tensor) -> None:
        self.key, self.dtype, self.shape, self.device = key, like.dtype, tuple(like.shape), like.device
        self.row = like.nbytes
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, cid: int, value: torch.Tensor) -> None:
        if self.row == 0:
            return
        os.pwrite(self.fd, value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().data,
                  cid * self.row)

    def read(self, cid: int) -> torch.Tensor:
        if self.row == 0:
            return torch.empty(self.shape, dtype=self.dtype, device=self.device)
        data = bytearray(os.pread(self.fd, self.row, cid * self.row))
        value = torch.frombuffer(data, dtype=torch.uint8).view(self.dtype).reshape(self.shape)
        return value if self.device.type == "cpu" else value.to(self.device)


class ClientStates:
    """``count`` clients' states, at most ``budget`` bytes of them in memory (least recently used
    spilled to ``folder``; the state in use is held whatever its size). A state is replaced, never
    changed in place (the parts' rule, ``round.client_round``), so a state read back from disk and
    not replaced is not written again."""

    def __init__(self, count: int, budget: int, folder: Path) -> None:
        self.count, self.budget, self.folder = count, budget, folder
        shutil.rmtree(folder, ignore_errors=True)  # a resumed run's store is refilled from its checkpoint
        folder.mkdir(parents=True)
        self.cache: OrderedDict[int, Tensors] = OrderedDict()  # in memory, the most recently used last
        self.sizes: dict[int, int] = {}
        self.held = 0  # bytes of the states in memory
        self.unsaved: set[int] = set()  # states in memory newer than their rows on disk (or with none)
        self.layouts: list[tuple[int, ...]] = [()] * count  # the columns of each client's state on disk
        self._shared: dict[tuple[int, ...], tuple[int, ...]] = {(): ()}
        self.columns: list[_Column] = []
        self._column_of: dict[tuple[str, torch.dtype, tuple[int, ...], str], int] = {}

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Tensors]:
        return (self.stored(cid) for cid in range(self.count))

    def __getitem__(self, cid: int) -> Tensors:
        """Client ``cid``'s state, held in memory from now on (``{}`` for one that never kept any, not held)."""
        cid = self._index(cid)
        if cid in self.cache:
            self.cache.move_to_end(cid)
            return self.cache[cid]
        state = self._read(cid)
        if state:
            self._hold(cid, state)
        return state

    def __setitem__(self, cid: int, state: Tensors) -> None:
        cid = self._index(cid)
        if cid in self.cache:
            self.held -= self.sizes.pop(cid)
            del self.cache[cid]
        self.unsaved.add(cid)
        self._hold(cid, state)

    def stored(self, cid: int) -> Tensors:
        """Client ``cid``'s state without holding it in memory (a checkpoint reading them all)."""
        cid = self._index(cid)
        return self.cache[cid] if cid in self.cache else self._read(cid)

    def described(self, cid: int) -> list[tuple[str, torch.dtype, list[int], int]]:
        """Client ``cid``'s state's tensors, in its order — name, dtype, shape, bytes — read from
        nothing (a checkpoint's header, made before the states' bytes are read)."""
        cid = self._index(cid)
        if cid in self.cache:
            return [(k, v.dtype, list(v.shape), v.nbytes) for k, v in self.cache[cid].items()]
        return [(c.key, c.dtype, list(c.shape), c.row) for c in (self.columns[i] for i in self.layouts[cid])]

    def close(self) -> None:
        """Close the files and remove the folder (the checkpoints hold the states)."""
        for column in self.columns:
            os.close(column.fd)
        self.columns, self.cache, self.held = [], OrderedDict(), 0
        shutil.rmtree(self.folder, ignore_errors=True)

    def _index(self, cid: int) -> int:
        if not 0 <= cid < self.count:
            raise IndexError(f"client {cid} of {self.count}")
        return int(cid)

    def _hold(self, cid: int, state: Tensors) -> None:
        self.cache[cid] = state
        self.sizes[cid] = state_bytes(state)
        self.held += self.sizes[cid]
        self._spill()

    def _spill(self) -> None:
        """Write the least recently used states to disk until the rest fit in the budget."""
        while self.held > self.budget and len(self.cache) > 1:
            cid, state = self.cache.popitem(last=False)
            self.held -= self.sizes.pop(cid)
            if cid in self.unsaved:
                self.unsaved.discard(cid)
                self._write(cid, state)

    def _write(self, cid: int, state: Tensors) -> None:
        layout = tuple(self._column(key, value) for key, value in state.items())
        for index, value in zip(layout, state.values()):
            self.columns[index].write(cid, value)
        self.layouts[cid] = self._shared.setdefault(layout, layout)

    def _read(self, cid: int) -> Tensors:
        return {self.columns[i].key: self.columns[i].read(cid) for i in self.layouts[cid]}

    def _column(self, key: str, value: torch.Tensor) -> int:
        name = (key, value.dtype, tuple(value.shape), str(value.device))
        if name not in self._column_of:
            self._column_of[name] = len(self.columns)
            self.columns.append(_Column(self.folder / f"{len(self.columns)}.rows", key, value))
        return self._column_of[name]

