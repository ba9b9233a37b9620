"""Device placement left the CPU's numbers as they were: runs on digits of FedAvg, MOON, FedUV,
FedProto, FedAvg with AdamW (its state kept), sample-level DP-SGD (Poisson batches, noise), crop +
flip with AutoAugment, and MOON with the step trace, on the simulation and vectorized backends, by
the code of commit ``BEFORE`` (the last before the losses, terms and Adam's counts moved to the
training device) and by the code under test, give the same metrics lines and final evaluation
(every key but the clocks), the same step trace and byte-identical checkpoints."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.code_before import SCRIPT_HEAD, record, runs_before_and_now

BEFORE = "a32049f"  # main before device placement

RUNS = {  # name → overrides beyond the common ones
    "fedavg": ['algorithm.name="fedavg"'],
    "moon": ['algorithm.name="moon"'],
    "feduv": ['algorithm.name="feduv"'],
    "fedproto": ['algorithm.name="fedproto"'],
    "adamw": ['algorithm.name="fedavg"', "train.optimizer=adamw", "train.lr=0.003", "train.optimizer_state=kept",
              "train.rounds=3"],
    "dp_sgd": ['algorithm.name="fedavg"', "privacy.sample_clip_norm=1.0", "privacy.sample_noise_multiplier=1.0",
               'privacy.batch_sampling="poisson"', "privacy.delta=1e-5"],
    "autoaugment": ['algorithm.name="fedavg"', "data.augment=true", 'data.autoaugment="cifar10"'],
    "trace": ['algorithm.name="moon"', "diagnostics.trace_terms=true"],
}

# one process runs every (run, backend) into OUT/<run>-<backend>, figures off
SCRIPT = SCRIPT_HEAD + """RUNS = %r
for name, extra in RUNS.items():
    for backend in ("simulation", "vectorized"):
        if name == "trace" and backend == "vectorized":
            continue  # the step trace is the simulation backend's
        config = fedlatent.load_config(None, [
            "seed=4", 'data.dataset="digits"', 'data.partition="dirichlet"', "data.alpha=0.5",
            "data.num_clients=4", "model.hidden=[16]", "train.rounds=2", "train.batch_size=16",
            "train.momentum=0.9", "train.weight_decay=0.001", "train.threads=1", f'backend="{backend}"', *extra])
        fedlatent.run(config, out / f"{name}-{backend}")
""" % RUNS


def _record(run: Path) -> tuple[list[dict], dict, dict, str]:
    """:func:`tests.code_before.record` and the run's step trace (empty without one)."""
    trace = run / "terms_trace.jsonl"
    return (*record(run), trace.read_text() if trace.exists() else "")


@pytest.mark.slow
def test_the_cpus_numbers_are_those_of_the_code_before(tmp_path: Path) -> None:
    old_runs, new_runs = runs_before_and_now(BEFORE, SCRIPT, tmp_path)
    runs = sorted(p.name for p in old_runs.iterdir())
    assert len(runs) == 2 * len(RUNS) - 1
    assert (new_runs / "trace-simulation" / "terms_trace.jsonl").exists()
    for name in runs:
        old, new = _record(old_runs / name), _record(new_runs / name)
        for got, want in zip(new, old):
            assert got == want, name
