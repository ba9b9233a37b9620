"""Identities between methods, end to end on digits with the same seed: a method with its extra
ingredient switched off must give FedAvg's global weights (exactly where the arithmetic is the
same, to rounding where it is reordered), and fixed heads must stay fixed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import fedlatent
import fedlatent.experiment.runner.single as experiment
from fedlatent.backends.simulation import make_model

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "configs" / "digits_fedavg.toml"
# 3 IID clients: digits' 1437 training images split 479/479/479, so every client takes the same
# number of local steps (15 batches of ≤ 32) and the sample weights are equal. One backend for every
# run compared bit for bit (auto would pick by method at 3 clients a round)
BASE = ["data.partition=\"iid\"", "data.num_clients=3", "model.hidden=[32]", "train.rounds=3",
        "train.momentum=0.0", "train.lr=0.05", "seed=7", 'backend="vectorized"']
CLASSIFIER = ("classifier.weight", "classifier.bias")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("identities")


def _weights(out: Path) -> dict[str, torch.Tensor]:
    folder = json.loads((out / "checkpoints" / "latest.json").read_text())["folder"]
    return load_file(str(out / "checkpoints" / folder / "global.safetensors"))


_cache: dict[tuple[str, ...], tuple[dict, dict[str, torch.Tensor]]] = {}


def _run(workdir: Path, *overrides: str, base: list[str] = BASE) -> tuple[dict, dict[str, torch.Tensor]]:
    key = tuple(base) + overrides
    if key not in _cache:
        out = workdir / f"run{len(_cache)}"
        summary = fedlatent.run(fedlatent.load_config(DIGITS, [*base, *overrides]), out)
        _cache[key] = summary, _weights(out)
    return _cache[key]


def _initial(*overrides: str, base: list[str] = BASE) -> dict[str, torch.Tensor]:
    config = fedlatent.load_config(DIGITS, [*base, *overrides])
    federation, spec = experiment.prepare(config)
    return {k: v.detach().clone() for k, v in make_model(config, federation, spec).state_dict().items()}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def fedavg(workdir) -> dict[str, torch.Tensor]:
    summary, weights = _run(workdir, 'algorithm.name="fedavg"')
    assert summary["final"]["accuracy"] > 0.5  # the baseline learns, so the comparisons are not vacuous
    assert _max_diff(weights, _initial('algorithm.name="fedavg"')) > 1e-2
    return weights


@pytest.fixture(scope="module")
def fedavg_one_round(workdir) -> dict[str, torch.Tensor]:
    # MOON and SCAFFOLD train on the simulation backend: compare on the same one, bit for bit
    return _run(workdir, 'algorithm.name="fedavg"', "train.rounds=1", 'backend="simulation"')[1]


def test_fedprox_with_mu_zero_is_fedavg_exactly(workdir, fedavg) -> None:
    _, prox = _run(workdir, 'algorithm.name="fedprox"', "algorithm.mu=0.0")
    for key in fedavg:
        assert torch.equal(prox[key], fedavg[key]), key
    _, prox_on = _run(workdir, 'algorithm.name="fedprox"', "algorithm.mu=0.5")
    assert _max_diff(prox_on, fedavg) > 1e-4  # the term does act when μ > 0


def test_fedavgm_without_momentum_and_unit_lr_is_fedavg(workdir, fedavg) -> None:
    _, avgm = _run(workdir, 'algorithm.name="fedavgm"', "server.momentum=0.0", "server.lr=1.0")
    assert _max_diff(avgm, fedavg) < 1e-6
    _, avgm_on = _run(workdir, 'algorithm.name="fedavgm"', "server.momentum=0.9", "server.lr=1.0")
    assert _max_diff(avgm_on, fedavg) > 1e-3


def test_fednova_with_plain_sgd_and_equal_steps_is_fedavg(workdir, fedavg) -> None:
    summary, nova = _run(workdir, 'algorithm.name="fednova"')
    assert _max_diff(nova, fedavg) < 1e-5


def test_fednova_differs_from_fedavg_when_step_counts_differ(workdir) -> None:
    """The control for the identity above: Dirichlet clients of unequal size take unequal steps."""
    skewed = ['data.partition="dirichlet"', "data.alpha=0.3", "train.rounds=1"]
    _, avg = _run(workdir, 'algorithm.name="fedavg"', *skewed)
    _, nova = _run(workdir, 'algorithm.name="fednova"', *skewed)
    assert _max_diff(nova, avg) > 1e-4


def test_moon_and_scaffold_first_round_is_fedavg_exactly(workdir, fedavg_one_round) -> None:
    """Round 1: MOON has no previous local model (term skipped), SCAFFOLD's controls are all zero."""
    for name in ("moon", "scaffold"):
        _, weights = _run(workdir, f'algorithm.name="{name}"', "train.rounds=1", 'backend="simulation"')
        for key in fedavg_one_round:
            assert torch.equal(weights[key], fedavg_one_round[key]), (name, key)
    # in lockstep too: SCAFFOLD's zero correction leaves FedAvg's weights bit for bit
    lockstep = ["train.rounds=1", 'backend="vectorized"']
    _, scaffold = _run(workdir, 'algorithm.name="scaffold"', *lockstep)
    _, fedavg = _run(workdir, 'algorithm.name="fedavg"', *lockstep)
    assert all(torch.equal(scaffold[k], fedavg[k]) for k in fedavg)


