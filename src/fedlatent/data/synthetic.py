"""Synthetic(α, β): FedProx's generated federation, in its one-layer and two-layer forms.

Per client i (METHODS.md, "Synthetic(α, β)"): u_i ~ N(0, α²) sets the mean of the label map's
entries, B_i ~ N(0, β²) the mean of the client's feature mean v_i (entries ~ N(B_i, 1));
x ~ N(v_i, Σ) with Σ = diag(j^-1.2). Labels: ``one_layer`` (FedProx, Li et al. 2020)
y = argmax(Wx + b); ``two_layer`` (the Ditto+MMD paper's pipeline) y = argmax(W2(W1x + b1)/T + b2)
with W1, b1 ~ N(u1, 1) (d → 20) and W2, b2 ~ N(u2, 1) (20 → C).
"""
from __future__ import annotations

import numpy as np


def synthetic_client(rng: np.random.Generator, alpha: float, beta: float, num_samples: int, *,
                     model: str = "two_layer", dim: int = 60, hidden: int = 20, num_classes: int = 10,
                     temperature: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """One client's (x float32 n×dim, y int64 n) drawn from ``rng``."""
    cov_diag = np.arange(1, dim + 1, dtype=np.float64) ** -1.2
    feature_mean = rng.normal(rng.normal(0.0, beta), 1.0, dim)
    x = feature_mean + rng.standard_normal((num_samples, dim)) * np.sqrt(cov_diag)
    if model == "one_layer":
        u = rng.normal(0.0, alpha)
        w, b = rng.normal(u, 1.0, (dim, num_classes)), rng.normal(u, 1.0, num_classes)
        scores = x @ w + b
    elif model == "two_layer":
        u1, u2 = rng.normal(0.0, alpha), rng.normal(0.0, alpha)
        w1, b1 = rng.normal(u1, 1.0, (dim, hidden)), rng.normal(u1, 1.0, hidden)
        w2, b2 = rng.normal(u2, 1.0, (hidden, num_classes)), rng.normal(u2, 1.0, num_classes)
        scores = (x @ w1 + b1) @ w2 / temperature + b2
    else:
        raise ValueError(f"unknown synthetic model {model!r}: 'one_layer' or 'two_layer'")
    return x.astype(np.float32), scores.argmax(axis=1).astype(np.int64)


def synthetic_federation(num_clients: int, alpha: float, beta: float, samples_per_client: int, *,
                         seed: int, model: str = "two_layer") -> list[tuple[np.ndarray, np.ndarray]]:
    """Every client's (x, y), each from its own stream spawned from ``seed`` (so client i's data
    does not depend on how many clients there are)."""
    streams = np.random.SeedSequence(seed).spawn(num_clients)
    return [synthetic_client(np.random.default_rng(s), alpha, beta, samples_per_client, model=model)
            for s in streams]


def client_stream(seed: int, i: int) -> np.random.Generator:
    """Client ``i``'s stream of :func:`synthetic_federation`, made alone: the ``i``-th child that
    ``SeedSequence(seed).spawn`` makes (its spawn key ``(i,)``), so one client is generated
    without the others."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(i,)))
