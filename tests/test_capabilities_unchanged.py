"""The calibrations registry, ``methods/spec.py`` and the accountant moved to the run driver left the
numbers as they were: runs on digits by the code of commit ``BEFORE`` (main before them, taken out of
this repository's history) and by the code under test give the same metrics lines (every key but the
clocks), the same final evaluation and byte-identical checkpoints — FFC after training and every
round, FFC per client, CCVR, the centralised calibration, CCVR with bounded statistics (the sums'
path), sample-level DP-SGD with its ε, on the simulation and vectorized backends."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.code_before import SCRIPT_HEAD, record, runs_before_and_now

BEFORE = "a32049f"  # main before the calibrations registry, methods/spec.py and the backends' capabilities

RUNS = {
    "ffc": ['algorithm.name="spherefed"'],
    "ffc-every-round": ['algorithm.name="spherefed"', "algorithm.ffc_every=1"],
    "ffc-personal": ['algorithm.name="spherefed"', "algorithm.calibration_personal=true"],
    "ccvr": ['algorithm.name="ccvr"'],
    "centralized": ['algorithm.calibration="centralized"'],
    "ccvr-sums": ['algorithm.name="ccvr"', "privacy.statistics_clip_norm=1e9"],
    "dp-sgd": ["privacy.sample_clip_norm=0.5", "privacy.sample_noise_multiplier=1.0",
               'privacy.batch_sampling="poisson"'],
}

SCRIPT = SCRIPT_HEAD + """RUNS = %r
for name, extra in RUNS.items():
    for backend in ("simulation", "vectorized"):
        config = fedlatent.load_config(None, [
            "seed=3", 'data.dataset="digits"', 'data.partition="dirichlet"', "data.alpha=0.5",
            "data.num_clients=4", "data.local_test_fraction=0.2", "model.hidden=[16]", "train.rounds=2",
            "train.batch_size=16", "train.threads=1", f'backend="{backend}"', *extra])
        fedlatent.run(config, out / f"{name}-{backend}")
""" % (RUNS,)


@pytest.mark.slow
def test_calibrations_and_dp_sgd_give_the_numbers_of_the_code_before(tmp_path: Path) -> None:
    old_runs, new_runs = runs_before_and_now(BEFORE, SCRIPT, tmp_path)
    runs = sorted(p.name for p in old_runs.iterdir())
    assert runs == sorted(f"{name}-{backend}" for name in RUNS for backend in ("simulation", "vectorized"))
    for name in runs:
        old, new = record(old_runs / name), record(new_runs / name)
        assert new[0] == old[0], name
        assert new[1] == old[1], name
        assert new[2] == old[2], name
    assert "sample_level_epsilon" in record(new_runs / "dp-sgd-simulation")[0][-1]
