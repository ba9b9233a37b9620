"""The codec chain left every number as it was: plain, clipped and DP-FedAvg runs (fixed and adaptive
clipping, noised FFC statistics) on digits, on the simulation and vectorized backends, by the code of
commit ``BEFORE`` (the codecs as a class hierarchy) and by the code under test give the same metrics
lines (every key but the clocks), the same final evaluation and byte-identical checkpoints (global
model, server state, every client's state)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.code_before import SCRIPT_HEAD, record, runs_before_and_now

BEFORE = "a32049f"  # main before the codec chain

# one process runs every (case, backend) into OUT/<case>-<backend>, figures off
SCRIPT = SCRIPT_HEAD + """CASES = {
    "plain": [],
    "fednova": ['algorithm.name="fednova"'],
    "clip": ["privacy.clip_norm=0.3"],
    "dp": ["privacy.clip_norm=0.5", "privacy.noise_multiplier=0.8", "train.participation=0.5"],
    "dp-adaptive": ["privacy.clip_norm=0.5", "privacy.noise_multiplier=0.8", "privacy.target_quantile=0.5",
                    "privacy.clip_count_noise=1.0"],
    "dp-ffc": ['algorithm.name="spherefed"', "privacy.clip_norm=0.5", "privacy.noise_multiplier=0.8",
               "privacy.statistics_clip_norm=5.0"],
}
for case, extra in CASES.items():
    for backend in ("simulation", "vectorized"):
        config = fedlatent.load_config(None, [
            "seed=4", 'data.dataset="digits"', 'data.partition="dirichlet"', "data.alpha=0.5",
            "data.num_clients=4", "model.hidden=[16]", "train.rounds=2", "train.batch_size=16",
            "train.momentum=0.9", "train.weight_decay=0.001", "train.threads=1", f'backend="{backend}"', *extra])
        fedlatent.run(config, out / f"{case}-{backend}")
"""


@pytest.mark.slow
def test_plain_clipped_and_private_runs_give_the_numbers_of_the_code_before(tmp_path: Path) -> None:
    old_runs, new_runs = runs_before_and_now(BEFORE, SCRIPT, tmp_path)
    runs = sorted(p.name for p in old_runs.iterdir())
    assert len(runs) == 12 and runs == sorted(p.name for p in new_runs.iterdir())
    for name in runs:
        old, new = record(old_runs / name), record(new_runs / name)
        assert new[0] == old[0], name
        assert new[1] == old[1], name
        assert new[2] == old[2], name
        if name.startswith("dp"):
            assert "privacy_epsilon" in new[0][-1], name  # the private cases ran private
