"""Distributed DP, the distributed Skellam mechanism through the codec chain
(``federated.distributed_dp``): the rotation orthonormal and the Walsh–Hadamard matrix by hand, the
Skellam shares' moments, the unmasked sum's noise variance — σ²C²·n/m with n of the m clients
surviving — and zero mean in a statistical test of stated false-alarm rate, the decoded sum the
sum of the updates when the noise is negligible, ε equal to dp-accounting's Gaussian of the
effective multiplier where the Skellam terms vanish and above it where they do not, dropouts
accounted at the worst case, runs on both embedded backends agreeing, and the settings refused in one line
before any run folder exists."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.data.federation import build_federation
from fedlatent.federated.codec import DistributedCodec, server_codec
from fedlatent.federated.codec_chain import CODED_BYTES
from fedlatent.federated.distributed_dp import (MESSAGE, ORDERS, SkellamAccountant, SkellamSpec, hadamard, padded,
                                               rounded_bound, skellam)
from fedlatent.federated.trainer import lockstep_update
from fedlatent.methods import resolve
from fedlatent.methods.parts import Upload

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "digits_fedavg.toml"
Z = 4.42  # |z| above this under the null: a false alarm with probability 1e-5 (two-sided, normal)


def test_the_rotation_is_the_orthonormal_walsh_hadamard_matrix() -> None:
    h = torch.ones(1, 1, dtype=torch.float64)
    for _ in range(3):  # Sylvester's construction, H_{2n} = [[H, H], [H, −H]]
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    x = torch.randn(8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(hadamard(x), h @ x / math.sqrt(8), rtol=0, atol=1e-14)
    torch.testing.assert_close(hadamard(hadamard(x)), x, rtol=0, atol=1e-14)
    assert padded(9610) == 16384 and padded(8) == 8 and padded(1) == 1


def test_skellam_shares_have_their_variance_and_fourth_moment() -> None:
    """Skellam of variance μ: mean 0, E z² = μ, Var z² = μ + 2μ² (its even cumulants are all μ);
    over 200 000 draws both within Z standard errors."""
    mu, n = 3.7, 200_000
    z = skellam(mu, n, torch.Generator().manual_seed(1)).double()
    assert abs(float(z.mean())) < Z * math.sqrt(mu / n)
    assert abs(float((z ** 2).mean()) - mu) < Z * math.sqrt((mu + 2 * mu ** 2) / n)


def _codec(sigma: float, m: int, bits: int = 20, clip: float = 1.0, survivors: int = 1) -> DistributedCodec:
    cfg = fedlatent.load_config(CONFIG, [f"privacy.clip_norm={clip}", f"privacy.noise_multiplier={sigma}",
                                         'privacy.distributed="skellam"', f"privacy.distributed_bits={bits}"]).privacy
    codec = server_codec(cfg, 5, m, m, survivors=survivors)
    assert isinstance(codec, DistributedCodec)
    return codec


def _round(codec: DistributedCodec, reference: dict, states: list[dict], rnd: int = 2) -> dict:
    """The codec's round on clients that trained to ``states``, every one of them in the sum."""
    messages = [codec.encode(Upload(c, s, 10, 1, 0.1, 0.0), reference, set(), {}, None, rnd)
                for c, s in enumerate(states)]
    return codec.round_combine(rnd, reference, set(), {})(messages, None, None)


