"""Evaluation on a seeded sample of clients (``eval.clients``, ``eval.final_clients``), with its standard error.

A cross-device federation (tens of thousands of clients, a cohort of 100 a round) cannot afford a
visit to every client at every ``eval.every``: a round would cost what the federation costs, not
what its cohort does. So a round's evaluation takes every client up to a bound and, above it, a
simple random sample without replacement of a stated size, drawn from (seed, round); the final
evaluation takes every client unless a sample is asked. An estimate from a sample is reported with
its standard error under that design (Cochran, *Sampling Techniques*, 3rd ed., 1977):

* the mean over clients of a per-client value (``val_accuracy``, ``personalized_accuracy``), eq. 2.12:
  SE(ȳ) = √((1 − f)·s²/n), f = n/N, s² the sample variance (ddof 1) — ȳ is unbiased for the mean
  over every client;
* the sample-weighted accuracy of held-out clients (Σ correct / Σ samples over clients: a ratio),
  the ratio estimator's eq. 6.13: SE(R̂) ≈ √((1 − f)/(n·m̄²) · Σ(cᵢ − R̂·mᵢ)²/(n − 1)).

Where every client is evaluated, nothing here is called: the numbers are the full evaluation's.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from fedlatent.config import RunConfig
from fedlatent.data.types import Split
from fedlatent.errors import ConfigError
from fedlatent.models.base import FedModel
from fedlatent.seeding import EVALUATION_SAMPLE, derive_seed

BOUND = 1000  # eval.clients = "auto": every client up to this many, a sample of this many above


def round_size(value: int | str, population: int) -> int:
    """How many of ``population`` clients a round's evaluation takes under ``eval.clients = value``."""
    bound = BOUND if value == "auto" else int(value)
    return min(bound, population)


def draw(population: int, size: int, *stream: int) -> list[int] | None:
    """``size`` distinct ids of ``population``, in id order, from ``derive_seed(*stream)``; None
    (every client) when ``size`` covers the population."""
    if size >= population:
        return None
    rng = np.random.default_rng(derive_seed(*stream))
    return sorted(int(c) for c in rng.choice(population, size, replace=False))


def round_clients(config: RunConfig, rnd: int, population: int, *, held_out: bool = False) -> list[int] | None:
    """The clients (of ``population``: the training clients, or with ``held_out`` the held-out ones by
    their position among them) round ``rnd``'s (0-based) evaluation takes; None: every one."""
    return draw(population, round_size(config.eval.clients, population),
                config.seed, EVALUATION_SAMPLE, rnd, int(held_out))


def final_clients(config: RunConfig, population: int, *, held_out: bool = False) -> list[int] | None:
    """The clients the final evaluation takes: every one (None) unless ``eval.final_clients`` names a sample."""
    value = config.eval.final_clients
    if value == "auto":
        return None
    return draw(population, min(int(value), population), config.seed, EVALUATION_SAMPLE, config.train.rounds,
                2 + int(held_out))


def mean_se(values: list[float], population: int) -> float:
    """The standard error of the mean of ``values``, a simple random sample without replacement of
    ``population`` clients (Cochran eq. 2.12); 0 for a census, NaN for a sample of one."""
    n = len(values)
    if n >= population:
        return 0.0
    if n < 2:
        return float("nan")
    return math.sqrt((1 - n / population) * float(np.var(values, ddof=1)) / n)


def ratio_se(correct: list[int], counts: list[int], population: int) -> float:
    """The standard error of R̂ = Σ correct / Σ counts over a simple random sample of clients
    without replacement from ``population`` (the ratio estimator, Cochran eq. 6.13)."""
    n = len(counts)
    if n >= population:
        return 0.0
    c, m = np.asarray(correct, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    if n < 2 or m.sum() == 0:
        return float("nan")
    r = c.sum() / m.sum()
    return math.sqrt((1 - n / population) * float(((c - r * m) ** 2).sum()) / (n - 1) / (n * m.mean() ** 2))


def check(config: RunConfig, population: int) -> None:
    """``eval.clients`` and ``eval.final_clients`` against the ``population`` of training clients
    (a sample larger than the federation is a mistyped key: exit 2 before the run folder)."""
    for key in ("clients", "final_clients"):
        value = getattr(config.eval, key)
        if value != "auto" and int(value) > population:
            raise ConfigError(f"eval.{key} = {value}: above the {population} clients that train; at most "
                              f"{population} (every client), or \"auto\"")


@torch.no_grad()
def correct_per_client(model: FedModel, splits: list[Split], batch_size: int,
                       device: torch.device) -> tuple[list[int], list[int]]:
    """Each split's correct predictions and samples under ``model``, the splits evaluated together
    in batches of ``batch_size`` (one pass over their concatenation rather than one per client:
    a sample of a thousand clients' few samples each costs a few batches, not a thousand)."""
    sizes = [len(split) for split in splits]
    if not sum(sizes):
        return [0] * len(splits), sizes
    whole = Split.concat([split for split in splits if len(split)])
    model.eval()
    hits = torch.cat([(model(whole.x[b:b + batch_size].to(device)).logits.argmax(1).cpu() == whole.y[b:b + batch_size])
                      for b in range(0, len(whole), batch_size)])
    owner = torch.repeat_interleave(torch.arange(len(splits)), torch.as_tensor(sizes))
    correct = torch.zeros(len(splits), dtype=torch.int64).index_add_(0, owner, hits.long())
    return correct.tolist(), sizes
