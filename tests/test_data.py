"""Data: the digits federation, Synthetic(α, β), per-client arrays files, batch augmentation."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlatent.config import load_config
from fedlatent.data.augment import augment_batch, random_crop, random_flip
from fedlatent.data.federation import build_federation, counts_table
from fedlatent.data.sources import read_client_arrays
from fedlatent.data.synthetic import synthetic_client, synthetic_federation
from fedlatent.errors import ConfigError, DataError


def _federation(*overrides: str, seed: int | None = None):
    config = load_config(None, list(overrides))
    return build_federation(config.data, config.data_seed if seed is None else seed)


@pytest.fixture(scope="module")
def digits_raw() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    bunch = load_digits()
    return bunch.images.reshape(len(bunch.target), -1).astype(np.float32) / 16.0, bunch.target


def _rows(x: torch.Tensor) -> np.ndarray:
    """Samples as sorted rows (a multiset of images, order-free)."""
    flat = x.reshape(len(x), -1).numpy()
    return flat[np.lexsort(flat.T[::-1])]


# ---------------------------------------------------------------- digits

def test_digits_federation_shapes_and_sizes(digits_raw) -> None:
    fed = _federation("data.num_clients=10")
    n_total = len(digits_raw[1])                              # 1797
    n_test = math.ceil(0.2 * n_total)                         # 360
    assert fed.num_classes == 10
    assert fed.input_shape == (1, 8, 8)
    assert len(fed.clients) == 10
    assert len(fed.test) == n_test
    assert fed.test.x.shape == (n_test, 1, 8, 8) and fed.test.x.dtype == torch.float32
    assert fed.test.y.dtype == torch.int64
    sizes = [len(c.train) for c in fed.clients]
    assert sum(sizes) == n_total - n_test
    assert max(sizes) - min(sizes) <= 1                       # IID: near-equal
    for c in fed.clients:
        assert c.train.x.shape[1:] == (1, 8, 8)
        assert c.val is None and c.test is None
    # normalised with the training set's statistics
    train_x = torch.cat([c.train.x for c in fed.clients])
    assert abs(float(train_x.mean())) < 1e-4
    assert abs(float(train_x.std()) - 1.0) < 1e-2


def test_digits_test_set_is_a_fixed_stratified_20_percent(digits_raw) -> None:
    x_all, y_all = digits_raw
    runs = [_federation("data.normalize=false", f"seed={s}") for s in (0, 1, 7)]
    runs.append(_federation("data.normalize=false", "data.partition=dirichlet", "data.alpha=0.1",
                            "data.num_clients=5", seed=3))
    first = runs[0].test
    for fed in runs[1:]:                                       # the same for every run / data seed
        assert torch.equal(fed.test.x, first.x)
        assert torch.equal(fed.test.y, first.y)
    # stratified: every class keeps ~20% of its samples in the test set
    per_class_all = np.bincount(y_all, minlength=10)
    per_class_test = np.bincount(first.y.numpy(), minlength=10)
    assert np.all(np.abs(per_class_test - 0.2 * per_class_all) <= 1)
    # train ∪ test is exactly the data set, nothing shared, nothing lost
    fed = runs[0]
    train_x = torch.cat([c.train.x for c in fed.clients])
    train_y = torch.cat([c.train.y for c in fed.clients])
    both = torch.cat([train_x, first.x])
    np.testing.assert_array_equal(_rows(both), _rows(torch.from_numpy(x_all)))
    np.testing.assert_array_equal(np.bincount(torch.cat([train_y, first.y]).numpy()), per_class_all)
    # labels travel with their images: each image's label is the data set's label for it
    lookup = {row.tobytes(): label for row, label in zip(x_all, y_all)}
    for xs, ys in ((first.x, first.y), (train_x, train_y)):
        flat = xs.reshape(len(xs), -1).numpy()
        assert all(lookup[r.tobytes()] == int(l) for r, l in zip(flat, ys))


def test_digits_dirichlet_federation_uses_the_dirichlet_partition(digits_raw) -> None:
    from fedlatent.data.partition import dirichlet
    fed = _federation("data.partition=dirichlet", "data.alpha=0.3", "data.num_clients=6", seed=5)
    train_y = torch.cat([c.train.y for c in fed.clients]).numpy()
    # the pooled training labels, re-partitioned with the same seed, give the same per-client counts
    pool_y = _pool_labels(fed)
    expected = np.stack([np.bincount(pool_y[p], minlength=10) for p in dirichlet(pool_y, 6, 0.3, seed=5)])
    np.testing.assert_array_equal(counts_table(fed), expected)
    assert counts_table(fed).sum() == len(train_y)


def _pool_labels(fed) -> np.ndarray:
    """The training pool's labels in their original order (sklearn's fixed split, seed 0)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    y = load_digits().target.astype(np.int64)
    train_y, test_y = train_test_split(y, test_size=0.2, stratify=y, random_state=0)
    np.testing.assert_array_equal(test_y, fed.test.y.numpy())
    return train_y


