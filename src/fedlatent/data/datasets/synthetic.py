"""Synthetic(α, β): generated federations with controllable model and feature heterogeneity."""
from __future__ import annotations

import numpy as np

from fedlatent.config import DataConfig
from fedlatent.data.registry import register_dataset
from fedlatent.data.sources import Client, Generated, GivenClients
from fedlatent.data.synthetic import client_stream, synthetic_client

SPLITS = (0.64, 0.16)  # train, val; the rest is the client's test split (3200/800/1000 of 5000)


@register_dataset("synthetic", reads=("synthetic_alpha", "synthetic_beta", "synthetic_model", "samples_per_client"),
                  own_clients=True, shape=lambda cfg: ((60,), 10))
def _synthetic(cfg: DataConfig, seed: int) -> GivenClients:
    """Synthetic(α, β), each client generated from its own stream when it is read (nothing is held
    for a client no round reads); each client's samples split 64/16/20 train/val/test."""
    n = cfg.samples_per_client
    n_train, n_val = int(SPLITS[0] * n), int(SPLITS[1] * n)

    def client(i: int) -> Client:
        x, y = synthetic_client(client_stream(seed, i), cfg.synthetic_alpha, cfg.synthetic_beta, n,
                                model=cfg.synthetic_model)
        return {"train": (x[:n_train], y[:n_train]), "val": (x[n_train:n_train + n_val], y[n_train:n_train + n_val]),
                "test": (x[n_train + n_val:], y[n_train + n_val:])}

    count = cfg.clients()
    sizes = np.tile(np.array([n_train, n_val, n - n_train - n_val], dtype=np.int64), (count, 1))
    return GivenClients(Generated(count, client), num_classes=10, sizes=sizes, input_shape=(60,))
