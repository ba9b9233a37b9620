"""Adaptive clipping (``federated.adaptive_clipping``; Andrew et al. 2021, Algorithm 1 with the
geometric update): the update rule and the noise split of Theorem 1 against hand-computed values,
the accountant given σ (checked against dp-accounting composing the two releases itself), the
clients' bits and bounds by construction, the count's noise by its spread over many draws, the clip
norm in every metrics line and through a checkpoint and resume, the backends agreeing, and the bad
settings refused in one line before any run folder exists."""
from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.federated.adaptive_clipping import (CLIP_NORM, CODEC, UNCLIPPED, AdaptiveClipping, next_clip_norm,
                                                   update_noise_multiplier)
from fedlatent.federated.codec import ClipCodec, GaussianCodec, update_norm, server_codec
from fedlatent.federated.trainer import lockstep_update
from fedlatent.federated.round import close_round, plan_round, sample_clients
from fedlatent.methods.parts import Upload
from tests.private_runs import TRAINERS
from tests.private_runs import set_up as _setup
from tests.private_runs import small_config as _config
from tests.stacked_runs import run_on_each_backend, run_stacked
from tests.test_privacy import _exits_2

dp_accounting = pytest.importorskip("dp_accounting", reason="the privacy extra (pip install 'fedlatent[privacy]')")

# the digits clients' first updates have norms about 1.8: C₀ = 0.5 clips them all, so C grows
ADAPTIVE = ["privacy.clip_norm=0.5", "privacy.target_quantile=0.5", "privacy.clip_learning_rate=0.2"]
PRIVATE = [*ADAPTIVE, "privacy.noise_multiplier=0.8", "privacy.clip_count_noise=1.0", "privacy.delta=1e-4"]




def _clipping(**overrides) -> AdaptiveClipping:
    values = dict(initial=1.0, target_quantile=0.5, learning_rate=0.2, count_noise=0.0, per_round=4, seed=3)
    return AdaptiveClipping(**{**values, **overrides})


def _with_bits(bits: list[float]) -> list[Upload]:
    return [Upload(i, {}, 1, 1, 0.1, 0.0, extras={CODEC: {UNCLIPPED: torch.tensor(b, dtype=torch.float64)}})
            for i, b in enumerate(bits)]


# the rule and the noise split ------------------------------------------------------------------
def test_the_geometric_update_by_hand() -> None:
    """C · exp(−η (b̄ − γ)), b̄ = (Σb + noise) / m: 3 of 4 within C at γ = 0.5 shrink C by e^(−0.05);
    1 of 4 grow it by e^(0.05); b̄ = γ leaves it; the noise counts as bits."""
    assert next_clip_norm(2.0, 3, 4, 0.5, 0.2, 0.0) == pytest.approx(2.0 * math.exp(-0.05), rel=1e-15)
    assert next_clip_norm(2.0, 1, 4, 0.5, 0.2, 0.0) == pytest.approx(2.0 * math.exp(0.05), rel=1e-15)
    assert next_clip_norm(2.0, 2, 4, 0.5, 0.2, 0.0) == 2.0
    assert next_clip_norm(2.0, 1, 4, 0.5, 0.2, 2.0) == pytest.approx(2.0 * math.exp(-0.05), rel=1e-15)


@pytest.mark.parametrize("sigma, count_noise", [(1.0, 5.0), (0.8, 1.0), (2.0, 1.01)])
def test_the_update_noise_spends_sigma_with_the_count_s(sigma: float, count_noise: float) -> None:
    """Theorem 1: σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2), so that (σ_Δ⁻² + (2σ_b)⁻²)^(−1/2) = σ; σ_Δ > σ."""
    got = update_noise_multiplier(sigma, count_noise)
    assert got == pytest.approx(1 / math.sqrt(1 / sigma**2 - 1 / (2 * count_noise) ** 2), rel=1e-15)
    assert (got ** -2 + (2 * count_noise) ** -2) ** -0.5 == pytest.approx(sigma, rel=1e-12)
    assert got > sigma
    assert update_noise_multiplier(0.0, 0.0) == 0.0