@pytest.mark.parametrize("survivors", [6, 4])
def test_the_unmasked_sums_noise_has_the_configured_variance_and_mean_zero(survivors: int) -> None:
    """Every client sends w̄ itself (Δ = 0, which rotates and rounds to 0 exactly), so m · (w̄' − w̄)
    is γ·D·H·z, z the sum of the surviving clients' Skellam shares: by Parseval Σ_i S_i² = γ²‖z‖²
    exactly, and ‖z‖² over d = 2^16 iid coordinates of variance V = n·μ_k has mean dV and variance
    d(V + 2V²). With n of the m = 6 planned clients surviving V·γ² = σ²C²·n/m per coordinate (the
    dropouts' shares are missing). The test's z-scores of ‖z‖² and of Σ S_i stay within ±4.42: a
    false alarm with probability 1e-5 each."""
    sigma, clip, m = 1.3, 0.8, 6
    codec = _codec(sigma, m, clip=clip)
    reference = {"w": torch.full((256, 256), 0.25, dtype=torch.float64)}
    summed = (_round(codec, reference, [reference] * survivors)["w"] - reference["w"]) * m
    gamma, d = codec.spec.scale, summed.numel()
    variance = survivors * codec.spec.share_variance  # V, in γ units
    assert variance * gamma ** 2 == pytest.approx(sigma ** 2 * clip ** 2 * survivors / m, rel=1e-12)
    energy = float((summed / gamma).square().sum())
    assert abs(energy - d * variance) / math.sqrt(d * (variance + 2 * variance ** 2)) < Z
    assert abs(float(summed.sum()) / gamma) / math.sqrt(d * variance) < Z
    assert float(summed.var()) == pytest.approx(sigma ** 2 * clip ** 2 * survivors / m, rel=0.02)


def test_with_negligible_noise_the_decoded_mean_is_the_mean_of_the_clipped_updates() -> None:
    """σ = 10⁻⁶ on 40 bits: the modular sum, rotated back, is Σ Δ_k up to the rounding (γ ≈ 10⁻¹¹);
    the mean is w̄ + Σ clip(Δ_k) / m, an update over C clipped first; integer entries stay at w̄'s."""
    codec = _codec(1e-6, 3, bits=40, clip=1.0)
    generator = torch.Generator().manual_seed(3)
    reference = {"a": torch.randn(5, 7, generator=generator), "b": torch.randn(3, generator=generator),
                 "n": torch.tensor(4)}
    deltas = [{"a": 0.05 * torch.randn(5, 7, generator=generator), "b": 0.05 * torch.randn(3, generator=generator)}
              for _ in range(2)] + [{"a": torch.full((5, 7), 1.0), "b": torch.zeros(3)}]  # the last: norm √35 > C
    states = [{"a": reference["a"] + d["a"], "b": reference["b"] + d["b"], "n": torch.tensor(9)} for d in deltas]
    got = _round(codec, reference, states)
    clipped = [d if k < 2 else {key: v / math.sqrt(35) for key, v in d.items()} for k, d in enumerate(deltas)]
    for key in ("a", "b"):
        want = reference[key].double() + sum(d[key].double() for d in clipped) / 3
        torch.testing.assert_close(got[key].double(), want, rtol=0, atol=1e-6)
    assert got["n"] is reference["n"]
    message = codec.encode(Upload(0, states[0], 10, 1, 0.1, 0.0), reference, set(), {}, None, 0)
    assert list(message.state) == [MESSAGE] and message.state[MESSAGE].numel() == 64  # 38 entries padded to 64
    assert message.metrics[CODED_BYTES] == 64 * 40 / 8
    assert 0 <= int(message.state[MESSAGE].min()) and int(message.state[MESSAGE].max()) < 2 ** 40


def test_the_conditional_roundings_bound_is_the_papers() -> None:
    """Δ₂² = min(c² + d/4 + √(2 ln(1/β))·(c + √d/2), (c + √d)²) with β = e^{−1/2}, √(2 ln(1/β)) = 1."""
    assert rounded_bound(10.0, 64) ** 2 == pytest.approx(100 + 16 + (10 + 4))  # 130 < (10 + 8)² = 324
    assert rounded_bound(0.1, 10_000) ** 2 == pytest.approx(0.01 + 2500 + (0.1 + 50))
    assert rounded_bound(0.0, 1, beta=math.exp(-8)) ** 2 == pytest.approx(1.0)  # 0.25 + 4·0.5 > (0 + 1)²