def test_digits_client_splits() -> None:
    fed = _federation("data.num_clients=4", "data.val_fraction=0.1", "data.local_test_fraction=0.2")
    for c in fed.clients:
        n = len(c.train) + len(c.val) + len(c.test)
        assert len(c.val) == round(0.1 * n) and len(c.test) == round(0.2 * n)
    assert sum(len(c.train) + len(c.val) + len(c.test) for c in fed.clients) == 1437


def test_federation_too_many_clients_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"data\.num_clients"):
        _federation("data.num_clients=2000")


# ---------------------------------------------------------------- Synthetic(α, β)

def test_synthetic_shapes_classes_and_determinism() -> None:
    data = synthetic_federation(3, 0.5, 0.5, 400, seed=1)
    again = synthetic_federation(3, 0.5, 0.5, 400, seed=1)
    other = synthetic_federation(3, 0.5, 0.5, 400, seed=2)
    assert len(data) == 3
    for (x, y), (x2, y2) in zip(data, again):
        assert x.shape == (400, 60) and x.dtype == np.float32
        assert y.shape == (400,) and y.dtype == np.int64
        assert y.min() >= 0 and y.max() < 10
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal(y, y2)
    assert not np.array_equal(data[0][0], other[0][0])
    # clients differ from each other
    assert not np.allclose(data[0][0].mean(0), data[1][0].mean(0), atol=0.1)
    # client i's data does not depend on how many clients there are
    bigger = synthetic_federation(5, 0.5, 0.5, 400, seed=1)
    np.testing.assert_array_equal(bigger[2][0], data[2][0])