@pytest.mark.parametrize("count_noise", [0.0, 0.4, 0.5])
def test_a_count_noise_at_or_below_half_sigma_is_refused(count_noise: float) -> None:
    with pytest.raises(ValueError, match="count noise"):
        update_noise_multiplier(1.0, count_noise)


@pytest.mark.parametrize("num_clients, per_round", [(6, 3), (6, 6), (100, 10)])
def test_the_accountant_is_given_sigma_which_equals_both_releases_composed(num_clients: int, per_round: int) -> None:
    """The server's accountant is given σ, its updates' noise is σ_Δ; dp-accounting composing the
    update's Gaussian (σ_Δ/2: replace-one sensitivity 2C) and the count's (σ_b: sensitivity 1)
    inside the round's sampling itself gives the same ε (the smaller of the amplified bound and the
    worst client's plain composition, both computed here)."""
    sigma, count_noise, rounds, delta = 0.8, 1.0, 4, 1e-4
    config = _config(*PRIVATE)
    codec = server_codec(config.privacy, 0, num_clients, per_round)
    assert isinstance(codec, GaussianCodec)
    assert codec.noise_multiplier == update_noise_multiplier(sigma, count_noise)
    inner = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(codec.noise_multiplier / 2),
                                           dp_accounting.GaussianDpEvent(count_noise)])
    event = inner if per_round == num_clients else \
        dp_accounting.SampledWithoutReplacementDpEvent(num_clients, per_round, inner)
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
    # the smaller of that and the round composed, unamplified, over the most-selected client's rounds
    most = max(Counter(c for r in range(rounds)
                       for c in sample_clients(0, r, num_clients, per_round / num_clients)).values())
    plain = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    plain.compose(dp_accounting.SelfComposedDpEvent(inner, most))
    expected = min(accountant.get_epsilon(delta), plain.get_epsilon(delta))
    assert codec.epsilon(rounds) == pytest.approx(expected, rel=1e-9)


# the server's state and the count's noise -----------------------------------------------------
def test_the_server_moves_c_from_the_bits_and_keeps_it_in_its_state() -> None:
    clipping, state = _clipping(), {}
    assert clipping.current(state) == 1.0
    assert torch.equal(clipping.payload(state)[CLIP_NORM], torch.tensor(1.0, dtype=torch.float64))
    clipping.update(0, _with_bits([1, 1, 1, 0]), state)
    assert state[CLIP_NORM].dtype == torch.float64
    assert clipping.current(state) == next_clip_norm(1.0, 3, 4, 0.5, 0.2, 0.0)
    clipping.update(1, _with_bits([0, 0]), state)  # two of the four replied: the denominator stays m = 4
    assert clipping.current(state) == next_clip_norm(next_clip_norm(1.0, 3, 4, 0.5, 0.2, 0.0), 0, 4, 0.5, 0.2, 0.0)


def test_the_count_noise_has_std_sigma_b_and_is_seeded_by_round() -> None:
    """The noise recovered from each update's log-step, (γ − log(C'/C)/η)·m − Σb, over 4000 rounds:
    mean 0 within 5 standard errors, std σ_b within 5 % (the sample std's own std is σ_b/√(2·4000)
    ≈ 1.1 %); the same (seed, round) draws the same, another round or seed other noise."""
    count_noise, m, eta, gamma = 1.5, 4, 0.2, 0.5
    clipping = _clipping(count_noise=count_noise, per_round=m, learning_rate=eta, target_quantile=gamma)

    def noise(c: AdaptiveClipping, rnd: int) -> float:
        state: dict = {}
        c.update(rnd, _with_bits([1, 0, 1]), state)
        return (gamma - math.log(c.current(state) / c.initial) / eta) * m - 2

    draws = torch.tensor([noise(clipping, rnd) for rnd in range(4000)], dtype=torch.float64)
    assert abs(float(draws.mean())) < 5 * count_noise / math.sqrt(len(draws))
    assert float(draws.std()) == pytest.approx(count_noise, rel=0.05)
    assert noise(clipping, 7) == noise(_clipping(count_noise=count_noise, per_round=m), 7)
    assert noise(clipping, 7) != noise(clipping, 8)
    assert noise(clipping, 7) != noise(_clipping(count_noise=count_noise, per_round=m, seed=4), 7)


