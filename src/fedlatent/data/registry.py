"""Names → data sets (``data.dataset``) and partitions (``data.partition``), each an open list.

A data set is one file in :mod:`fedlatent.data.datasets` that registers a loader
``(cfg, seed) -> Pool | GivenClients``; a partition is one file in :mod:`fedlatent.data.partitions`
that registers ``(cfg, labels, groups, seed) -> list of index arrays``. Both declare the ``[data]``
fields they read (and keys of their own). Traits tell how they combine:

- data set ``own_clients``: it brings its clients (a :class:`GivenClients`); only partitions with
  ``for_own_clients`` apply (``given``; ``iid`` is accepted and means the same);
- data set ``groups``: its samples carry natural domains; partition ``needs_groups``: it splits by them;
- partition ``for_pools = False``: it cannot split a labelled pool (``given``);
- data set ``required``: fields that must be set (e.g. ``path`` for ``arrays``).
- data set ``shape``: ``cfg -> (input shape, classes)`` where the configuration alone fixes them,
  so that the model's keys are checked before any data are read (:mod:`fedlatent.experiment.runner.validation`).
- data set ``labels``: ``cfg -> Labels | Pool``, a pool's labels read more cheaply than its samples
  (an image tree's listing), from which ``fedlatent check`` makes the run's partition
  (:func:`fedlatent.data.federation.outline`); without it the check reads what the loader reads.
"""
from __future__ import annotations

from typing import Any

from fedlatent.config import DataConfig
from fedlatent.errors import ConfigError
from fedlatent.registry import Registry, check_section

DATASETS = Registry("data", "dataset", package="fedlatent.data.datasets")
PARTITIONS = Registry("data", "partition", package="fedlatent.data.partitions")
register_dataset = DATASETS.register
register_partition = PARTITIONS.register


def _names(registry: Registry, trait: str, default: bool = False) -> str:
    return ", ".join(e.name for e in registry.entries() if e.traits.get(trait, default))


def check(cfg: DataConfig) -> dict[str, Any]:
    """Validate the data set, the partition, how they combine and the keys they read; return the
    resolved own keys (``options``). Nothing is loaded."""
    dataset, partition = DATASETS.get(cfg.dataset), PARTITIONS.get(cfg.partition)
    own = bool(dataset.traits.get("own_clients"))
    if own and not partition.traits.get("for_own_clients"):
        raise ConfigError(f"data.partition = '{cfg.partition}': data.dataset = '{cfg.dataset}' comes with its own "
                          f"clients (use data.partition = one of {_names(PARTITIONS, 'for_own_clients')})")
    if not own and not partition.traits.get("for_pools", True):
        raise ConfigError(f"data.partition = '{cfg.partition}': data set '{cfg.dataset}' is a pool to partition "
                          f"(use one of {_names(PARTITIONS, 'for_pools', True)})")
    if partition.traits.get("needs_groups") and not dataset.traits.get("groups"):
        raise ConfigError(f"data.partition = '{cfg.partition}': data set '{cfg.dataset}' has no domains "
                          f"(data sets with domains: {_names(DATASETS, 'groups')})")
    for key in dataset.traits.get("required", ()):
        if not getattr(cfg, key):
            raise ConfigError(f"data.{key}: data.dataset = '{cfg.dataset}' needs it set")
    return check_section(cfg, [(DATASETS, dataset), (PARTITIONS, partition)])


def catalogue() -> str:
    """Every registered data set and partition with the keys each reads."""
    return DATASETS.describe() + "\n" + PARTITIONS.describe()


__all__ = ["DATASETS", "PARTITIONS", "register_dataset", "register_partition", "check", "catalogue"]
