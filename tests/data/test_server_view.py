"""The Flower server's view of the data (``federation.server_view``): the global test split, classes,
input shape and augmentation of :func:`build_federation`, without partitioning a pool or splitting
its clients (unless clients are held out: the statistics are then the training clients'); the number
of clients where the configuration fixes it."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from fedlatent.config import load_config
from fedlatent.data import federation as F
from fedlatent.data.compact import Images
from fedlatent.data.registry import PARTITIONS
from fedlatent.data.types import Split
from tests.data.test_image_folder import _random_tree, _solid_tree

DIGITS = {"dirichlet": ["data.partition='dirichlet'", "data.alpha=0.3", "data.num_clients=5", "data.augment=true"],
          "test_per_class": ["data.test_per_class=7", "data.train_per_class=30", "data.val_fraction=0.2"],
          "not_normalized": ["data.normalize=false", "data.num_clients=3"],
          "synthetic": ["data.dataset='synthetic'", "data.partition='given'", "data.num_clients=3",
                        "data.samples_per_client=60"],
          "merge_test": ["data.merge_test=true", "data.local_test_fraction=0.2", "data.num_clients=4"],
          "holdout": ["data.num_clients=6", "data.local_test_fraction=0.2", "data.holdout_clients=2"]}


def assert_same_split(a: Split | None, b: Split | None) -> None:
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    assert type(a.x) is type(b.x) and np.array_equal(a.y.numpy(), b.y.numpy())
    if isinstance(a.x, Images) and isinstance(b.x, Images):
        assert np.array_equal(a.x.data.numpy(), b.x.data.numpy()) and a.x.crop == b.x.crop
        np.testing.assert_array_equal(a.x.mean, b.x.mean)
        np.testing.assert_array_equal(a.x.std, b.x.std)
    else:
        assert np.array_equal(np.asarray(a.x), np.asarray(b.x))


def checked_view(overrides: list[str]) -> F.ServerView:
    """The view equals the federation's test split, classes, shape, augmentation and client count."""
    config = load_config(None, overrides)
    fed = F.build_federation(config.data, config.data_seed)
    view = F.server_view(config.data, config.data_seed)
    assert_same_split(view.test, fed.test)
    assert (view.num_classes, view.input_shape, view.name) == (fed.num_classes, fed.input_shape, fed.name)
    assert type(view.augment) is type(fed.augment)
    if dataclasses.is_dataclass(fed.augment):
        for f in dataclasses.fields(fed.augment):
            np.testing.assert_array_equal(getattr(view.augment, f.name), getattr(fed.augment, f.name))
    else:
        assert view.augment == fed.augment
    assert view.num_clients in (None, fed.partition_size)
    return view


def never_partitioned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every partition's builder and the clients' split raise from now on."""
    def boom(*args, **kwargs):
        raise AssertionError("the server's view partitioned the pool")
    for entry in PARTITIONS.entries():
        monkeypatch.setitem(PARTITIONS._entries, entry.name, dataclasses.replace(entry, build=boom))
    monkeypatch.setattr(F.P, "split_fractions", boom)


@pytest.mark.parametrize("name", sorted(DIGITS))
def test_the_view_is_the_federations_test_side(name: str) -> None:
    assert checked_view(DIGITS[name]).num_clients is not None


@pytest.mark.parametrize("name", ["dirichlet", "test_per_class", "not_normalized"])
def test_a_pools_view_never_partitions_it(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(None, DIGITS[name])
    expected = F.build_federation(config.data, config.data_seed)
    never_partitioned(monkeypatch)
    with pytest.raises(AssertionError, match="partitioned"):
        F.build_federation(config.data, config.data_seed)
    view = F.server_view(config.data, config.data_seed)
    assert_same_split(view.test, expected.test)
    assert view.num_clients == len(expected.clients)


def test_without_an_official_test_split_the_view_holds_the_same_hold_out(tmp_path: Path) -> None:
    _random_tree(tmp_path, {"train": {"a": 9, "b": 12, "c": 6}})
    root = f"data.root='{tmp_path}'"
    for extra in (["data.test_fraction=0.25"], ["data.test_per_class=2", "data.augment=true", "data.autoaugment='cifar10'"]):
        view = checked_view(["data.dataset='image_folder'", root, "data.num_clients=2", "model.arch='cnn'", *extra])
        assert isinstance(view.test.x, Images) and view.num_clients == 2


def test_one_client_per_domain_is_counted_by_the_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Partition 'domains' without data.num_clients: the view leaves the count to the census."""
    _solid_tree(tmp_path, {"photo": {"dog": 5, "house": 4}, "sketch": {"dog": 6, "house": 3}})
    overrides = ["data.dataset='domains'", "data.partition='domains'", f"data.root='{tmp_path}'", "data.test_per_class=2"]
    assert checked_view(overrides).num_clients is None
    never_partitioned(monkeypatch)
    config = load_config(None, [*overrides, "data.num_clients=2"])
    assert F.server_view(config.data, config.data_seed).num_clients == 2