def _linearly_separable(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether some affine map x → scores has argmax = y on every sample (an LP feasibility
    problem: (w_y − w_k)·x + b_y − b_k ≥ 1 for every sample and every other class k)."""
    from scipy.optimize import linprog
    classes = np.unique(y)
    k, (n, d) = len(classes), x.shape
    col = {c: i for i, c in enumerate(classes)}
    xa = np.hstack([x, np.ones((n, 1))]).astype(np.float64)
    rows = []
    for i in range(n):
        for c in classes:
            if c == y[i]:
                continue
            row = np.zeros((k, d + 1))
            row[col[y[i]]], row[col[c]] = -xa[i], xa[i]
            rows.append(row.ravel())
    result = linprog(np.zeros(k * (d + 1)), A_ub=np.array(rows), b_ub=-np.ones(len(rows)),
                     bounds=(None, None), method="highs")
    return result.status == 0


@pytest.mark.parametrize("model", ["one_layer", "two_layer"])
def test_synthetic_covariance_and_affine_labels(model: str) -> None:
    x, y = synthetic_client(np.random.default_rng(0), 0.0, 0.0, 5000, model=model)
    # x ~ N(v, diag(j^-1.2)): per-feature variance within a client
    expected = np.arange(1, 61) ** -1.2
    np.testing.assert_allclose(x.var(0), expected, rtol=0.1)
    # y = argmax of an affine map of x: the labels are exactly linearly separable ...
    x, y = x[:300], y[:300]
    assert len(np.unique(y)) > 1
    assert _linearly_separable(x, y)
    # ... which random labels on the same points are not (the check can fail)
    assert not _linearly_separable(x, np.random.default_rng(1).permutation(y))


def test_synthetic_heterogeneity_settings_differ() -> None:
    plain = synthetic_federation(4, 0.0, 0.0, 300, seed=0)
    hetero = synthetic_federation(4, 0.5, 0.5, 300, seed=0)
    assert not np.array_equal(plain[0][0], hetero[0][0])
    assert any(not np.array_equal(a[1], b[1]) for a, b in zip(plain, hetero))
    # β moves the clients' feature means apart (B_i ~ N(0, β²) shifts every entry of v_i)
    spread = lambda data: np.std([x.mean() for x, _ in data])  # noqa: E731
    big_plain = synthetic_federation(40, 0.0, 0.0, 50, seed=3)
    big_hetero = synthetic_federation(40, 0.0, 2.0, 50, seed=3)
    assert spread(big_hetero) > 3 * spread(big_plain)


def test_synthetic_unknown_model_is_rejected() -> None:
    with pytest.raises(ValueError, match="three_layer"):
        synthetic_client(np.random.default_rng(0), 0.0, 0.0, 10, model="three_layer")


@pytest.mark.parametrize("spc,split", [(5000, (3200, 800, 1000)), (100, (64, 16, 20))])
def test_synthetic_federation_client_splits(spc: int, split: tuple[int, int, int]) -> None:
    fed = _federation("data.dataset=synthetic", "data.partition=given", "data.num_clients=2",
                      f"data.samples_per_client={spc}", "data.synthetic_alpha=0.5", "data.synthetic_beta=0.5")
    raw = synthetic_federation(2, 0.5, 0.5, spc, seed=0)
    assert fed.num_classes == 10 and fed.input_shape == (60,)
    for c, (x, y) in zip(fed.clients, raw):
        assert (len(c.train), len(c.val), len(c.test)) == split
        # consecutive train / val / test slices of the generated client, unnormalised
        np.testing.assert_array_equal(torch.cat([c.train.x, c.val.x, c.test.x]).numpy(), x)
        np.testing.assert_array_equal(torch.cat([c.train.y, c.val.y, c.test.y]).numpy(), y)
    # the global test set pools the clients' test splits
    assert len(fed.test) == 2 * split[2]
    assert torch.equal(fed.test.y, torch.cat([c.test.y for c in fed.clients]))


def test_synthetic_data_seed_is_used() -> None:
    a = _federation("data.dataset=synthetic", "data.partition=given", "data.num_clients=1",
                    "data.samples_per_client=50", "seed=4")
    b = _federation("data.dataset=synthetic", "data.partition=given", "data.num_clients=1",
                    "data.samples_per_client=50", "seed=0", "data.seed=4")
    assert torch.equal(a.clients[0].train.x, b.clients[0].train.x)
    np.testing.assert_array_equal(a.clients[0].train.x.numpy(), synthetic_federation(1, 0, 0, 50, seed=4)[0][0][:32])


# ---------------------------------------------------------------- arrays (.npz per client)

def _arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for i, (n_train, n_val, n_test) in enumerate([(20, 5, 6), (13, 4, 3)]):
        for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
            out[f"client{i}_{split}_x"] = rng.normal(size=(n, 3, 4, 4)).astype(np.float64)
            out[f"client{i}_{split}_y"] = rng.integers(0, 4, n).astype(np.int32)
    out["client1_test_y"][0] = 6                                  # largest label → 7 classes
    return out


def _npz(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    np.savez(path, **arrays)
    return path


def test_read_client_arrays_round_trip(tmp_path: Path) -> None:
    arrays = _arrays(np.random.default_rng(0))
    given = read_client_arrays(_npz(tmp_path / "fed.npz", arrays))
    assert len(given.clients) == 2
    assert given.num_classes == 7
    for i, client in enumerate(given.clients):
        for split in ("train", "val", "test"):
            x, y = client[split]
            assert x.dtype == np.float32 and y.dtype == np.int64
            np.testing.assert_allclose(x, arrays[f"client{i}_{split}_x"].astype(np.float32))
            np.testing.assert_array_equal(y, arrays[f"client{i}_{split}_y"])


def test_arrays_federation_from_config(tmp_path: Path) -> None:
    arrays = _arrays(np.random.default_rng(1))
    path = _npz(tmp_path / "fed.npz", arrays)
    fed = _federation("data.dataset=arrays", "data.partition=given", f"data.path={path}")
    assert fed.input_shape == (3, 4, 4) and fed.num_classes == 7
    assert [len(c.train) for c in fed.clients] == [20, 13]
    assert len(fed.test) == 9
    np.testing.assert_array_equal(fed.test.y.numpy(),
                                  np.concatenate([arrays["client0_test_y"], arrays["client1_test_y"]]))


def test_read_client_arrays_val_and_test_are_optional(tmp_path: Path) -> None:
    arrays = {k: v for k, v in _arrays(np.random.default_rng(2)).items() if "_val_" not in k
              and not k.startswith("client1_test")}
    given = read_client_arrays(_npz(tmp_path / "fed.npz", arrays))
    assert given.clients[0]["val"] is None and given.clients[1]["val"] is None
    assert given.clients[1]["test"] is None and given.clients[0]["test"] is not None


def _broken(arrays: dict[str, np.ndarray], change: str) -> dict[str, np.ndarray]:
    arrays = dict(arrays)
    if change == "missing_train_y":
        del arrays["client1_train_y"]
    elif change == "missing_val_y":
        del arrays["client0_val_y"]
    elif change == "lengths":
        arrays["client1_val_y"] = arrays["client1_val_y"][:-1]
    elif change == "float_labels":
        arrays["client0_test_y"] = arrays["client0_test_y"].astype(np.float32)
    elif change == "negative_labels":
        arrays["client1_train_y"] = arrays["client1_train_y"] - 10
    elif change == "stray":
        arrays["client3_val_x"] = arrays["client0_val_x"]
    elif change == "stray_name":
        arrays["client0_labels"] = arrays["client0_val_y"]
    elif change == "no_clients":
        arrays = {"x": arrays["client0_val_x"]}
    elif change == "strings":
        arrays["client0_train_x"] = np.array(["a"] * 20)
    return arrays


@pytest.mark.parametrize("change,key", [
    ("missing_train_y", "client1_train_y"), ("missing_val_y", "client0_val_y"),
    ("lengths", "client1_val_y"), ("float_labels", "client0_test_y"),
    ("negative_labels", "client1_train_y"), ("stray", "client3_val_x"), ("stray_name", "client0_labels"),
    ("no_clients", "client0_train_x"), ("strings", "client0_train_x"),
])
def test_read_client_arrays_errors_name_the_key(tmp_path: Path, change: str, key: str) -> None:
    path = _npz(tmp_path / "fed.npz", _broken(_arrays(np.random.default_rng(3)), change))
    with pytest.raises(DataError) as info:
        read_client_arrays(path)
    assert key in str(info.value)
    assert "\n" not in str(info.value)


def test_read_client_arrays_ignores_metadata_keys(tmp_path: Path) -> None:
    """The shared file carries meta_alpha, meta_beta, ...: metadata, not clients."""
    arrays = _arrays(np.random.default_rng(3))
    plain = read_client_arrays(_npz(tmp_path / "plain.npz", arrays))
    with_meta = read_client_arrays(_npz(tmp_path / "meta.npz", {**arrays, "meta_alpha": np.array(0.5),
                                                                 "meta_n_clients": np.array(2)}))
    assert len(with_meta.clients) == len(plain.clients)
    assert np.array_equal(with_meta.clients[0]["train"][0], plain.clients[0]["train"][0])


def test_read_client_arrays_missing_or_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found") as info:
        read_client_arrays(tmp_path / "absent.npz")
    assert "absent.npz" in str(info.value)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"this is not a zip archive")
    with pytest.raises(DataError, match="junk.npz"):
        read_client_arrays(junk)


# ---------------------------------------------------------------- augmentation

def _images(n: int = 64) -> torch.Tensor:
    return torch.arange(n * 3 * 6 * 5, dtype=torch.float32).reshape(n, 3, 6, 5) + 1.0   # all distinct, > 0


def test_augment_shapes_and_non_images_pass() -> None:
    x = _images()
    g = torch.Generator().manual_seed(0)
    assert random_crop(x, 4, g).shape == x.shape
    assert random_flip(x, g).shape == x.shape
    assert augment_batch(x, g).shape == x.shape
    flat = torch.randn(8, 60)
    assert augment_batch(flat, g) is flat


def test_augment_is_deterministic_for_a_seeded_generator() -> None:
    x = _images()
    a = augment_batch(x, torch.Generator().manual_seed(5))
    b = augment_batch(x, torch.Generator().manual_seed(5))
    c = augment_batch(x, torch.Generator().manual_seed(6))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert not torch.equal(a, x)


def test_flip_really_flips() -> None:
    x = _images()
    out = random_flip(x, torch.Generator().manual_seed(1))
    flipped = torch.tensor([torch.equal(o, xi.flip(-1)) for o, xi in zip(out, x)])
    kept = torch.tensor([torch.equal(o, xi) for o, xi in zip(out, x)])
    assert bool((flipped ^ kept).all())                    # each sample: exactly one of the two
    assert 10 < int(flipped.sum()) < 54                    # about half of 64 flipped
    # a flipped sample mirrors columns: first column becomes the last
    i = int(flipped.nonzero()[0])
    assert torch.equal(out[i, :, :, 0], x[i, :, :, -1])


def test_crop_with_padding_zero_is_identity() -> None:
    x = _images(16)
    assert torch.equal(random_crop(x, 0, torch.Generator().manual_seed(0)), x)


def test_crop_takes_a_window_of_the_zero_padded_image() -> None:
    x = _images(32)
    pad = 2
    out = random_crop(x, pad, torch.Generator().manual_seed(3))
    h, w = x.shape[-2:]
    offsets = []
    for o, xi in zip(out, x):
        padded = torch.zeros(3, h + 2 * pad, w + 2 * pad)
        padded[:, pad:pad + h, pad:pad + w] = xi
        matches = [(t, l) for t in range(2 * pad + 1) for l in range(2 * pad + 1)
                   if torch.equal(o, padded[:, t:t + h, l:l + w])]
        assert len(matches) == 1
        offsets.append(matches[0])
    assert len(set(offsets)) > 5                            # the offset varies per sample
