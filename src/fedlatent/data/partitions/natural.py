"""A pool's own clients, named sample by sample in a CSV (``sample,client``)."""
from __future__ import annotations

import numpy as np

from fedlatent.config import DataConfig
from fedlatent.data.natural import read_client_map
from fedlatent.data.registry import register_partition
from fedlatent.errors import ConfigError
from fedlatent.registry import Key

KEYS = {"clients_file": Key("", "CSV with the columns sample,client: each sample to partition (by its index among "
                            "them) named by its client's natural id")}


@register_partition("clients_file", keys=KEYS, own_count=True)
def _clients_file(cfg: DataConfig, labels: np.ndarray, groups: np.ndarray | None, seed: int) -> list[np.ndarray]:
    """The clients a CSV names sample by sample (data.clients_file), in the order they first appear."""
    path = str(cfg.options.get("clients_file", ""))
    if not path:
        raise ConfigError("data.clients_file: partition = 'clients_file' needs it set")
    parts = read_client_map(path, len(labels))
    if cfg.num_clients != "auto" and int(cfg.num_clients) != len(parts):
        raise ConfigError(f"data.num_clients = {cfg.num_clients}: {path} names {len(parts)} clients")
    return parts
