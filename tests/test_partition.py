"""Partitions: Dirichlet index for index against the seeds' procedure, IID, shards, splits."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedlatent.data.partition import by_group, counts_table, dirichlet, iid, shards, split_fractions
from fedlatent.errors import ConfigError


# ---------------------------------------------------------------- the reference

def niid_bench_dirichlet(y_train: np.ndarray, n_parties: int, beta: float, seed: int,
                         min_require_size: int = 10, balance: bool = True) -> list[list[int]]:
    """The seed papers' label-skew partition, written out as their releases have it (NIID-Bench
    ``partition_data``, 'noniid-labeldir'; MOON / FedDecorr / FedUV copy it): the legacy global
    numpy generator, whole passes until every party holds ``min_require_size`` samples."""
    np.random.seed(seed)
    min_size = 0
    K = int(y_train.max()) + 1
    N = y_train.shape[0]
    while min_size < min_require_size:
        idx_batch = [[] for _ in range(n_parties)]
        for k in range(K):
            idx_k = np.where(y_train == k)[0]
            np.random.shuffle(idx_k)
            proportions = np.random.dirichlet(np.repeat(beta, n_parties))
            if balance:
                proportions = np.array([p * (len(idx_j) < N / n_parties)
                                        for p, idx_j in zip(proportions, idx_batch)])
            proportions = proportions / proportions.sum()
            proportions = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
            idx_batch = [idx_j + idx.tolist() for idx_j, idx in zip(idx_batch, np.split(idx_k, proportions))]
            min_size = min([len(idx_j) for idx_j in idx_batch])
    for j in range(n_parties):
        np.random.shuffle(idx_batch[j])
    return idx_batch


def _labels(kind: str) -> np.ndarray:
    rng = np.random.default_rng(12345)
    if kind == "balanced":            # 10 classes × 60, sorted by class
        return np.repeat(np.arange(10), 60)
    if kind == "skewed":              # 10 classes, unequal frequencies, shuffled
        return rng.choice(10, 900, p=np.linspace(1, 4, 10) / np.linspace(1, 4, 10).sum())
    if kind == "digits":              # a real label vector
        from sklearn.datasets import load_digits
        return load_digits().target.astype(np.int64)
    if kind == "gap":                 # class 3 absent: still a Dirichlet draw for it (range(K))
        y = rng.integers(0, 6, 700)
        return np.where(y == 3, 5, y)
    if kind == "two_classes":
        return rng.integers(0, 2, 400)
    raise ValueError(kind)


LABELS = {k: _labels(k) for k in ("balanced", "skewed", "digits", "gap", "two_classes")}
CASES = [  # (labels, clients): several sizes and client counts
    ("balanced", 5), ("skewed", 10), ("digits", 20), ("gap", 7), ("two_classes", 3), ("digits", 2),
]


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.5, 5.0])
@pytest.mark.parametrize("seed", [0, 1, 2024])
@pytest.mark.parametrize("kind,clients", CASES)
def test_dirichlet_equals_the_seed_procedure_index_for_index(kind: str, clients: int, seed: int,
                                                             alpha: float) -> None:
    y = LABELS[kind]
    expected = niid_bench_dirichlet(y, clients, alpha, seed)
    got = dirichlet(y, clients, alpha, seed=seed)
    assert len(got) == clients
    for part, ref in zip(got, expected):
        assert part.dtype == np.int64
        np.testing.assert_array_equal(part, np.asarray(ref, dtype=np.int64))


@pytest.mark.parametrize("seed,alpha,min_size,balance", [(3, 0.1, 5, False), (4, 0.5, 25, True),
                                                         (5, 1.0, 1, False)])
def test_dirichlet_options_follow_the_procedure(seed: int, alpha: float, min_size: int, balance: bool) -> None:
    y = LABELS["skewed"]
    expected = niid_bench_dirichlet(y, 8, alpha, seed, min_require_size=min_size, balance=balance)
    got = dirichlet(y, 8, alpha, seed=seed, min_size=min_size, balance=balance)
    assert [p.tolist() for p in got] == expected
    assert min(len(p) for p in got) >= min_size


def test_dirichlet_covers_every_index_once_and_obeys_min_size() -> None:
    y = LABELS["digits"]
    parts = dirichlet(y, 15, 0.1, seed=9, min_size=20)
    everything = np.concatenate(parts)
    assert len(everything) == len(y)
    np.testing.assert_array_equal(np.sort(everything), np.arange(len(y)))
    assert min(len(p) for p in parts) >= 20
    # small alpha really is skewed: most clients are dominated by few classes
    counts = counts_table(y, parts, 10)
    assert np.median(counts.max(1) / counts.sum(1)) > 0.4


def test_dirichlet_is_deterministic_and_seed_dependent() -> None:
    y = LABELS["balanced"]
    a = dirichlet(y, 5, 0.5, seed=1)
    b = dirichlet(y, 5, 0.5, seed=1)
    c = dirichlet(y, 5, 0.5, seed=2)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c))


def test_dirichlet_retry_limit_is_a_config_error() -> None:
    y = LABELS["two_classes"]
    with pytest.raises(ConfigError, match=r"data\.alpha.*3 passes"):
        dirichlet(y, 20, 0.01, seed=0, min_size=15, max_retries=3)


def test_dirichlet_rejects_impossible_inputs() -> None:
    y = LABELS["balanced"]
    with pytest.raises(ConfigError, match=r"data\.min_size"):
        dirichlet(y, 100, 0.5, seed=0, min_size=10)            # 100 × 10 > 600 samples
    with pytest.raises(ConfigError, match=r"data\.num_clients"):
        dirichlet(y[:5], 6, 0.5, seed=0, min_size=0)            # more clients than samples
    with pytest.raises(ConfigError, match=r"data\.num_clients"):
        dirichlet(y, 0, 0.5, seed=0)
    with pytest.raises(ConfigError, match=r"data\.alpha"):
        dirichlet(y, 5, 0.0, seed=0)


# ---------------------------------------------------------------- IID

@pytest.mark.parametrize("n,clients", [(100, 10), (1437, 10), (103, 7), (5, 5), (9, 1)])
def test_iid_covers_all_indices_once_with_near_equal_sizes(n: int, clients: int) -> None:
    parts = iid(n, clients, seed=4)
    assert len(parts) == clients
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == n
    assert all(p.dtype == np.int64 for p in parts)


def test_iid_is_a_seeded_shuffle() -> None:
    a, b, c = iid(200, 4, seed=0), iid(200, 4, seed=0), iid(200, 4, seed=1)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c))
    assert not np.array_equal(a[0], np.arange(50))             # shuffled, not consecutive blocks


def test_iid_rejects_more_clients_than_samples() -> None:
    with pytest.raises(ConfigError, match=r"data\.num_clients"):
        iid(3, 4, seed=0)
    with pytest.raises(ConfigError, match=r"data\.num_clients"):
        iid(3, 0, seed=0)


# ---------------------------------------------------------------- shards

@pytest.mark.parametrize("classes,clients,per_client,seed", [
    (10, 10, 2, 0), (10, 10, 3, 1), (10, 20, 2, 2), (10, 7, 4, 3), (5, 12, 2, 4), (10, 5, 10, 5),
    (4, 4, 3, 6), (10, 100, 1, 7),
])
def test_shards_give_each_client_its_classes_and_cover_the_samples(classes: int, clients: int,
                                                                  per_client: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.repeat(np.arange(classes), 50))
    parts = shards(y, clients, per_client, seed=seed)
    assert len(parts) == clients
    for part in parts:
        assert len(np.unique(y[part])) == per_client
    everything = np.concatenate(parts)
    np.testing.assert_array_equal(np.sort(everything), np.arange(len(y)))
    # each class is split evenly among the clients that hold it
    counts = counts_table(y, parts, classes)
    for c in range(classes):
        held = counts[:, c][counts[:, c] > 0]
        assert held.max() - held.min() <= 1


def test_shards_are_deterministic_and_seed_dependent() -> None:
    y = np.repeat(np.arange(10), 30)
    a, b, c = shards(y, 10, 2, seed=0), shards(y, 10, 2, seed=0), shards(y, 10, 2, seed=1)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c))


def test_shards_reject_bad_inputs() -> None:
    y = np.repeat(np.arange(3), 4)
    with pytest.raises(ConfigError, match=r"data\.classes_per_client"):
        shards(y, 2, 4, seed=0)
    with pytest.raises(ConfigError, match=r"data\.num_clients"):
        shards(y, 13, 1, seed=0)


# ---------------------------------------------------------------- helpers

@pytest.mark.parametrize("n,fractions,sizes", [
    (100, (0.1,), [90, 10]),
    (100, (0.1, 0.2), [70, 10, 20]),
    (7, (0.1,), [6, 1]),                 # round(0.7) = 1
    (50, (0.0, 0.0), [50, 0, 0]),
    (33, (0.16, 0.2), [21, 5, 7]),       # round(5.28) = 5, round(6.6) = 7, the rest 21
])
def test_split_fractions_sizes(n: int, fractions: tuple[float, ...], sizes: list[int]) -> None:
    indices = np.arange(1000, 1000 + n)
    parts = split_fractions(indices, fractions, seed=3)
    assert [len(p) for p in parts] == sizes
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), indices)
    assert all(np.array_equal(p, np.sort(p)) for p in parts)


def test_split_fractions_is_seeded() -> None:
    indices = np.arange(200)
    a = split_fractions(indices, (0.25,), seed=0)
    b = split_fractions(indices, (0.25,), seed=0)
    c = split_fractions(indices, (0.25,), seed=1)
    assert np.array_equal(a[1], b[1]) and not np.array_equal(a[1], c[1])
    assert not np.array_equal(a[1], np.arange(150, 200))      # random, not the tail


def test_by_group_and_counts_table() -> None:
    groups = np.array([2, 0, 2, 1, 0, 2])
    parts = by_group(groups)
    assert [p.tolist() for p in parts] == [[1, 4], [3], [0, 2, 5]]
    labels = np.array([0, 1, 1, 2, 1, 0])
    np.testing.assert_array_equal(counts_table(labels, parts, 3), [[0, 2, 0], [0, 0, 1], [2, 1, 0]])
    assert counts_table(labels, [], 3).shape == (0, 3)


def test_reference_is_not_trivially_equal_across_settings() -> None:
    """Guard for the reference itself: different alphas and seeds give different partitions."""
    y = LABELS["balanced"]
    seen = {tuple(map(len, niid_bench_dirichlet(y, 5, a, s))) for a, s in itertools.product([0.1, 5.0], [0, 1])}
    assert len(seen) == 4
