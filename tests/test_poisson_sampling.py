"""Poisson client sampling (train.client_sampling = "poisson") and dp-accounting's PLD accountant
(privacy.accountant = "pld"): ε equals the PLD accountant called directly in three settings; a
round selects each client independently with probability ρ (possibly none, the model then
staying); a private run's ε in every metrics line is the direct PLD value; bad combinations exit 2."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import fedlatent
from fedlatent.federated.accounting import PoissonAccountant
from fedlatent.federated.randomness import Randomness
from tests.private_runs import small_config
from tests.test_privacy import _exits_2

dp_accounting = pytest.importorskip("dp_accounting", reason="the privacy extra (pip install 'fedlatent[privacy]')")


def _direct_pld(rate: float, sigma: float, rounds: int, delta: float, statistics_sigma: float = 0.0,
                releases: int = 0) -> float:
    """dp-accounting's PLD accountant, add-or-remove-one: the Poisson-sampled Gaussian of multiplier σ
    (sensitivity C, noise σC) composed ``rounds`` times, and the statistics' Gaussian σ_s ``releases`` times."""
    accountant = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    accountant.compose(dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), rounds)
    if releases:
        accountant.compose(dp_accounting.GaussianDpEvent(statistics_sigma), releases)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("rate, sigma, rounds, delta", [(0.1, 0.5, 10, 1e-5), (0.1, 1.1, 100, 1e-5),
                                                        (0.5, 2.0, 20, 1e-4)])
def test_pld_epsilon_equals_the_pld_accountant_called_directly(rate, sigma, rounds, delta) -> None:
    """Three settings, among them the review's (q = 0.1, σ = 0.5, 10 rounds, add-or-remove-one: 12.3 by
    PLD, 14.4 by RDP); the RDP accountant of the same Poisson event is never below PLD's."""
    pld = PoissonAccountant(rate, sigma, delta, kind="pld").epsilon(rounds)
    assert pld == pytest.approx(_direct_pld(rate, sigma, rounds, delta), rel=1e-9)
    assert PoissonAccountant(rate, sigma, delta, kind="rdp").epsilon(rounds) >= pld
    assert PoissonAccountant(rate, sigma, delta, kind="pld").epsilon(0) == 0.0
    with_statistics = PoissonAccountant(rate, sigma, delta, statistics_noise_multiplier=4.0, kind="pld")
    assert with_statistics.epsilon(rounds, 2) == pytest.approx(_direct_pld(rate, sigma, rounds, delta, 4.0, 2),
                                                               rel=1e-9)


@pytest.mark.parametrize("mode", ["seeded", "secret"])
def test_a_poisson_round_selects_each_client_independently_with_probability_rho(mode: str) -> None:
    """4000 rounds of 10 clients at ρ = 0.3: each client in about 1200 times (5 binomial standard
    deviations), the count per round's variance that of Binomial(10, 0.3) = 2.1 within 10 %, empty
    rounds about 0.7¹⁰ · 4000 ≈ 113; seeded repeats, secret differs between keys."""
    r = Randomness(mode, 0)
    rounds = [r.poisson(k, 10, 0.3) for k in range(4000)]
    counts = np.bincount([c for row in rounds for c in row], minlength=10)
    assert np.all(np.abs(counts - 1200) < 5 * math.sqrt(4000 * 0.3 * 0.7))
    sizes = np.array([len(row) for row in rounds])
    assert abs(sizes.var() / 2.1 - 1) < 0.1
    empty = int((sizes == 0).sum())
    assert abs(empty - 4000 * 0.7 ** 10) < 5 * math.sqrt(4000 * 0.7 ** 10)
    again = Randomness(mode, 0)
    assert ([again.poisson(k, 10, 0.3) for k in range(50)] == rounds[:50]) == (mode == "seeded")


def test_a_private_poisson_run_reports_the_pld_epsilon_and_survives_an_empty_round(tmp_path: Path) -> None:
    """Digits, six clients at ρ = 0.2, σ = 1, 6 rounds, PLD: the rounds select varying numbers of
    clients (one none: its model is the previous round's, its line's clients empty), and each line's
    ε is the direct PLD value after that many rounds."""
    config = small_config("train.rounds=6", "train.participation=0.2", 'train.client_sampling="poisson"',
                          "privacy.clip_norm=0.5", "privacy.noise_multiplier=1", 'privacy.accountant="pld"',
                          "privacy.delta=1e-4", 'backend="simulation"')
    summary = fedlatent.run(config, tmp_path / "run")
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    sizes = [len(x["clients"]) for x in lines]
    assert 0 in sizes and len(set(sizes)) > 1 and summary["status"] == "completed"
    for k, line in enumerate(lines, 1):
        assert line["privacy_epsilon"] == pytest.approx(_direct_pld(0.2, 1.0, k, 1e-4), rel=1e-9)


BAD = {
    "pld with fixed sampling": (['privacy.accountant="pld"', "privacy.clip_norm=1", "privacy.noise_multiplier=1"],
                                "privacy.accountant = 'pld' needs train.client_sampling = 'poisson'"),
    "poisson with adaptive clipping": (['train.client_sampling="poisson"', "privacy.clip_norm=1",
                                        "privacy.target_quantile=0.5"], "not combined with adaptive clipping"),
    "unknown sampling": (['train.client_sampling="stratified"'], "train.client_sampling"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_sampling_setting_exits_2_in_one_line_before_any_run_folder(case: str, tmp_path: Path, capsys) -> None:
    overrides, message = BAD[case]
    assert message in _exits_2(overrides, tmp_path, capsys)