def test_epsilon_is_the_gaussians_where_the_skellam_terms_vanish_and_above_it_where_they_do_not() -> None:
    """At 20 bits μ is ~10⁹: the Skellam RDP is the Gaussian's α Δ₂²/(2μ) up to terms of 1/μ², so ε
    equals dp-accounting's Gaussian mechanism of multiplier σ·√(t/m)/(2Δ₂) (replace-one, Δ₂ the
    rounding's bound in the updates' units, t the worst-case survivors) composed over the rounds;
    at 9 bits μ is small and ε exceeds it. Fewer guaranteed survivors cost more ε."""
    dp_accounting = pytest.importorskip("dp_accounting")
    sigma, m, rounds, d = 1.1, 10, 30, 16384

    def gaussian(spec: SkellamSpec, survivors: int) -> float:
        l2 = rounded_bound(spec.clip_norm / spec.scale, d) * spec.scale
        accountant = dp_accounting.rdp.RdpAccountant(ORDERS)
        accountant.compose(dp_accounting.GaussianDpEvent(sigma * math.sqrt(survivors / m) / (2 * l2)), rounds)
        return accountant.get_epsilon(1e-5)

    for survivors in (10, 6):
        wide = SkellamSpec(1.0, sigma, m, 20)
        assert SkellamAccountant(wide, survivors, 1e-5).epsilon(rounds, d) == pytest.approx(gaussian(wide, survivors),
                                                                                            rel=1e-6)
    narrow = SkellamSpec(1.0, sigma, m, 9)
    assert SkellamAccountant(narrow, 10, 1e-5).epsilon(rounds, d) > (1 + 1e-3) * gaussian(narrow, 10)
    spec = SkellamSpec(1.0, sigma, m, 20)
    assert SkellamAccountant(spec, 6, 1e-5).epsilon(rounds, d) > SkellamAccountant(spec, 10, 1e-5).epsilon(rounds, d)


def test_a_run_on_both_embedded_backends_agrees_and_reports_epsilon() -> None:
    extra = ["data.num_clients=4", "train.rounds=2", "privacy.clip_norm=1.0", "privacy.noise_multiplier=0.7",
             'privacy.distributed="skellam"', "train.min_clients=3"]
    runs = []
    for trainer in (simulation.train_in_turn, lockstep_update):
        config = fedlatent.load_config(CONFIG, extra)
        s = simulation.setup(config, build_federation(config.data, config.data_seed),
                             resolve(config.algorithm, config.terms), trainer)
        lines = [simulation.run_round(s, rnd) for rnd in range(2)]
        runs.append((s.server.global_state, lines))
    (first, lines), (second, other) = runs
    for key, value in first.items():  # the trainers agree up to rounding; the noise and ε are the same draws
        torch.testing.assert_close(second[key], value, rtol=0, atol=1e-4)
    assert lines[-1]["privacy_epsilon"] == other[-1]["privacy_epsilon"] > lines[0]["privacy_epsilon"] > 0
    assert lines[0]["bytes_up"] == 4 * 16384 * 20 // 8


@pytest.mark.parametrize("case, key", [(['privacy.distributed="skellam"'], "privacy.noise_multiplier"),
                                       (['privacy.distributed="skellam"', "privacy.clip_norm=1",
                                         "privacy.noise_multiplier=1", 'backend="flower"'], "privacy.distributed"),
                                       (['privacy.distributed="skellam"', "privacy.clip_norm=1",
                                         "privacy.noise_multiplier=1", "privacy.target_quantile=0.5",
                                         "privacy.clip_count_noise=1"], "privacy.target_quantile"),
                                       (['privacy.distributed="skellam"', "privacy.clip_norm=1",
                                         "privacy.noise_multiplier=1", "diagnostics.clients=true"],
                                        "diagnostics.clients"),
                                       (["privacy.distributed_bits=4"], "privacy.distributed_bits")])
def test_a_bad_distributed_setting_exits_2_in_one_line_before_any_run_folder(case, key, tmp_path: Path) -> None:
    out = tmp_path / "run"
    sets = [a for c in case for a in ("--set", c)]
    proc = subprocess.run([sys.executable, "-m", "fedlatent.cli", "run", str(CONFIG), *sets, "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and key in proc.stderr
    assert not out.exists()
