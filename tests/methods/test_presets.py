"""Every preset (the Ditto family, FedRep, LG-FedAvg and FedPer have their own tests: their global
model is not what they train) runs from a configuration and learns, on
digits under strong label skew and on Synthetic(0.5, 0.5). Thresholds are far above chance and,
for Synthetic, above the majority-class baseline of its (nearly one-class-per-client) test set."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import fedlatent
import fedlatent.experiment.runner.single as experiment
from fedlatent.methods import PRESETS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "configs" / "digits_fedavg.toml"  # lr 0.05, momentum 0.9, batch 32, MLP [128]
NAMES = sorted(n for n in PRESETS if not n.startswith("ditto") and n not in ("fedrep", "lg_fedavg", "fedper"))
ON_DIGITS = ['data.partition="dirichlet"', "data.alpha=0.1", "data.num_clients=10", "train.rounds=5"]
ON_SYNTHETIC = ['data.dataset="synthetic"', 'data.partition="given"', "data.samples_per_client=500",
                "data.num_clients=4", "data.synthetic_alpha=0.5", "data.synthetic_beta=0.5",
                "model.hidden=[20]", "train.rounds=5"]
DIGITS_MIN = 0.5  # chance is 0.1; FedAvg reaches ~0.8 here
# pFedMe and Per-FedAvg take their papers' plain SGD step (refused otherwise); Per-FedAvg at the
# release's β = 0.001 barely moves in 5 rounds, so here its β is the run's 0.05
PLAIN = {"pfedme": ["train.momentum=0", "train.weight_decay=0"],
         "perfedavg": ["train.momentum=0", "train.weight_decay=0", "algorithm.beta=0.05"]}
# FedAdagrad with the default server lr (−1 → 0.01): its first step is ~0.1·η per coordinate (m = 0.1Δ,
# √v ≈ |Δ|), ten times smaller than FedAdam's, so in 5 rounds it barely leaves the initial model
# (digits 0.23, synthetic 0.16). Reddi et al. 2021 tune FedAdagrad's η higher; with server.lr = 0.1
# it learns (test below). A finding about the default, kept visible here.


@pytest.fixture(scope="module")
def synthetic_majority() -> float:
    """Accuracy of always predicting the test set's most frequent class."""
    federation, _ = experiment.prepare(fedlatent.load_config(DIGITS, ON_SYNTHETIC))
    counts = np.bincount(federation.test.y.numpy(), minlength=federation.num_classes)
    return float(counts.max() / counts.sum())


def _run(tmp_path: Path, overrides: list[str]) -> dict:
    summary = fedlatent.run(fedlatent.load_config(DIGITS, overrides), tmp_path / "run")
    assert summary["rounds_completed"] == 5
    final = summary["final"]
    assert np.isfinite(final["loss"])
    return final


@pytest.mark.parametrize("name", NAMES)
def test_preset_learns_on_skewed_digits(name: str, tmp_path) -> None:
    final = _run(tmp_path, ON_DIGITS + [f'algorithm.name="{name}"', *PLAIN.get(name, [])])
    assert final["accuracy"] > DIGITS_MIN, final
    assert final["balanced_accuracy"] > DIGITS_MIN - 0.05, final


@pytest.mark.parametrize("name", NAMES)
def test_preset_learns_on_synthetic(name: str, tmp_path, synthetic_majority) -> None:
    final = _run(tmp_path, ON_SYNTHETIC + [f'algorithm.name="{name}"', *PLAIN.get(name, [])])
    assert final["accuracy"] > max(0.2, synthetic_majority + 0.15), (final, synthetic_majority)


@pytest.mark.parametrize("overrides", [ON_DIGITS, ON_SYNTHETIC], ids=["digits", "synthetic"])
def test_fedadagrad_learns_with_a_larger_server_lr(overrides, tmp_path, synthetic_majority) -> None:
    final = _run(tmp_path, overrides + ['algorithm.name="fedadagrad"', "server.lr=0.1"])
    floor = DIGITS_MIN if overrides is ON_DIGITS else max(0.2, synthetic_majority + 0.15)
    assert final["accuracy"] > floor, final


def test_the_preset_list_is_what_this_file_covers() -> None:
    """A new preset is picked up automatically; this pins the ones known when the file was written."""
    assert {"fedavg", "fedprox", "moon", "scaffold", "feddyn", "fednova", "fedavgm", "fedadam", "fedadagrad",
            "fedyogi", "fedproto", "freeze", "feduv", "feddecorr", "spherefed", "ccvr"} <= set(NAMES)