def test_feddyn_with_vanishing_alpha(workdir, fedavg_one_round) -> None:
    """α → 0 removes FedDyn's client-side terms, but not its server state: with every client in the
    round, θ_1 = mean θ_k + mean λ_k = avg + (avg − θ_0) = 2·avg − θ_0 (Acar et al. 2021, Alg. 1,
    h/α accumulated; the release's cld_mdl_param). So FedDyn does *not* reduce to FedAvg as α → 0;
    its clients do."""
    theta0 = _initial('algorithm.name="feddyn"')
    _, dyn = _run(workdir, 'algorithm.name="feddyn"', "algorithm.alpha=1e-8", "train.rounds=1")
    extrapolated = {k: 2 * fedavg_one_round[k] - theta0[k] for k in theta0}
    assert _max_diff(dyn, extrapolated) < 1e-5
    assert _max_diff(dyn, fedavg_one_round) > 1e-3


def _orthonormal_rows(w: torch.Tensor, tol: float = 1e-5) -> bool:
    w = w.double()
    return bool(torch.allclose(w @ w.T, torch.eye(w.shape[0], dtype=torch.float64), atol=tol))


@pytest.mark.parametrize("init", ["default", "orthogonal"])
def test_freeze_keeps_the_initial_classifier_bit_for_bit(workdir, init) -> None:
    overrides = ('algorithm.name="freeze"', f'algorithm.init="{init}"')
    initial = _initial(*overrides)
    summary, trained = _run(workdir, *overrides)
    for key in CLASSIFIER:
        assert torch.equal(trained[key], initial[key]), key
    assert float((trained["layers.0.0.weight"] - initial["layers.0.0.weight"]).abs().max()) > 1e-3
    assert summary["final"]["accuracy"] > 0.3
    assert _orthonormal_rows(initial["classifier.weight"]) == (init == "orthogonal")


def test_spherefed_head_is_fixed_orthonormal_without_bias(workdir) -> None:
    initial = _initial('algorithm.name="spherefed"')
    _, trained = _run(workdir, 'algorithm.name="spherefed"')
    w = initial["classifier.weight"]
    assert w.shape == (10, 32) and _orthonormal_rows(w)
    assert not torch.any(initial["classifier.bias"])
    for key in CLASSIFIER:  # the global model's head after training (before FFC) is still the initial one
        assert torch.equal(trained[key], initial[key]), key
    assert float((trained["layers.0.0.weight"] - initial["layers.0.0.weight"]).abs().max()) > 1e-3


def test_spherefed_ffc_does_not_hurt_under_label_skew(workdir) -> None:
    skewed = ['algorithm.name="spherefed"', 'data.partition="dirichlet"', "data.alpha=0.05",
              "data.num_clients=10", "train.rounds=3", "train.momentum=0.9"]
    summary, _ = _run(workdir, *skewed, base=["model.hidden=[32]", "seed=7"])
    final = summary["final"]
    assert final["accuracy"] >= final["uncalibrated_accuracy"]
    assert final["accuracy"] > 0.7  # FFC: the least-squares head on the pooled features (0.84 here)
