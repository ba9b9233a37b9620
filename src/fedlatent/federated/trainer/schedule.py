"""The batch schedule of a client's round, known before anything is drawn where it can be: E epochs of
seeded permutations cut into batches (:func:`batches`, :func:`batch_count`), a budget of
``train.local_steps`` drawn epoch after epoch, or Poisson batches for sample-level DP-SGD (Abadi et
al. 2016, Algorithm 1: each sample in each batch with probability q = b / n); :func:`epochs` yields
them in the order a client trained alone draws them."""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from fedlatent.federated.client import LocalSettings


def batch_count(num_samples: int, batch_size: int, drop_last: bool) -> int:
    """How many batches :func:`batches` keeps of an epoch (known before drawing): the ⌈n / b⌉
    chunks of the permutation (one, empty, when n = 0) but an incomplete last one under
    ``drop_last`` and a trailing one of a single sample (BatchNorm cannot train on it)."""
    chunks = max(1, -(-num_samples // batch_size))
    last = num_samples - (chunks - 1) * batch_size
    return chunks - ((drop_last and last < batch_size) or (chunks > 1 and last == 1))


def trained_samples(num_samples: int, steps: int, batch_size: int, drop_last: bool) -> int:
    """How many samples ``steps`` local steps of :func:`epochs` train on (a sample counted once per
    epoch that holds it): whole epochs of the kept batches, then the first batches of the next, all
    full (an epoch's short batch comes last)."""
    per_epoch = batch_count(num_samples, batch_size, drop_last)
    if not per_epoch or not num_samples:
        return 0
    epoch_samples = min(num_samples, per_epoch * batch_size)
    whole, rest = divmod(steps, per_epoch)
    return whole * epoch_samples + rest * batch_size


def planned_steps(num_samples: int, s: LocalSettings) -> int:
    """How many local steps :func:`epochs` yields for a training set of ``num_samples`` (known
    before drawing): ``s.steps`` when set (none without data), else ``s.epochs`` epochs of batches
    (Poisson batches: :func:`poisson_steps`)."""
    if s.poisson:
        return poisson_steps(num_samples, s.batch_size, s.epochs, s.steps)
    per_epoch = batch_count(num_samples, s.batch_size, s.drop_last)
    if s.steps:
        return s.steps if per_epoch else 0
    return s.epochs * per_epoch


def batches(num_samples: int, batch_size: int, drop_last: bool, generator: torch.Generator,
            offset: int = 0) -> list[Tensor]:
    """Index batches of one epoch from a seeded permutation, the first :func:`batch_count` of its
    chunks of ``batch_size``; ``offset`` added to every index (the client's rows in a pool of
    several clients' samples)."""
    order = torch.randperm(num_samples, generator=generator)
    if offset:
        order += offset
    chunks = [order] if num_samples <= batch_size else list(order.split(batch_size))
    return chunks[:batch_count(num_samples, batch_size, drop_last)]


def poisson_rate(num_samples: int, batch_size: int) -> float:
    """q = min(1, b / n): each sample's probability of joining a Poisson batch, whose expected size is
    then min(b, n) (Abadi et al. 2016, Algorithm 1's "lot" of expected size L = qN)."""
    return min(1.0, batch_size / num_samples) if num_samples else 0.0


def poisson_steps(num_samples: int, batch_size: int, epochs: int, steps: int) -> int:
    """A round's Poisson batches: ``steps`` when set, else ``epochs`` × ⌈n / b⌉ (an epoch: as many
    batches as draw n samples in expectation, rounded up); none without data."""
    if not num_samples:
        return 0
    return steps or epochs * -(-num_samples // batch_size)


def poisson_batches(num_samples: int, s: LocalSettings, generator: torch.Generator, offset: int = 0) -> list[Tensor]:
    """The round's :func:`poisson_steps` index batches, each sample in each batch independently with
    probability :func:`poisson_rate` (one uniform draw per sample and step, all drawn at once); a
    batch may be empty. ``offset``: see :func:`batches`."""
    count = poisson_steps(num_samples, s.batch_size, s.epochs, s.steps)
    taken = torch.rand(count, num_samples, generator=generator) < poisson_rate(num_samples, s.batch_size)
    return [row.nonzero().flatten() + offset for row in taken]


def epochs(num_samples: int, s: LocalSettings, generator: torch.Generator, offset: int = 0) -> Iterator[list[Tensor]]:
    """The round's index batches epoch by epoch, each drawn when it starts: ``s.epochs`` epochs, or
    as many as ``s.steps`` batches take (the last one cut short); Poisson batches all at once, as
    one "epoch" (:func:`poisson_batches`); ``offset``: see :func:`batches`."""
    if s.poisson:
        yield poisson_batches(num_samples, s, generator, offset)
        return
    if not s.steps:
        for _ in range(s.epochs):
            yield batches(num_samples, s.batch_size, s.drop_last, generator, offset)
        return
    left = s.steps
    while left > 0:
        epoch = batches(num_samples, s.batch_size, s.drop_last, generator, offset)[:left]
        if not epoch:
            return
        yield epoch
        left -= len(epoch)
