"""The round's batches of the clients of one stack, drawn from each client's generator in the order of
a client trained alone (:mod:`fedlatent.federated.trainer.schedule`), and the groups that take a
step together.

Planned (no augmentation, crop + flip, AutoAugment): at the start of the round, each client's whole
round is drawn on the host (its permutations and every batch's augmentation draws) and held with
the rows on the training device; a step's batches of a group are then one gather of the members'
rows from the pool (the clients' training sets concatenated and moved to the device once, images as
uint8, standardised when gathered), and crop + flip one indexing op over the (clients × batch)
images. Streamed (a data set's own transform, which decides per batch how to resample): client by
client, batch by batch, the batches stacked."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from itertools import accumulate
from typing import NamedTuple, cast

import torch
from torch import Tensor

from fedlatent.data import augment
from fedlatent.data.compact import Images
from fedlatent.data.types import Split
from fedlatent.federated import devices
from fedlatent.federated.client import LocalSettings, Workspace
from fedlatent.federated.trainer.schedule import epochs


def _stream(data: Split, s: LocalSettings, generator: torch.Generator) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """One client's (indices, x, y) batches of the round, drawn from its generator in the order the
    client trained alone draws them: each epoch's permutation when the epoch starts, each batch's
    augmentation when it is taken (a data set's transform, whose draws depend on the batch). An
    empty (Poisson) batch comes with the client's first sample as its stand-in (see :func:`_planned`)."""
    for epoch in epochs(len(data), s, generator):
        for idx in epoch:
            rows = idx if len(idx) else _STAND_IN
            # the whole stored images: a training transform may crop them to the input size
            x = data.x.full(rows) if isinstance(data.x, Images) else data.x[rows]
            yield idx, augment.augment_batch(x.to(s.device), generator, s.augment), data.y[rows].to(s.device)


class _Span(NamedTuple):
    """A client's batch in the round's plan: its rows ``start``, ``start + 1``, … (``length``)."""

    start: int
    length: int


Taken = _Span | tuple[Tensor, Tensor, Tensor]  # a batch: its span of the plan, or streamed (indices, x, y)


_STAND_IN = torch.zeros(1, dtype=torch.long)  # an empty batch's row: the client's first sample, weighted 0


def _planned(num_samples: int, s: LocalSettings, generator: torch.Generator, offset: int,
             images: bool) -> tuple[list[Tensor], list[dict[str, Tensor]], list[int]]:
    """One client's round drawn at its start, in the order a client streaming its batches draws
    it: each epoch's permutation when the epoch starts, then each of its batches' augmentation
    draws (:func:`fedlatent.data.augment.draw`: crop offsets, flips, the policy's; none without
    augmentation or for inputs that are not ``images``); the batches as rows of the pool (its
    ``offset`` added to each permutation), and their sizes. An empty batch (Poisson sampling's)
    holds one stand-in row, the client's first sample, so that a step's forward has an input: its
    size 0 weights it 0."""
    rows, drawn, sizes = [], [], []
    for epoch in epochs(num_samples, s, generator, offset):
        for idx in epoch:
            sizes.append(len(idx))
            if not len(idx):
                idx = _STAND_IN + offset
            rows.append(idx)
            if s.augment and images:
                drawn.append(augment.draw(len(idx), generator, s.augment))
    return rows, drawn, sizes


class Batches:
    """The round's batches of the clients of one stack, drawn from each client's generator in the
    order of a client trained alone.

    Planned (no augmentation, crop + flip, AutoAugment): at the start of the round, each client's
    whole round is drawn on the host (:func:`_planned`: its permutations and every batch's
    augmentation draws, in the order a client streaming its batches draws them: a few small draws
    per batch, nothing per sample), and held with the rows on the training device; a step's batches
    of a group are then one gather of the members' rows from the pool (the clients' training sets
    concatenated and moved to the device once, images as uint8, standardised when gathered), and
    crop + flip as one indexing op over the (clients × batch) images, the policy once for them all.
    Streamed (a data set's transform, which decides per batch how to resample): client by client
    (:func:`_stream`), the batches stacked. One client on a device that trains channels_last
    (:mod:`fedlatent.federated.devices`) gets its 4-D batch in that layout; stacked clients run
    under ``vmap`` on 5-D inputs, where it does not apply."""

    def __init__(self, ws: Workspace, datas: list[Split], sizes: list[int], s: LocalSettings,
                 generators: list[torch.Generator]) -> None:
        self.device = s.device
        self.layout = len(datas) == 1 and ws.model is not None and devices.channels_last(s.device) \
            and devices.convolutional(ws.model)
        self.streams: list[Iterator[Taken]]
        if s.augment and not augment.pooled(s.augment):
            self.streams = [_stream(d, s, g) for d, g in zip(datas, generators)]
            return
        self.pool = _pool(ws, datas, s.device)
        self.augment = s.augment if len(self.pool.x.shape) == 4 else False  # inputs that are not images pass
        plans = [_planned(n, s, g, offset, bool(self.augment))
                 for n, g, offset in zip(sizes, generators, [0, *accumulate(sizes)][:-1])]
        rows = [idx for plan_rows, _, _ in plans for idx in plan_rows]
        lengths = [len(idx) for idx in rows]
        starts = iter([0, *accumulate(lengths)])
        self.streams = [iter([_Span(next(starts), size) for size in plan_sizes]) for _, _, plan_sizes in plans]
        self.rows = (torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)).to(s.device)
        drawn = [d for _, plan_drawn, _ in plans for d in plan_drawn]
        whole = {k: torch.cat([d[k] for d in drawn]) for k in (drawn[0] if drawn else {})}
        # the draws the augmentation reads on the host (AutoAugment's: which images each operation takes) stay there
        self.host_drawn = {k: v for k, v in whole.items() if k in augment.READ_ON_HOST}
        self.drawn = {k: v.to(s.device) for k, v in whole.items() if k not in augment.READ_ON_HOST}

    def take(self, active: list[int]) -> dict[int, Taken]:
        """The next batch of each client of ``active``."""
        return {c: next(self.streams[c]) for c in active}

    @staticmethod
    def size(batch: Taken) -> int:
        return batch.length if isinstance(batch, _Span) else len(batch[0])

    def stacked(self, taken: dict[int, Taken], members: list[int], size: int) -> tuple[Tensor, Tensor]:
        """The (clients, size, …) inputs and (clients, size) labels of ``members``' batches, a
        shorter batch padded with copies of its last sample (:func:`_padded`; planned: its last
        row and that row's draws again; an empty batch: its stand-in row)."""
        first = taken[members[0]]
        if not isinstance(first, _Span):
            streamed = cast(list[tuple[Tensor, Tensor, Tensor]], [taken[c] for c in members])
            x = torch.stack([_padded(b[1], size) for b in streamed])
            y = torch.stack([_padded(b[2], size) for b in streamed])
            return self._laid(x.flatten(0, 1)).unflatten(0, x.shape[:2]), y
        spans = cast(list[_Span], [taken[c] for c in members])
        pos: Tensor | slice
        at: Tensor | slice  # the positions on the host, for the draws kept there
        if len(spans) == 1 and first.length == size:  # one client's whole batch: views of the plan
            pos = at = slice(first.start, first.start + size)
        else:  # each batch's positions in the plan, a shorter one's last repeated (one copy to the device)
            starts, lengths = torch.tensor([[sp.start, sp.length] for sp in spans]).unbind(1)
            last = (lengths[:, None] - 1).clamp(min=0)
            at = (starts[:, None] + torch.minimum(torch.arange(size), last)).flatten()
            pos = devices.upload(at, self.device)
        rows = self.rows[pos]
        if self.augment:  # the whole stored images, as a streamed batch takes them
            x = self.pool.x.full(rows) if isinstance(self.pool.x, Images) else self.pool.x.index_select(0, rows)
            x = augment.apply(x, {**{k: v[pos] for k, v in self.drawn.items()},
                                  **{k: v[at] for k, v in self.host_drawn.items()}}, self.augment)
        else:
            x = _take(self.pool.x, rows)
        shape = (len(members), size)
        return self._laid(x).unflatten(0, shape), _take(self.pool.y, rows).unflatten(0, shape)

    def _laid(self, x: Tensor) -> Tensor:
        """The (clients × batch, …) inputs in the device's layout (:func:`devices.batch_layout`);
        unflattening the client axis keeps each client's view in it."""
        return devices.batch_layout(x, self.layout)


