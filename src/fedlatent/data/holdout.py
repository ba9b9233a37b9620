"""Clients that never train (``data.holdout_clients``): which ones, and the federation without them.

A run with clients held out trains on the others and evaluates the held-out ones as new clients
(PFLlib's "new clients"; Marfoq et al. 2022's unseen clients): the global model and the method's
rule for a client it has never seen, on their test splits. Which clients are held out is a seeded
draw from the data seed (the run's unless ``data.seed`` is set; stream :data:`~fedlatent.seeding.HOLDOUT`),
made after the partition, so that the partition itself and every other draw stay as they are; the
inputs' standardisation is computed from the training clients' samples alone. The clients that train keep their
partition order and are numbered 0 … n − h − 1 in the run (metrics, states, checkpoints); the
held-out ones follow, n − h … n − 1 in partition order (:attr:`~fedlatent.data.types.Federation.new_clients`;
``summary.json``'s ``final.new_clients``, and their partition ids ``final.new_client_partition_ids``).

>>> held_out(10, 3, seed=0)
[5, 6, 9]
"""
from __future__ import annotations

import dataclasses

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


def split(federation: Federation, ids: list[int]) -> Federation:
    """``federation`` whose clients ``ids`` (partition ids, in order) are moved to ``new_clients``,
    numbered after the clients left to train; each must have a test split, which is what it is
    evaluated on. Clients built when read (:class:`~fedlatent.data.clients.Clients`) stay unbuilt:
    the two are views of the same partition."""
    if not ids:
        return federation
    sizes = sizes_of(federation.clients)
    untested = [cid for cid in ids if not sizes[cid][2]]
    if untested:
        raise ConfigError(f"data.holdout_clients: held-out client(s) {untested} have no test split to be evaluated on; "
                          "set data.local_test_fraction > 0")
    chosen = set(ids)
    kept_ids = [i for i in range(len(federation.clients)) if i not in chosen]
    clients = federation.clients
    if isinstance(clients, Clients):
        return dataclasses.replace(federation, clients=clients.subset(kept_ids),
                                   new_clients=Numbered(clients.subset(ids), len(kept_ids)))
    return dataclasses.replace(federation, clients=[clients[i] for i in kept_ids],
                               new_clients={len(kept_ids) + j: clients[cid] for j, cid in enumerate(ids)})


def for_run(config: RunConfig, federation: Federation) -> Federation:
    """The federation ``config``'s run trains on: :func:`split` by :func:`holdout_ids`."""
    return split(federation, holdout_ids(config, len(federation.clients)))
