"""The standard partitions: iid, dirichlet, shards, domains and given (the data set's own clients)."""
from __future__ import annotations

import numpy as np

from fedlatent.config import DataConfig
from fedlatent.data import partition as P
from fedlatent.data.registry import register_partition
from fedlatent.errors import ConfigError


@register_partition("iid", for_own_clients=True)
def _iid(cfg: DataConfig, labels: np.ndarray, groups: np.ndarray | None, seed: int) -> list[np.ndarray]:
    """A random permutation cut into near-equal parts (on a data set with its own clients: as given)."""
    return P.iid(len(labels), cfg.clients(), seed=seed)


@register_partition("dirichlet", reads=("alpha", "min_size", "balance", "max_retries"))
def _dirichlet(cfg: DataConfig, labels: np.ndarray, groups: np.ndarray | None, seed: int) -> list[np.ndarray]:
    """Label skew: class shares per client ~ Dir(alpha), the seed papers' procedure index for index."""
    return P.dirichlet(labels, cfg.clients(), cfg.alpha, seed=seed, min_size=cfg.min_size,
                       balance=cfg.balance, max_retries=cfg.max_retries)


@register_partition("shards", reads=("classes_per_client",))
def _shards(cfg: DataConfig, labels: np.ndarray, groups: np.ndarray | None, seed: int) -> list[np.ndarray]:
    """Sorted-label shards: classes_per_client classes per client (McMahan et al.)."""
    return P.shards(labels, cfg.clients(), cfg.classes_per_client, seed=seed)


@register_partition("domains", needs_groups=True)
def _domains(cfg: DataConfig, labels: np.ndarray, groups: np.ndarray | None, seed: int) -> list[np.ndarray]:
    """One client per natural domain (each keeps its own domain's held-out test split); data.num_clients
    may be left "auto"."""
    assert groups is not None  # the registry's check admits only data sets with domains
    parts = P.by_group(groups)
    if cfg.num_clients != "auto" and cfg.num_clients != len(parts):
        raise ConfigError(f"data.num_clients = {cfg.num_clients}: partition 'domains' gives one "
                          f"client per domain, {len(parts)} here")
    return parts


@register_partition("given", for_pools=False, for_own_clients=True)
def _given(cfg: DataConfig, labels: np.ndarray, groups: np.ndarray | None, seed: int) -> list[np.ndarray]:
    """The data set's own clients (synthetic, arrays): nothing to split."""
    raise ConfigError(f"data.partition = 'given': data set '{cfg.dataset}' is a pool to partition")