def _take(values: Tensor | Images, rows: Tensor) -> Tensor:
    """The ``rows`` of ``values``: ``index_select`` for a tensor (~3× faster than indexing with
    a tensor of rows), the images' own indexing for compact images."""
    return values.index_select(0, rows) if isinstance(values, Tensor) else values[rows]


def _pool(ws: Workspace, datas: list[Split], device: torch.device) -> Split:
    """The clients' training sets one after another, on ``device`` (images as compact uint8): the
    workspace's last pool when it holds the same sets (a round of the same clients), else a new
    one, kept there in its place (the old one let go first: one pool in memory at a time, as when
    each round made its own). One client on the CPU: its own set, nothing to copy."""
    kept = ws.pool
    if kept is not None and len(kept[0]) == len(datas) and all(a is b for a, b in zip(kept[0], datas)):
        return kept[1]
    if len(datas) == 1 and torch.device(device).type == "cpu":
        return datas[0]
    ws.pool = kept = None
    joined = datas[0] if len(datas) == 1 else Split.concat(datas)
    ws.pool = (tuple(datas), joined.to(device))
    return ws.pool[1]


def _padded(rows: Tensor, size: int) -> Tensor:
    """``rows`` with copies of its last row appended up to ``size`` rows (the padding of a shorter
    batch: real data, so that the forward stays finite; weighted zero in the loss)."""
    return rows if len(rows) == size else torch.cat([rows, rows[-1:].expand(size - len(rows), *rows.shape[1:])])


def step_groups(active: list[int], sizes: dict[int, int], pad: bool) -> list[list[int]]:
    """The groups of ``active`` clients that take this step together: all of them when shorter
    batches may be padded (``pad``), else one group per batch size."""
    if pad:
        return [active]
    by_size: dict[int, list[int]] = defaultdict(list)
    for c in active:
        by_size[sizes[c]].append(c)
    return list(by_size.values())


def row_weights(sizes: list[int], size: int, device: torch.device) -> Tensor | None:
    """(clients, size) 1 for a real row and 0 for padding, or None when no batch is padded."""
    if min(sizes) == size:
        return None
    return (torch.arange(size, device=device) < devices.upload(sizes, device)[:, None]).to(torch.get_default_dtype())
