"""``data.merge_test``: the official test split joins the pool before partitioning and each client's
test split is cut from its share (SphereFed's personalisation setting). Sizes add up, every sample
sits in exactly one place, the split follows the seed, and the bad combinations are refused."""
from __future__ import annotations

import numpy as np
import pytest

from fedlatent.config import DataConfig, load_config
from fedlatent.data.federation import _from_pool, build_federation, merged
from fedlatent.data.sources import Pool
from fedlatent.errors import ConfigError, DataError


def numbered_pool(train: int = 300, test: int = 100, classes: int = 5) -> Pool:
    """Samples whose only feature is their index in the merged pool (train first, then test)."""
    ids = np.arange(train + test, dtype=np.float32).reshape(-1, 1)
    labels = np.arange(train + test) % classes
    return Pool(ids[:train], labels[:train], ids[train:], labels[train:], classes)


def ids(split) -> np.ndarray:
    return split.x.numpy().ravel().astype(np.int64)


def federation(seed: int = 0, **keys):
    cfg = DataConfig(partition="dirichlet", alpha=0.5, num_clients=4, min_size=5, normalize=False,
                     merge_test=True, local_test_fraction=0.2, **keys)
    return _from_pool(cfg, numbered_pool(), seed)


def test_every_sample_is_in_exactly_one_place_and_sizes_add_up() -> None:
    fed = federation(val_fraction=0.1)
    places = [ids(s) for c in fed.clients for s in (c.train, c.val, c.test) if s is not None]
    every = np.concatenate(places)
    assert len(every) == 400 and len(np.unique(every)) == 400  # train + official test, no repeats
    for c in fed.clients:
        n = len(c.train) + len(c.val) + len(c.test)
        assert len(c.test) == round(0.2 * n) and len(c.val) == round(0.1 * n)
    assert sorted(ids(fed.test)) == sorted(np.concatenate([ids(c.test) for c in fed.clients]))
    assert set(ids(fed.test)) & set(np.concatenate([ids(c.train) for c in fed.clients])) == set()
    labels = np.arange(400) % 5  # labels travel with their samples
    for c in fed.clients:
        assert np.array_equal(c.train.y.numpy(), labels[ids(c.train)])


def test_the_split_follows_the_seed() -> None:
    a, b, c = federation(seed=1), federation(seed=1), federation(seed=2)
    assert all(np.array_equal(ids(x.test), ids(y.test)) for x, y in zip(a.clients, b.clients))
    assert any(not np.array_equal(ids(x.test), ids(z.test)) or len(x.test) != len(z.test)
               for x, z in zip(a.clients, c.clients))


def test_without_merge_the_official_test_split_stays_global() -> None:
    cfg = DataConfig(partition="iid", num_clients=4, normalize=False, local_test_fraction=0.2)
    fed = _from_pool(cfg, numbered_pool(), 0)
    assert np.array_equal(ids(fed.test), np.arange(300, 400))
    assert max(ids(c.train).max() for c in fed.clients) < 300


def test_digits_without_official_test_skips_the_holdout() -> None:
    config = load_config(None, ["data.merge_test=true", "data.local_test_fraction=0.15", "data.num_clients=5"])
    fed = build_federation(config.data, config.data_seed)
    assert sum(len(c.train) + len(c.test) for c in fed.clients) == 1797
    assert len(fed.test) == sum(len(c.test) for c in fed.clients)


def test_bad_combinations() -> None:
    with pytest.raises(ConfigError, match="data.merge_test"):
        load_config(None, ["data.merge_test=true"])
    config = load_config(None, ['data.dataset="synthetic"', 'data.partition="given"', "data.merge_test=true",
                                "data.local_test_fraction=0.2", "data.num_clients=2", "data.samples_per_client=50"])
    with pytest.raises(DataError, match="data.merge_test"):
        build_federation(config.data, 0)
    grouped = numbered_pool()
    grouped.groups = np.zeros(300, np.int64)
    with pytest.raises(DataError, match="data.merge_test"):
        merged(grouped)