def test_the_update_noise_scales_with_the_round_s_clip_norm() -> None:
    """Every client sends w̄ itself: m · (w̄' − w̄) is the noise, of std σ_Δ · C with C the clip norm
    the server state holds as the round starts (not C₀)."""
    sigma_delta, m = 1.1, 5
    codec = GaussianCodec(1.0, sigma_delta, per_round=m, seed=2, adaptive=_clipping(per_round=m))
    reference = {"w": torch.zeros(400, 500, dtype=torch.float64)}
    uploads = [Upload(i, dict(reference), 1, 1, 0.1, 0.0) for i in range(3)]
    state = {CLIP_NORM: torch.tensor(0.3, dtype=torch.float64)}
    draw = codec.round_combine(0, reference, set(), state)(uploads, None, None)["w"] * m
    assert float(draw.std()) == pytest.approx(sigma_delta * 0.3, rel=0.01)


# the clients ------------------------------------------------------------------------------------
def test_a_client_clips_to_the_payload_s_bound_and_sends_its_bit() -> None:
    reference = {"w": torch.zeros(4), "head": torch.ones(2)}
    upload = Upload(0, {"w": torch.tensor([3.0, 4.0, 0.0, 0.0]), "head": torch.full((2,), 9.0)}, 10, 1, 0.1, 0.0,
                    extras={"part": {"x": torch.ones(1)}})
    codec = ClipCodec(100.0)  # what a Flower node builds: the bound comes with the round
    for bound, bit in ((1.0, 0.0), (5.0, 1.0), (6.0, 1.0)):
        message = codec.encode(upload, reference, {"head"}, {CLIP_NORM: torch.tensor(bound, dtype=torch.float64)})
        assert update_norm({"w": message.state["w"]}) == pytest.approx(min(bound, 5.0), rel=1e-6)
        assert float(message.extras[CODEC][UNCLIPPED]) == bit and message.extras["part"] is upload.extras["part"]
        assert torch.equal(message.state["head"], upload.state["head"])
    assert codec.encode(upload, reference, {"head"}, {}) is upload  # a fixed bound: no bit


def test_the_first_round_s_bits_move_c_on_the_backend() -> None:
    """Round 1 on the simulation backend (σ = 0, σ_b = 0): each message's bit is 1[‖Δ_k‖ ≤ C₀] of
    the client's unclipped update, its update clipped to C₀, and the server's C after the round is
    the rule's from those bits."""
    plain = _setup(_config())
    plain_tasks = plan_round(plain.server, plain.config, 0, plain.train_sizes)
    uploads, _ = plain.train(plain_tasks)
    reference = plain_tasks[0].global_state
    norms = [update_norm({k: u.state[k].double() - v.double() for k, v in reference.items() if v.is_floating_point()})
             for u in uploads]
    bound = sum(sorted(norms)[:2]) / 2  # between the two smallest norms: one client fits, two do not
    s = _setup(_config(f"privacy.clip_norm={bound}", "privacy.target_quantile=0.5"))
    tasks = plan_round(s.server, s.config, 0, s.train_sizes)
    assert float(tasks[0].payload[CLIP_NORM]) == bound
    messages, _ = s.train(tasks)
    bits = [float(msg.extras[CODEC][UNCLIPPED]) for msg in messages]
    assert bits == [float(n <= bound) for n in norms] and sum(bits) == 1
    for message, norm in zip(messages, norms):
        clipped = {k: message.state[k].double() - v.double() for k, v in reference.items() if v.is_floating_point()}
        assert update_norm(clipped) == pytest.approx(min(norm, bound), rel=1e-5)
    close_round(s.server, s.config, 0, tasks, messages)
    assert float(s.server.state[CLIP_NORM]) == next_clip_norm(bound, sum(bits), 3, 0.5, 0.2, 0.0)


