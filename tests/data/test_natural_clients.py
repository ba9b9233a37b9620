"""Clients of their own from a file of natural client ids: LEAF's JSON layout (``users``,
``num_samples``, ``user_data``; train/ and test/ folders) and a CSV of sample → client, on files
generated in those layouts; a run on each; malformed files exit 2 with one line naming the file and
the entry."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import fedlatent
from fedlatent.cli import main
from fedlatent.data.federation import build_federation
from fedlatent.data.natural import read_client_map, read_leaf
from fedlatent.errors import DataError
from fedlatent.experiment.runner import single


def leaf_split(rng: np.random.Generator, users: dict[str, int], width: int = 12, classes: int = 5) -> dict:
    """One LEAF JSON document (as LEAF's preprocess writes it: FEMNIST's writer ids, x rows of floats)."""
    data = {u: {"x": rng.uniform(size=(n, width)).round(4).tolist(), "y": rng.integers(0, classes, n).tolist()}
            for u, n in users.items()}
    return {"users": list(users), "num_samples": list(users.values()), "user_data": data}


def leaf_folder(root: Path, seed: int = 0) -> Path:
    """LEAF's layout: train/ and test/ of all_data_*_niid_*.json files, a user's samples split between them."""
    rng = np.random.default_rng(seed)
    for split, sizes in (("train", [{"f0001_12": 30, "f0002_07": 24}, {"f0103_41": 18}]),
                         ("test", [{"f0001_12": 6, "f0002_07": 5}, {"f0103_41": 4}])):
        (root / split).mkdir(parents=True)
        for i, users in enumerate(sizes):
            (root / split / f"all_data_{i}_niid_0_keep_0_{split}_9.json").write_text(json.dumps(leaf_split(rng, users)))
    return root


def test_leaf_users_become_clients_in_file_order_with_their_own_test_splits(tmp_path: Path) -> None:
    root = leaf_folder(tmp_path / "femnist")
    source = read_leaf(root)
    assert [len(c["train"][1]) for c in source.clients] == [30, 24, 18]
    assert [len(c["test"][1]) for c in source.clients] == [6, 5, 4]
    doc = json.loads((root / "train" / "all_data_0_niid_0_keep_0_train_9.json").read_text())
    x, y = source.clients[1]["train"]
    assert np.array_equal(x, np.asarray(doc["user_data"]["f0002_07"]["x"], np.float32))
    assert y.tolist() == doc["user_data"]["f0002_07"]["y"]
    assert source.num_classes == 1 + max(max(c[s][1]) for c in source.clients for s in ("train", "test"))
    assert read_leaf(root, classes=62).num_classes == 62  # FEMNIST's 62, whatever the labels seen


def test_a_leaf_run(tmp_path: Path) -> None:
    root = leaf_folder(tmp_path / "femnist")
    config = fedlatent.load_config(None, ['data.dataset="leaf"', f'data.path="{root}"', 'data.partition="given"',
                                          "data.classes=5", "model.hidden=[8]", "train.rounds=2", "train.threads=1"])
    summary = single.run(config, tmp_path / "run", echo=None, figures=False)
    assert summary["status"] == "completed" and len(summary["final"]["per_client"]) == 3
    counts = json.loads((tmp_path / "run" / "partition.json").read_text())["counts"]
    assert [sum(row) for row in counts] == [30, 24, 18]


def test_a_fixed_client_count_other_than_the_users_exits_2_before_the_run_folder(tmp_path: Path, capsys) -> None:
    """LEAF's 3 users are the clients: with a client held out, ``data.num_clients = 5`` is refused (not
    ignored: the held-out clients count from it), ``= 3`` holds one out of the three."""
    root = leaf_folder(tmp_path / "femnist")
    config = tmp_path / "c.toml"
    config.write_text(f'[data]\ndataset = "leaf"\npath = "{root}"\npartition = "given"\nclasses = 5\n'
                      "[model]\nhidden = [8]\n[train]\nrounds = 1\nthreads = 1\n")
    out = tmp_path / "run"
    code = main(["run", str(config), "--no-progress", "--no-figures", "--out", str(out), "--set", "data.num_clients=5",
                 "--set", "data.holdout_clients=1"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and lines == ["fedlatent: error: data.num_clients = 5: data set 'leaf' brings 3 clients of its "
                                   "own, and data.holdout_clients counts from it; set data.num_clients = 3"]
    assert not out.exists()
    assert main(["run", str(config), "--no-progress", "--no-figures", "--out", str(out), "--set", "data.num_clients=3",
                 "--set", "data.holdout_clients=1"]) == 0
    final = json.loads((out / "summary.json").read_text())["final"]
    assert final["new_clients"] == [2] and len(final["new_client_partition_ids"]) == 1


def test_a_csv_of_sample_to_client_partitions_a_pool(tmp_path: Path) -> None:
    base = ['data.dataset="digits"', "model.hidden=[8]", "train.rounds=1", "train.threads=1"]
    whole = build_federation(fedlatent.load_config(None, [*base, "data.num_clients=1"]).data, 0)
    n = len(whole.clients[0].train)  # the samples to partition
    rng = np.random.default_rng(1)
    owner = rng.choice(["alice", "bob", "carol", "dave"], n)
    csv = tmp_path / "clients.csv"
    order = rng.permutation(n)  # the file names samples in any order
    csv.write_text("sample,client\n" + "".join(f"{i},{owner[i]}\n" for i in order))
    parts = read_client_map(csv, n)
    first_seen = list(dict.fromkeys(owner[order]))
    assert [sorted(p.tolist()) for p in parts] == [sorted(np.flatnonzero(owner == c).tolist()) for c in first_seen]
    config = fedlatent.load_config(None, [*base, 'data.partition="clients_file"', f'data.clients_file="{csv}"'])
    fed = build_federation(config.data, config.data_seed)
    assert [len(c.train) for c in fed.clients] == [len(p) for p in parts]
    summary = single.run(config, tmp_path / "run", echo=None, figures=False)
    assert summary["status"] == "completed"


def _bad_leaf(tmp_path: Path, edit) -> Path:
    doc = leaf_split(np.random.default_rng(0), {"u1": 4, "u2": 3})
    edit(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    return path


LEAF_CASES = [
    (lambda d: d["user_data"].pop("u2"), "user 'u2' has no samples in user_data (a user without samples)"),
    (lambda d: d["user_data"].update(u3={"x": [[0.0] * 12], "y": [1]}),
     "user_data holds samples of user 'u3', who is not in users (a sample without a user)"),
    (lambda d: d["user_data"]["u1"]["y"].__setitem__(2, 7), "user 'u1' has label 7, out of range (0..4)"),
    (lambda d: d["user_data"]["u1"]["y"].__setitem__(0, -1), "user 'u1' has label -1, out of range"),
    (lambda d: d["num_samples"].__setitem__(0, 9), "user 'u1': num_samples says 9, user_data holds 4"),
]


@pytest.mark.parametrize("edit, message", LEAF_CASES, ids=[m[:24] for _, m in LEAF_CASES])
def test_a_malformed_leaf_file_exits_2_naming_the_file_and_entry(edit, message, tmp_path: Path, capsys) -> None:
    path = _bad_leaf(tmp_path, edit)
    out = tmp_path / "run"
    with pytest.raises(DataError) as err:
        read_leaf(path, classes=5)
    assert str(err.value) == f"{path}: {message}" or str(err.value).startswith(f"{path}: {message}")
    config = tmp_path / "c.toml"
    config.write_text(f'[data]\ndataset = "leaf"\npath = "{path}"\npartition = "given"\nclasses = 5\n'
                      "[train]\nrounds = 1\n")
    code = main(["run", str(config), "--no-progress", "--no-figures", "--out", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("fedlatent: error:"), lines
    assert str(path) in lines[0] and message in lines[0]
    assert not out.exists()


CSV_CASES = [
    ("sample,client\n0,a\n1,\n", "line 3: sample '1' has no client (a sample without a user)"),
    ("sample,client\n0,a\n", "sample 1 has no client (2 samples unnamed; a sample without a user)"),
    ("sample,client\n0,a\n1,b\n2,b\n5,c\n", "line 5: sample 5 is out of range (0..2)"),
    ("sample,client\n0,a\n0,b\n", "line 3: sample 0 is named again (first on line 2)"),
    ("id,user\n0,a\n", "the first line must be the header sample,client"),
]


@pytest.mark.parametrize("text, message", CSV_CASES, ids=[m[:24] for _, m in CSV_CASES])
def test_a_malformed_csv_names_the_file_and_entry(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "map.csv"
    path.write_text(text)
    with pytest.raises(DataError) as err:
        read_client_map(path, 3)
    assert str(err.value) == f"{path}: {message}"


def test_a_malformed_csv_in_a_run_exits_2_before_the_run_folder(tmp_path: Path, capsys) -> None:
    path = tmp_path / "map.csv"
    path.write_text("sample,client\n0,a\n")
    config = tmp_path / "c.toml"
    config.write_text(f'[data]\ndataset = "digits"\npartition = "clients_file"\nclients_file = "{path}"\n'
                      "[train]\nrounds = 1\n")
    out = tmp_path / "run"
    assert main(["run", str(config), "--no-progress", "--no-figures", "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{path}: sample 1 has no client" in lines[0]
    assert not out.exists()
