"""Clients that never train (``data.holdout_clients``): which ones, and the federation without them.

A run with clients held out trains on the others and evaluates the held-out ones as new clients
(PFLlib's "new clients"; Marfoq et al. 2022's unseen clients): the global model and the method's
rule for a client it has never seen, on their test splits. Which clients are held out is a seeded
draw from the run's seed (stream :data:`~fedlatent.seeding.HOLDOUT`), made after the partition, so
that the partition itself and every other draw stay as they are. The clients that train keep their
partition order and are numbered 0 … n − h − 1 in the run (metrics, states, checkpoints); the
held-out ones follow, n − h … n − 1 in partition order (:attr:`~fedlatent.data.types.Federation.new_clients`;
``summary.json``'s ``final.new_clients``, and their partition ids ``final.new_client_partition_ids``).

>>> held_out(10, 3, seed=0)
[5, 6, 9]
"""
from __future__ import annotations

import dataclasses

import numpy as np

from fedlatent.config import RunConfig, holdout_count
from fedlatent.data.types import Federation
from fedlatent.errors import ConfigError
from fedlatent.seeding import HOLDOUT, derive_seed


def held_out(num_clients: int, count: int, *, seed: int) -> list[int]:
    """``count`` distinct client ids of ``num_clients``, drawn without replacement from ``seed``, in id order."""
    rng = np.random.default_rng(seed)
    return sorted(int(c) for c in rng.choice(num_clients, count, replace=False))


def holdout_ids(config: RunConfig, num_clients: int) -> list[int]:
    """The partition ids of the clients ``config`` holds out of ``num_clients`` (none when
    ``data.holdout_clients = 0``), drawn from ``derive_seed(config.seed, HOLDOUT)``."""
    value = config.data.holdout_clients
    if not value:
        return []
    return held_out(num_clients, holdout_count(value, num_clients), seed=derive_seed(config.seed, HOLDOUT))


def split(federation: Federation, ids: list[int]) -> Federation:
    """``federation`` whose clients ``ids`` (partition ids, in order) are moved to ``new_clients``,
    numbered after the clients left to train; each must have a test split, which is what it is
    evaluated on."""
    if not ids:
        return federation
    untested = [cid for cid in ids if federation.clients[cid].test is None or not len(federation.clients[cid].test)]
    if untested:
        raise ConfigError(f"data.holdout_clients: held-out client(s) {untested} have no test split to be evaluated on; "
                          "set data.local_test_fraction > 0")
    chosen = set(ids)
    kept = [c for i, c in enumerate(federation.clients) if i not in chosen]
    return dataclasses.replace(federation, clients=kept,
                               new_clients={len(kept) + j: federation.clients[cid] for j, cid in enumerate(ids)})


def for_run(config: RunConfig, federation: Federation) -> Federation:
    """The federation ``config``'s run trains on: :func:`split` by :func:`holdout_ids`."""
    return split(federation, holdout_ids(config, len(federation.clients)))