# runs ---------------------------------------------------------------------------------------------
def _lines(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if not k.startswith("time_")}
            for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_private_adaptive_run_logs_c_and_epsilon_and_resumes_identically(tmp_path: Path, crash_at_round_2,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each metrics line holds the clip norm its round clipped to (C₀ first, then moved) and ε of
    σ itself; a run stopped after two rounds and resumed ends with the uninterrupted run's C (in its
    checkpoint), weights and lines."""
    config = _config(*PRIVATE, "train.rounds=4")
    with pytest.raises(KeyboardInterrupt):
        fedlatent.run(config, tmp_path / "crashed")
    monkeypatch.undo()
    whole = fedlatent.run(config, tmp_path / "whole")
    resumed = fedlatent.run(config, tmp_path / "crashed", resume=True)
    lines = _lines(tmp_path / "whole")
    clip_norms = [x["privacy_clip_norm"] for x in lines]
    assert clip_norms[0] == 0.5 and clip_norms[1] > 0.5 and len(set(clip_norms)) == 4
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(6, 3, dp_accounting.GaussianDpEvent(0.4)), 4))
    most = max(Counter(c for x in lines for c in x["clients"]).values())  # the worst client's rounds, unamplified
    plain = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    plain.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(0.4), most))
    expected = min(accountant.get_epsilon(1e-4), plain.get_epsilon(1e-4))
    assert lines[-1]["privacy_epsilon"] == pytest.approx(expected, rel=1e-12)
    assert _lines(tmp_path / "crashed") == lines and resumed["final"] == whole["final"]
    for name in ("server.safetensors", "global.safetensors"):
        a, b = (_latest(tmp_path / run, name) for run in ("crashed", "whole"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert float(_latest(tmp_path / "whole", "server.safetensors")[CLIP_NORM]) != clip_norms[-1]  # moved after round 4


def _latest(out: Path, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    folder = json.loads((out / "checkpoints" / "latest.json").read_text())["folder"]
    return load_file(str(out / "checkpoints" / folder / name))


def test_adaptive_backends_agree_and_stacked_runs_equal_runs_alone() -> None:
    """The simulation and vectorized backends give the same weights and clip norm up to float
    rounding; two adaptive private runs in one lockstep stack give each run's numbers alone."""
    config = _config(*PRIVATE)
    alone = run_on_each_backend(config, _setup, TRAINERS)
    assert float(alone["simulation"].server.state[CLIP_NORM]) == \
        pytest.approx(float(alone["vectorized"].server.state[CLIP_NORM]), rel=1e-12)
    other = dataclasses.replace(config, seed=1)
    stacked = run_stacked([config, other], _setup)
    single = _setup(other, lockstep_update)
    for rnd in range(2):
        simulation.run_round(single, rnd)
    for got, want in zip(stacked, [alone["vectorized"], single]):
        assert float(got.server.state[CLIP_NORM]) == pytest.approx(float(want.server.state[CLIP_NORM]), rel=1e-12)
        for k, v in want.server.global_state.items():
            torch.testing.assert_close(got.server.global_state[k], v, atol=2e-5, rtol=1e-4, msg=k)


# refusals ------------------------------------------------------------------------------------------
BAD = {
    "no start": (["privacy.target_quantile=0.5"], "finite privacy.clip_norm"),
    "quantile one": (["privacy.clip_norm=1", "privacy.target_quantile=1"], "privacy.target_quantile"),
    "negative quantile": (["privacy.clip_norm=1", "privacy.target_quantile=-0.1"], "privacy.target_quantile"),
    "rate zero": ([*ADAPTIVE, "privacy.clip_learning_rate=0"], "privacy.clip_learning_rate"),
    "negative count noise": ([*ADAPTIVE, "privacy.clip_count_noise=-1"], "privacy.clip_count_noise"),
    "nan count noise": ([*ADAPTIVE, "privacy.clip_count_noise=nan"], "privacy.clip_count_noise"),
    "count noise too small": ([*ADAPTIVE, "privacy.noise_multiplier=1", "privacy.clip_count_noise=0.5"],
                              "must exceed noise_multiplier / 2"),
    "no count noise": ([*ADAPTIVE, "privacy.noise_multiplier=1"], "must exceed noise_multiplier / 2"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_adaptive_setting_exits_2_in_one_line_before_any_run_folder(case: str, tmp_path: Path, capsys) -> None:
    overrides, message = BAD[case]
    assert message in _exits_2(overrides, tmp_path, capsys)
