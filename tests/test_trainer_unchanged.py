"""The client trainer as a package (``federated/trainer/``, in place of ``federated/lockstep.py``) left
every number as it was: the same runs on digits — sixteen configurations over the methods (FedAvg,
FedProx, SCAFFOLD, FedDyn, MOON, FedUV, FedDecorr, SphereFed + FFC, Ditto + MK-MMD, FedRep, APFL,
pFedMe), the optimisers, the precisions (bf16, fp16 with its loss scale), the privacy settings
(client-level DP-FedAvg, sample-level DP-SGD with Poisson batches) and the backends (simulation,
vectorized, two cells stacked) — by the code of commit ``BEFORE`` and by the code under test give
the same metrics lines (every key but the clocks), the same final evaluation and byte-identical
checkpoints (global model, server state, every client's state)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.code_before import SCRIPT_HEAD, record, runs_before_and_now

BEFORE = "a32049f"  # main before the trainer package

# each configuration: its name, then its keys on top of the common ones
SCRIPT = SCRIPT_HEAD + """from fedlatent.experiment.studies.stacking import run_stack
COMMON = ["seed=3", 'data.dataset="digits"', 'data.partition="dirichlet"', "data.alpha=0.5", "data.num_clients=4",
          "data.local_test_fraction=0.2", "model.hidden=[16]", "train.rounds=2", "train.batch_size=32",
          "train.threads=1", 'train.precision="fp32"']
RUNS = {
    "fedavg-sim": ['algorithm.name="fedavg"', 'backend="simulation"', "train.momentum=0.9"],
    "fedavg-vec-bf16": ['algorithm.name="fedavg"', 'backend="vectorized"', 'train.precision="bf16"'],
    "fedprox-vec-fp16": ['algorithm.name="fedprox"', 'backend="vectorized"', 'train.precision="fp16"'],
    "fedprox-sim-fp16": ['algorithm.name="fedprox"', 'backend="simulation"', 'train.precision="fp16"'],
    "scaffold-vec-kept": ['algorithm.name="scaffold"', 'backend="vectorized"', "train.momentum=0.9",
                          'train.optimizer_state="kept"'],
    "feddyn-sim-adam": ['algorithm.name="feddyn"', 'backend="simulation"', 'train.optimizer="adam"', "train.lr=0.01"],
    "moon-vec": ['algorithm.name="moon"', 'backend="vectorized"'],
    "feduv-sim": ['algorithm.name="feduv"', 'backend="simulation"'],
    "feddecorr-vec-adamw": ['algorithm.name="feddecorr"', 'backend="vectorized"', 'train.optimizer="adamw"',
                            "train.lr=0.01", "train.weight_decay=0.01"],
    "spherefed-sim": ['algorithm.name="spherefed"', 'backend="simulation"'],
    "ditto_mkmmd-vec": ['algorithm.name="ditto_mkmmd"', 'backend="vectorized"', "algorithm.beta_every=2",
                        "algorithm.beta_batches=2"],
    "ditto_mkmmd-sim": ['algorithm.name="ditto_mkmmd"', 'backend="simulation"', "algorithm.beta_every=2",
                        "algorithm.beta_batches=2"],
    "fedrep-vec": ['algorithm.name="fedrep"', 'backend="vectorized"', "algorithm.head_epochs=2"],
    "apfl-vec": ['algorithm.name="apfl"', 'backend="vectorized"'],
    "pfedme-sim": ['algorithm.name="pfedme"', 'backend="simulation"'],
    "fedavg-vec-dp": ['algorithm.name="fedavg"', 'backend="vectorized"', "privacy.clip_norm=1.0",
                      "privacy.noise_multiplier=0.5", "privacy.delta=0.01"],
    "fedprox-sim-dpsgd": ['algorithm.name="fedprox"', 'backend="simulation"', "privacy.sample_clip_norm=1.0",
                          "privacy.sample_noise_multiplier=0.8", 'privacy.batch_sampling="poisson"',
                          "privacy.delta=0.01"],
    "ditto-vec-dpsgd": ['algorithm.name="ditto"', 'backend="vectorized"', "privacy.sample_clip_norm=1.0",
                        "privacy.sample_noise_multiplier=0.8", 'privacy.batch_sampling="poisson"',
                        "privacy.delta=0.01"],
}
for name, keys in RUNS.items():
    fedlatent.run(fedlatent.load_config(None, [*COMMON, *keys]), out / name)
stacked = [fedlatent.load_config(None, [*COMMON, 'algorithm.name="fedprox"', 'backend="vectorized"', f"seed={seed}"])
           for seed in (5, 6)]
assert run_stack(stacked, [str(out / "stacked-5"), str(out / "stacked-6")], figures=False) == ["", ""]
"""


@pytest.mark.slow
def test_the_trainer_package_gives_the_numbers_of_the_code_before(tmp_path: Path) -> None:
    old_runs, new_runs = runs_before_and_now(BEFORE, SCRIPT, tmp_path)
    runs = sorted(p.name for p in old_runs.iterdir())
    assert len(runs) == 20 and runs == sorted(p.name for p in new_runs.iterdir())
    for name in runs:
        old, new = record(old_runs / name), record(new_runs / name)
        assert len(old[0]) == 2 and old[2], name  # two rounds, a checkpoint with tensors
        assert new[0] == old[0], name
        assert new[1] == old[1], name
        assert new[2] == old[2], name
