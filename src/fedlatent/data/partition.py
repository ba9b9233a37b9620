"""Pure partition functions: labels (or a sample count) in, one index array per client out.

Example::

    >>> import numpy as np
    >>> labels = np.repeat(np.arange(3), 20)
    >>> parts = dirichlet(labels, num_clients=2, alpha=0.5, seed=0, min_size=5)
    >>> sorted(np.concatenate(parts).tolist()) == list(range(60))
    True
"""
from __future__ import annotations

import numpy as np

from fedlatent.errors import ConfigError


def iid(num_samples: int, num_clients: int, *, seed: int) -> list[np.ndarray]:
    """A random permutation of all indices cut into ``num_clients`` near-equal parts."""
    _check_clients(num_samples, num_clients)
    order = np.random.default_rng(seed).permutation(num_samples)
    return [part.astype(np.int64) for part in np.array_split(order, num_clients)]


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, *, seed: int, min_size: int = 10,
              balance: bool = True, max_retries: int = 1000) -> list[np.ndarray]:
    """Dirichlet label skew, index for index the procedure of the seed papers' releases.

    For a given seed this reproduces their partitions exactly, because it replays their use of
    numpy's legacy global generator: seed it, then repeat whole passes until the smallest client
    holds ``min_size`` samples. A pass: for each class in ascending order, shuffle its indices,
    draw q ~ Dir(α·1) (classes 0..max label, absent ones included, as ``range(K)`` there), zero q_j for clients already holding ≥ N/n samples (``balance``), renormalise,
    cut at floor(cumsum(q)·|class|) and append in client order. Finally each client's list is
    shuffled. The legacy generator is re-seeded here and nowhere else; the caller's other
    randomness uses its own ``Generator``.
    """
    labels = np.asarray(labels)
    if alpha <= 0:
        raise ConfigError(f"data.alpha = {alpha}: must be > 0")
    num_samples = len(labels)
    _check_clients(num_samples, num_clients)
    if min_size * num_clients > num_samples:
        raise ConfigError(f"data.min_size = {min_size}: {num_clients} clients × {min_size} exceeds the "
                          f"{num_samples} samples; lower data.min_size or data.num_clients")
    np.random.seed(seed)
    cap = num_samples / num_clients
    for _ in range(max_retries):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for k in range(int(labels.max()) + 1):
            idx_k = np.where(labels == k)[0]
            np.random.shuffle(idx_k)
            q = np.random.dirichlet(np.repeat(alpha, num_clients))
            if balance:
                q = np.array([p * (len(part) < cap) for p, part in zip(q, parts)])
            q = q / q.sum()
            cuts = (np.cumsum(q) * len(idx_k)).astype(int)[:-1]
            for part, chunk in zip(parts, np.split(idx_k, cuts)):
                part.extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            break
    else:
        raise ConfigError(f"data.alpha = {alpha}: no Dirichlet partition with every client holding "
                          f">= {min_size} samples after {max_retries} passes; raise data.alpha or "
                          f"data.max_retries, or lower data.min_size / data.num_clients")
    out = []
    for part in parts:
        arr = np.array(part, dtype=np.int64)
        np.random.shuffle(arr)
        out.append(arr)
    return out


def shards(labels: np.ndarray, num_clients: int, classes_per_client: int, *, seed: int) -> list[np.ndarray]:
    """Pathological skew: each client holds ``classes_per_client`` distinct classes.

    Classes are dealt round-robin over a seeded permutation so every class is held by about the
    same number of clients; each class's samples are split evenly among the clients holding it
    (FedAvg paper; FedDecorr appendix C.5).
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    _check_clients(len(labels), num_clients)
    if classes_per_client > len(classes):
        raise ConfigError(f"data.classes_per_client = {classes_per_client}: the data set has only "
                          f"{len(classes)} classes")
    if num_clients * classes_per_client < len(classes):
        raise ConfigError(f"data.classes_per_client = {classes_per_client}: {num_clients} clients × "
                          f"{classes_per_client} classes cannot hold all {len(classes)} classes; raise "
                          f"data.num_clients or data.classes_per_client")
    rng = np.random.default_rng(seed)
    deck = np.concatenate([rng.permutation(classes) for _ in range(
        -(-num_clients * classes_per_client // len(classes)))])
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    for client in range(num_clients):
        owned: list[int] = []
        start = client * classes_per_client
        for c in deck[start:]:
            if len(owned) == classes_per_client:
                break
            if int(c) not in owned:
                owned.append(int(c))
        for c in owned:
            holders[c].append(client)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, clients in holders.items():
        if not clients:
            continue
        idx = rng.permutation(np.where(labels == c)[0])
        for client, chunk in zip(clients, np.array_split(idx, len(clients))):
            parts[client].append(chunk)
    return [rng.permutation(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, np.int64)
            for p in parts]


def by_group(groups: np.ndarray) -> list[np.ndarray]:
    """One client per group value (natural domains: one client per domain), in sorted group order."""
    groups = np.asarray(groups)
    return [np.where(groups == g)[0].astype(np.int64) for g in np.unique(groups)]


def split_fractions(indices: np.ndarray, fractions: tuple[float, ...], *, seed: int) -> list[np.ndarray]:
    """Split one client's indices into consecutive parts of a seeded permutation.

    ``fractions`` are the sizes of all parts but the first (e.g. ``(0.1,)`` gives 90/10); each
    part gets ``round(f·n)`` samples and the first keeps the rest.
    """
    order = np.random.default_rng(seed).permutation(indices)
    sizes = [int(round(f * len(order))) for f in fractions]
    head = len(order) - sum(sizes)
    bounds = np.cumsum([head] + sizes)[:-1]
    return [np.sort(p) for p in np.split(order, bounds)]


def counts_table(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Samples per client × class (the partition summary printed and saved with each run)."""
    labels = np.asarray(labels)
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts]) if parts else \
        np.zeros((0, num_classes), np.int64)


def _check_clients(num_samples: int, num_clients: int) -> None:
    if num_clients < 1:
        raise ConfigError(f"data.num_clients = {num_clients}: must be >= 1")
    if num_clients > num_samples:
        raise ConfigError(f"data.num_clients = {num_clients}: more clients than the {num_samples} "
                          f"training samples")
