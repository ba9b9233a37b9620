"""Clients built when read (``data.clients``): what a federation knows without building a client, what it
builds when one is read, what it keeps, and Synthetic's one-client stream."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import fedlatent
from fedlatent.data import clients as C
from fedlatent.data.federation import build_federation, counts_table
from fedlatent.data.synthetic import client_stream, synthetic_client, synthetic_federation
from fedlatent.data.types import ClientData, Split
from fedlatent.experiment.runner import single

ROOT = Path(__file__).resolve().parents[1]


def _config(*sets: str):
    return fedlatent.load_config(ROOT / "configs" / "digits_fedavg.toml", list(sets))


def _client(i: int, n: int = 4) -> ClientData:
    return ClientData(Split(torch.full((n, 2), float(i)), torch.full((n,), i)))


def _eager_sizes(fed) -> list[list[int]]:
    return [[len(s) if s is not None else 0 for s in (c.train, c.val, c.test)] for c in list(fed.clients)]


def test_one_client_streams_are_the_spawned_ones() -> None:
    spawned = synthetic_federation(5, 0.5, 0.5, 30, seed=7)
    for i in (0, 3, 4):
        x, y = synthetic_client(client_stream(7, i), 0.5, 0.5, 30)
        np.testing.assert_array_equal(x, spawned[i][0])
        np.testing.assert_array_equal(y, spawned[i][1])


@pytest.mark.parametrize("sets", [
    ["data.num_clients=6", "data.val_fraction=0.1", "data.local_test_fraction=0.2", "data.holdout_clients=2"],
    ['data.partition="dirichlet"', "data.alpha=0.2", "data.num_clients=8", "data.min_size=5", "data.val_fraction=0.3"],
    ['data.dataset="synthetic"', 'data.partition="given"', "data.num_clients=7", "data.samples_per_client=33"],
])
def test_sizes_and_labels_are_known_without_building_and_equal_the_built_clients(sets, monkeypatch) -> None:
    fed, _ = single.prepare(_config(*sets))
    built: list[int] = []
    real = C._Cache.get
    monkeypatch.setattr(C._Cache, "get", lambda self, pid: built.append(pid) or real(self, pid))
    sizes = C.sizes_of(fed.clients)
    sizes_new = C.sizes_of(C.Clients(fed.new_clients.clients.cache.make, fed.new_clients.clients.partition_sizes,
                                     ids=fed.new_clients.clients.ids)) if fed.new_clients else None
    assert built == []  # counted from the partition's indices
    assert sizes.tolist() == _eager_sizes(fed)
    if sizes_new is not None:
        assert sizes_new.tolist() == [[len(s) if s is not None else 0 for s in (c.train, c.val, c.test)]
                                      for c in fed.new_clients.values()]
    table = counts_table(fed)
    assert table.tolist() == [np.bincount(c.train.y.numpy(), minlength=fed.num_classes).tolist() for c in fed.clients]
    assert table.sum() == sizes[:, 0].sum()


def test_a_domain_partitions_clients_count_their_part_as_training_and_the_domains_held_out_as_test(tmp_path) -> None:
    """A partition by domains tests each client on its domain's held-out samples, which are not cut
    from its part: the counts read without building say so (the training sizes weigh FedAvg)."""
    from tests.data.test_image_folder import _solid_tree
    _solid_tree(tmp_path / "tree", {"art": {"dog": 6, "house": 5}, "photo": {"dog": 5, "house": 6}})
    config = _config('data.dataset="domains"', 'data.partition="domains"', f'data.root="{tmp_path / "tree"}"',
                     "data.num_clients=auto", "data.test_fraction=0.3")
    fed = build_federation(config.data, config.data_seed)
    assert C.sizes_of(fed.clients).tolist() == _eager_sizes(fed)


def test_a_client_is_built_when_read_and_kept_within_the_budget(monkeypatch) -> None:
    made: list[int] = []

    def make(i: int) -> ClientData:
        made.append(i)
        return _client(i)
    one = C.nbytes(_client(0))  # 4×2 float32 + 4 int64 = 64 bytes
    assert one == 64
    clients = C.Clients(make, np.tile([4, -1, -1], (10, 1)), cache=C._Cache(make, budget=3 * one))
    assert made == [] and len(clients) == 10
    assert clients[2] is clients[2] and clients[-1] is clients[9] and made == [2, 9]
    list(clients)  # one at a time, the last three kept
    assert made == [2, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert sorted(clients.cache.kept) == [7, 8, 9] and clients.cache.held == 3 * one
    assert clients[8] is clients[8] and made[-1] == 9
    with pytest.raises(IndexError):
        clients[10]
    view = clients.subset([9, 1])
    assert [int(c.train.y[0]) for c in view] == [9, 1] and view.cache is clients.cache
    assert [int(c.train.y[0]) for c in clients[7:]] == [7, 8, 9]
    assert C.sizes_of(view).tolist() == [[4, 0, 0], [4, 0, 0]]


def test_held_out_clients_are_numbered_after_the_training_ones() -> None:
    clients = C.Clients(_client, np.tile([4, -1, 4], (5, 1)))
    new = C.Numbered(clients.subset([1, 3]), 3)
    assert list(new) == [3, 4] and len(new) == 2 and 5 not in new and 2 not in new
    assert int(new[4].train.y[0]) == 3 and dict(new.items()).keys() == {3, 4}


def test_the_joined_test_split_is_built_when_first_read() -> None:
    made: list[int] = []

    def make(i: int) -> ClientData:
        made.append(i)
        return ClientData(Split(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long)),
                          test=None if i == 1 else Split(torch.full((i + 1, 1), float(i)), torch.full((i + 1,), i)))
    joined = C.JoinedTests(C.Clients(make, np.array([[2, -1, 1], [2, -1, -1], [2, -1, 3]])))
    assert len(joined) == 4 and made == []
    assert joined.y.tolist() == [0, 2, 2, 2] and joined.x[:, 0].tolist() == [0.0, 2.0, 2.0, 2.0]
    assert made == [0, 1, 2] and joined.y is joined.y  # joined once
