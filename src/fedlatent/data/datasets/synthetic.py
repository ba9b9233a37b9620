"""Synthetic(α, β): generated federations with controllable model and feature heterogeneity."""
from __future__ import annotations

from fedlatent.config import DataConfig
from fedlatent.data.registry import register_dataset
from fedlatent.data.sources import GivenClients
from fedlatent.data.synthetic import synthetic_federation


@register_dataset("synthetic", reads=("synthetic_alpha", "synthetic_beta", "synthetic_model", "samples_per_client"),
                  own_clients=True, shape=lambda cfg: ((60,), 10))
def _synthetic(cfg: DataConfig, seed: int) -> GivenClients:
    """Synthetic(α, β), generated per client; each client's samples split 64/16/20 train/val/test."""
    clients = []
    for x, y in synthetic_federation(cfg.clients(), cfg.synthetic_alpha, cfg.synthetic_beta,
                                     cfg.samples_per_client, seed=seed, model=cfg.synthetic_model):
        n_train, n_val = int(0.64 * len(y)), int(0.16 * len(y))  # 3200/800/1000 of 5000
        clients.append({"train": (x[:n_train], y[:n_train]),
                        "val": (x[n_train:n_train + n_val], y[n_train:n_train + n_val]),
                        "test": (x[n_train + n_val:], y[n_train + n_val:])})
    return GivenClients(clients, num_classes=10)
