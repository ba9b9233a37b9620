"""Clients built when read (``data.clients.Clients``) are, to the byte, the clients the eager build of
the commit before made: every split's samples and labels, their dtypes and order, the global test
split and the partition table, for pools (iid, Dirichlet with held-out clients, shards, a
standardised pool, every sample partitioned) and for data sets with their own clients (Synthetic, an .npz of client arrays)."""
from __future__ import annotations

import json
from pathlib import Path

from tests.code_before import SCRIPT_HEAD, runs_before_and_now

BASE = "3e62dbc"  # the last commit that built every client up front

SCRIPT = SCRIPT_HEAD + """
import hashlib, json
import numpy as np
import fedlatent
from fedlatent.data.federation import counts_table
from fedlatent.data.compact import Images

np.random.seed(0)
arrays = {}
for i, (a, b, c) in enumerate([(20, 5, 6), (13, 0, 3), (9, 4, 0)]):
    for split, n in (("train", a), ("val", b), ("test", c)):
        if n:
            arrays[f"client{i}_{split}_x"] = np.random.rand(n, 7).astype(np.float32)
            arrays[f"client{i}_{split}_y"] = np.random.randint(0, 4, n)
np.savez(out / "clients.npz", **arrays)
digits = ["data.num_clients=6", "data.val_fraction=0.1", "data.local_test_fraction=0.2"]
CASES = {
    "iid": digits,
    "dirichlet_holdout": [*digits, 'data.partition="dirichlet"', "data.alpha=0.3", "data.min_size=5",
                          "data.holdout_clients=2"],
    "shards": [*digits, 'data.partition="shards"', "data.classes_per_client=3", "data.normalize=false"],
    "train_per_class": [*digits, "data.train_per_class=30", "data.test_per_class=10"],
    "merge_test": [*digits, "data.merge_test=true"],  # every sample standardises
    "synthetic": ['data.dataset="synthetic"', 'data.partition="given"', "data.num_clients=5",
                  "data.samples_per_client=50", "data.holdout_clients=1"],
    "arrays": ['data.dataset="arrays"', 'data.partition="given"', f'data.path="{out / "clients.npz"}"'],
}


def digest(split):
    if split is None:
        return None
    x = split.x.data if isinstance(split.x, Images) else split.x
    return [len(split), str(x.dtype), str(split.y.dtype),
            hashlib.sha256(x.contiguous().numpy().tobytes() + split.y.numpy().tobytes()).hexdigest(),
            hashlib.sha256(split.x[:].contiguous().numpy().tobytes()).hexdigest()]


record = {}
for name, sets in CASES.items():
    config = fedlatent.load_config(Path("%s") / "configs" / "digits_fedavg.toml", sets)
    fed, _ = single.prepare(config)
    clients = [[digest(getattr(c, s)) for s in ("train", "val", "test")] for c in fed.clients]
    new = {str(k): [digest(getattr(c, s)) for s in ("train", "val", "test")] for k, c in fed.new_clients.items()}
    record[name] = {"clients": clients, "new": new, "test": digest(fed.test), "counts": counts_table(fed).tolist(),
                    "shape": list(fed.input_shape), "classes": fed.num_classes, "of_clients": fed.test_of_clients}
(out / "record.json").write_text(json.dumps(record))
"""


def test_clients_built_when_read_are_the_eager_builds_to_the_byte(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    before, now = runs_before_and_now(BASE, SCRIPT % root, tmp_path)
    old, new = (json.loads((folder / "record.json").read_text()) for folder in (before, now))
    assert old.keys() == new.keys()
    for name in old:
        assert new[name] == old[name], name
    assert len(new["dirichlet_holdout"]["new"]) == 2 and new["synthetic"]["of_clients"] and new["merge_test"]["of_clients"]
