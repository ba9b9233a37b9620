"""The client programs left Ditto's and FedRep's numbers as they were: the same runs on digits, on the
simulation and vectorized backends, by the code of commit ``BEFORE`` (the last before the programs,
taken out of this repository's history) and by the code under test give the same metrics lines
(every key but the clocks), the same final evaluation and byte-identical checkpoints (global model,
server state, every client's state)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.code_before import SCRIPT_HEAD, record, runs_before_and_now

ROOT = Path(__file__).resolve().parents[2]
BEFORE = "da1d3a6"  # main before the client programs (the methods' kind strings)

# one process runs every (method, backend) into OUT/<method>-<backend>, figures off
SCRIPT = SCRIPT_HEAD + """for name in ("ditto", "fedrep"):
    for backend in ("simulation", "vectorized"):
        config = fedlatent.load_config(None, [
            "seed=4", 'data.dataset="digits"', 'data.partition="dirichlet"', "data.alpha=0.5",
            "data.num_clients=4", "data.local_test_fraction=0.2", "model.hidden=[16]", "train.rounds=2",
            "train.batch_size=16", "train.momentum=0.9", "train.weight_decay=0.001", "train.threads=1",
            f'algorithm.name="{name}"', f'backend="{backend}"',
            *(["algorithm.head_epochs=2"] if name == "fedrep" else [])])
        fedlatent.run(config, out / f"{name}-{backend}")
"""


@pytest.mark.long  # two checkouts' runs: two minutes; tests/methods/test_ditto.py and test_personal_layers.py pin the numbers in CI
def test_ditto_and_fedrep_give_the_numbers_of_the_code_before(tmp_path: Path) -> None:
    old_runs, new_runs = runs_before_and_now(BEFORE, SCRIPT, tmp_path)
    runs = sorted(p.name for p in old_runs.iterdir())
    assert runs == ["ditto-simulation", "ditto-vectorized", "fedrep-simulation", "fedrep-vectorized"]
    for name in runs:
        old, new = record(old_runs / name), record(new_runs / name)
        assert new[0] == old[0], name
        assert new[1] == old[1], name
        assert new[2] == old[2], name
