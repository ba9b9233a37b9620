"""Clients that never train (``data.holdout_clients``): which ones, and how they are set apart.

A run with clients held out trains on the others and evaluates the held-out ones as new clients
(PFLlib's "new clients"; Marfoq et al. 2022's unseen clients): the global model and the method's
rule for a client it has never seen, on their test splits. Which clients are held out is a seeded
draw from the data seed (the run's unless ``data.seed`` is set; stream :data:`~fedlatent.seeding.HOLDOUT`),
made after the partition, so that the partition itself and every other draw stay as they are. The
draw is made once, where the federation is built (:func:`fedlatent.data.federation.build_federation`,
every source), which standardises the inputs with the training clients' samples alone and returns
the federation already :func:`split`; what ``fedlatent check`` reads of the data
(:func:`fedlatent.data.federation.outline`) draws them as the build does. A held-out client without
a test split is refused by the checks of the data (:func:`check_tested`), after those of the
clients' number, so that a run and its check refuse alike. The clients that
train keep their partition order and are numbered 0 … n − h − 1 in the run (metrics, states,
checkpoints); the held-out ones follow, n − h … n − 1 in partition order
(:attr:`~fedlatent.data.types.Federation.new_clients`, their partition ids
:attr:`~fedlatent.data.types.Federation.held_out`; ``summary.json``'s ``final.new_clients``, and
``final.new_client_partition_ids``, which a Flower server, holding no federation, draws again:
:func:`holdout_ids`).

>>> held_out(10, 3, seed=0)
[5, 6, 9]
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from fedlatent.config import DataConfig, RunConfig, holdout_count
from fedlatent.data.clients import Clients, Numbered, sizes_of
from fedlatent.data.types import Federation
from fedlatent.errors import ConfigError
from fedlatent.seeding import HOLDOUT, derive_seed


def held_out(num_clients: int, count: int, *, seed: int) -> list[int]:
    """``count`` distinct client ids of ``num_clients``, drawn without replacement from ``seed``, in id order."""
    rng = np.random.default_rng(seed)
    return sorted(int(c) for c in rng.choice(num_clients, count, replace=False))


def partition_ids(cfg: DataConfig, num_clients: int, data_seed: int) -> list[int]:
    """The partition ids of the clients ``data.holdout_clients`` holds out of ``num_clients`` (none
    when it is 0), drawn from ``derive_seed(data_seed, HOLDOUT)``: a choice of the data, made where
    the federation is built (its standardisation leaves their samples out)."""
    if not cfg.holdout_clients:
        return []
    return held_out(num_clients, holdout_count(cfg.holdout_clients, num_clients), seed=derive_seed(data_seed, HOLDOUT))


def holdout_ids(config: RunConfig, num_clients: int) -> list[int]:
    """The partition ids of the clients ``config``'s run holds out of ``num_clients``."""
    return partition_ids(config.data, num_clients, config.data_seed)


def kept(num_clients: int, ids: Sequence[int]) -> list[int]:
    """The partition ids of the clients left to train when ``ids`` of ``num_clients`` are held out, in order."""
    chosen = set(ids)
    return [i for i in range(num_clients) if i not in chosen]


def check_tested(ids: Sequence[int], test_sizes: Sequence[int] | np.ndarray) -> None:
    """Refuse held-out clients ``ids`` (partition ids) without a test split, the one thing they are
    evaluated on; ``test_sizes``: their test samples, one per id."""
    untested = [int(cid) for cid, n in zip(ids, test_sizes) if not n]
    if untested:
        raise ConfigError(f"data.holdout_clients: held-out client(s) {untested} have no test split to be evaluated on; "
                          "set data.local_test_fraction > 0")


def check_federation(federation: Federation) -> None:
    """:func:`check_tested` on a federation's held-out clients (their sizes read without building them)."""
    check_tested(federation.held_out, sizes_of(federation.new_clients)[:, 2])


def split(federation: Federation, ids: list[int]) -> Federation:
    """``federation`` (the whole partition) whose clients ``ids`` (partition ids, in order) are moved
    to ``new_clients``, numbered after the clients left to train (:attr:`Federation.held_out`: ``ids``).
    Each must have a test split, the one thing it is evaluated on: refused where the run checks its
    data (:func:`check_federation`, after the checks of the clients' number). Clients built when read
    (:class:`~fedlatent.data.clients.Clients`) stay unbuilt: the two are views of the same partition."""
    if not ids:
        return federation
    kept_ids = kept(len(federation.clients), ids)
    clients = federation.clients
    if isinstance(clients, Clients):
        return dataclasses.replace(federation, clients=clients.subset(kept_ids),
                                   new_clients=Numbered(clients.subset(ids), len(kept_ids)), held_out=tuple(ids))
    return dataclasses.replace(federation, clients=[clients[i] for i in kept_ids],
                               new_clients={len(kept_ids) + j: clients[cid] for j, cid in enumerate(ids)},
                               held_out=tuple(ids))
