"""FFC's and CCVR's statistics under client-level DP: each client's statistics clipped to a bound,
Gaussian noise on their sums (``GaussianCodec.total``), the solves kept stable (``calibration.psd``,
``ccvr.pool_sums``), the release counted by the accountant; the pure pieces against float64
references and identities, the noise by its spread over many draws, ε against dp-accounting
composed directly, σ = 0 as today's calibration bit for bit, and the refusals that still apply."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.calibration.ccvr import class_statistics, class_sums, pool_statistics, pool_sums
from fedlatent.calibration.psd import nearest_psd
from fedlatent.data.federation import build_federation
from fedlatent.federated import accounting
from fedlatent.federated.calibrate import apply_statistics, client_statistics, head_keys, pooled_classes
from fedlatent.federated.codec import ClipCodec, GaussianCodec, UpdateCodec, server_codec, update_norm
from fedlatent.methods import resolve
from tests.test_privacy import _exits_2

dp_accounting = pytest.importorskip("dp_accounting", reason="the privacy extra (pip install 'fedlatent[privacy]')")

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "digits_fedavg.toml"
SMALL = ["data.num_clients=6", "train.rounds=3", "train.participation=0.5"]
UPDATES = ["privacy.clip_norm=0.5", "privacy.noise_multiplier=0.8", "privacy.delta=1e-4"]
# SphereFed's z is normalised: a client's ‖(V, U)‖ ≤ √2·n (about 340 for the 240 samples of a digits
# client of six; 160 measured after a round): a bound of 100 clips every client
STATISTICS = ["privacy.statistics_clip_norm=100", "privacy.statistics_noise_multiplier=4"]
METHODS = {"ffc": ['algorithm.name="spherefed"'], "ccvr": ['algorithm.name="ccvr"', "algorithm.ccvr_epochs=2"]}


def _config(*extra: str):
    return fedlatent.load_config(CONFIG, [*SMALL, *extra])


def _setup(config) -> simulation.Setup:
    return simulation.setup(config, build_federation(config.data, config.data_seed),
                            resolve(config.algorithm, config.terms))


def _direct_epsilon(rounds: int, releases: int, sigma: float = 0.8, statistics_sigma: float = 4.0,
                    num_clients: int = 6, per_round: int = 3, delta: float = 1e-4) -> float:
    """dp-accounting called directly: the rounds' sampled Gaussians (σ/2) composed with the
    releases' Gaussians (σ_s/2, every client), replace-one."""
    rnd = dp_accounting.GaussianDpEvent(sigma / 2)
    if per_round < num_clients:
        rnd = dp_accounting.SampledWithoutReplacementDpEvent(num_clients, per_round, rnd)
    events = [dp_accounting.SelfComposedDpEvent(rnd, rounds)]
    if releases:
        events.append(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(statistics_sigma / 2), releases))
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.ComposedDpEvent(events))
    return accountant.get_epsilon(delta)


# the pure pieces ----------------------------------------------------------------------------------
def test_nearest_psd_by_hand_and_its_properties() -> None:
    """diag(2, −1) → diag(2, 0); a PSD matrix stays (to rounding); the symmetric part is what is
    projected; the result is PSD and no farther from A than a PSD matrix drawn at random (Higham
    1988: the nearest in Frobenius norm); batches project matrix by matrix."""
    torch.testing.assert_close(nearest_psd(torch.tensor([[2.0, 0.0], [0.0, -1.0]], dtype=torch.float64)),
                               torch.tensor([[2.0, 0.0], [0.0, 0.0]], dtype=torch.float64), rtol=0, atol=1e-15)
    generator = torch.Generator().manual_seed(0)
    b = torch.randn(5, 5, generator=generator, dtype=torch.float64)
    psd = b @ b.T
    torch.testing.assert_close(nearest_psd(psd), psd, rtol=0, atol=1e-12)
    a = torch.randn(5, 5, generator=generator, dtype=torch.float64)
    assert torch.equal(nearest_psd(a), nearest_psd(0.5 * (a + a.T)))
    projected = nearest_psd(a)
    assert float(torch.linalg.eigvalsh(projected).min()) >= -1e-12
    for _ in range(50):
        c = torch.randn(5, 5, generator=generator, dtype=torch.float64)
        assert torch.linalg.matrix_norm(projected - a) <= torch.linalg.matrix_norm(c @ c.T / 5 - a) + 1e-12
    batch = torch.stack([a, -psd])
    torch.testing.assert_close(nearest_psd(batch), torch.stack([projected, torch.zeros(5, 5, dtype=torch.float64)]),
                               rtol=0, atol=1e-10)
    with pytest.raises(ValueError):
        nearest_psd(torch.zeros(2, 3))


def _clients(generator: torch.Generator, classes: int = 4, dim: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three clients' features and labels: one lacks class 3, one holds a single sample of class 2."""
    labels = [torch.tensor([0, 0, 1, 1, 1, 2, 2, 0]), torch.tensor([3, 3, 0, 1, 3, 0]), torch.tensor([2, 1, 1, 0, 3])]
    return [(torch.randn(len(y), dim, generator=generator, dtype=torch.float64) * 2 + 1, y) for y in labels]


def test_class_sums_pooled_equal_the_pooled_moments() -> None:
    """Σ over clients of (N_c, Σz, Σzzᵀ) through pool_sums is pool_statistics of the clients'
    moments (CCVR Eq. 3-4), to float64 rounding; an absent class stays absent."""
    generator = torch.Generator().manual_seed(1)
    clients = _clients(generator)
    sums = [class_sums(z, y, 5) for z, y in clients]
    totals = [torch.stack(parts).sum(0) for parts in zip(*sums)]
    mean, cov, count = pool_sums(*totals, dtype=torch.float64)
    want = pool_statistics([class_statistics(z, y, 5) for z, y in clients])
    torch.testing.assert_close(mean, want[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(cov, want[1], rtol=0, atol=1e-12)
    assert torch.equal(count, want[2]) and count.tolist() == [6, 6, 3, 4, 0]
    z, y = clients[0]
    count0, first0, second0 = class_sums(z, y, 5)
    torch.testing.assert_close(second0[0], z[y == 0].T @ z[y == 0], rtol=0, atol=1e-12)
    assert count0.dtype == torch.float64 and count0.tolist() == [3, 3, 2, 0, 0]


def test_noisy_sums_pool_to_psd_covariances_and_drop_classes_counted_below_one() -> None:
    count = torch.tensor([10.0, 0.4, 1.5, -2.0], dtype=torch.float64)
    generator = torch.Generator().manual_seed(2)
    first = torch.randn(4, 3, generator=generator, dtype=torch.float64)
    second = torch.randn(4, 3, 3, generator=generator, dtype=torch.float64) * 5  # not symmetric, not PSD
    mean, cov, counts = pool_sums(count, first, second, dtype=torch.float64)
    assert counts.tolist() == [10, 0, 2, 0]
    assert torch.equal(mean[1], torch.zeros(3, dtype=torch.float64)) and torch.equal(mean[3], mean[1])
    torch.testing.assert_close(mean[0], first[0] / 10)
    assert torch.equal(cov[1:], torch.zeros(3, 3, 3, dtype=torch.float64))  # absent, or fewer than 2
    assert torch.equal(cov[0], cov[0].T) and float(torch.linalg.eigvalsh(cov[0]).min()) >= -1e-12


# the codec ----------------------------------------------------------------------------------------
def test_each_client_s_statistics_are_clipped_together_to_the_bound() -> None:
    stats = {"V": torch.full((2, 2), 3.0, dtype=torch.float64), "U": torch.full((2, 1), 4.0, dtype=torch.float64)}
    codec = ClipCodec(math.inf, statistics_clip_norm=5.0)  # ‖(V, U)‖ = √(4·9 + 2·16) = √68
    clipped = codec.encode_statistics(stats)
    assert update_norm(clipped) == pytest.approx(5.0, rel=1e-15)
    torch.testing.assert_close(clipped["V"] / clipped["U"][0, 0], stats["V"] / 4.0)  # scaled alike
    assert ClipCodec(math.inf, statistics_clip_norm=9.0).encode_statistics(stats) is stats
    assert UpdateCodec().encode_statistics(stats) is stats and UpdateCodec.statistics_bound is None


def test_the_noise_on_the_sums_has_std_sigma_b_and_is_seeded_by_release() -> None:
    """Three clients sending zeros: the total is the noise, over 200 000 entries of std σ_s·B within
    1 % and mean 0 within 5 standard errors; the same (seed, release) draws the same, another release
    or seed other noise; without a bound the sum is the plain one."""
    sigma, bound = 1.7, 3.0
    stats = [{"V": torch.zeros(400, 400, dtype=torch.float64), "U": torch.zeros(400, 100, dtype=torch.float64)}] * 3

    def codec(seed: int = 5) -> GaussianCodec:
        return GaussianCodec(1.0, 1.0, 3, seed, statistics_clip_norm=bound, statistics_noise_multiplier=sigma)

    total = codec().total(stats, 2)
    draw = torch.cat([total["V"].flatten(), total["U"].flatten()])
    assert float(draw.std()) == pytest.approx(sigma * bound, rel=0.01)
    assert abs(float(draw.mean())) < 5 * sigma * bound / math.sqrt(draw.numel())
    assert torch.equal(codec().total(stats, 2)["U"], total["U"])
    assert not torch.equal(codec().total(stats, 3)["U"], total["U"])
    assert not torch.equal(codec(6).total(stats, 2)["U"], total["U"])
    assert torch.equal(GaussianCodec(1.0, 1.0, 3, 5).total(stats, 2)["V"], stats[0]["V"])
    with pytest.raises(ValueError, match="statistics_clip_norm"):
        GaussianCodec(1.0, 1.0, 3, 5, statistics_noise_multiplier=1.0)


@pytest.mark.parametrize("rounds, releases", [(3, 1), (3, 4), (0, 1)])
def test_epsilon_with_the_statistics_equals_dp_accounting_composed_directly(rounds: int, releases: int) -> None:
    ours = accounting.Accountant(6, 3, 0.8, 1e-4, statistics_noise_multiplier=4.0)
    assert ours.epsilon(rounds, releases) == pytest.approx(_direct_epsilon(rounds, releases), rel=1e-12)
    assert ours.epsilon(rounds, releases) > ours.epsilon(rounds)
    with pytest.raises(ValueError, match="without noise"):
        accounting.Accountant(6, 3, 0.8, 1e-4).epsilon(3, 1)


def test_server_codec_gives_the_statistics_their_bound_and_noise() -> None:
    codec = server_codec(_config(*UPDATES, *STATISTICS).privacy, 7, 6, 3)
    assert isinstance(codec, GaussianCodec)
    assert (codec.statistics_bound, codec.statistics_noise_multiplier) == (100.0, 4.0)
    assert codec.epsilon(3, 1) == pytest.approx(_direct_epsilon(3, 1), rel=1e-12)
    auto = server_codec(_config(*UPDATES, "privacy.statistics_clip_norm=200").privacy, 7, 6, 3)
    assert auto.statistics_noise_multiplier == 0.8  # "auto": the updates' σ
    assert server_codec(_config("privacy.statistics_clip_norm=9").privacy, 0, 6, 3).statistics_bound == 9.0


# on the backends ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(METHODS))
def test_sigma_zero_without_clipping_is_today_s_calibration_bit_for_bit(kind: str) -> None:
    """The [privacy] keys at their off values: the same head bit for bit as the plain run. A bound
    that clips nothing, without noise, takes the sums' path: FFC's head and CCVR's pooled Gaussians
    are the plain ones to rounding (CCVR's virtual features, drawn through an eigendecomposition of
    covariances equal to rounding, are other draws of the same Gaussians)."""
    setups = {}
    for label, extra in (("plain", ()), ("off", ("privacy.noise_multiplier=0", "privacy.statistics_clip_norm=inf",
                                                 "privacy.statistics_noise_multiplier=0")),
                         ("sums", ("privacy.statistics_clip_norm=1e9",))):
        setups[label] = s = _setup(_config(*METHODS[kind], "train.rounds=1", *extra))
        simulation.run_round(s, 0)
    state = setups["plain"].server.global_state
    assert all(torch.equal(state[k], v) for k, v in setups["sums"].server.global_state.items())
    if kind == "ccvr":
        pooled = {label: pooled_classes([s.statistics(state)[c] for c in range(6)], s.server.codec, 3, torch.float32)
                  for label, s in setups.items()}
        for want, got in zip(pooled["plain"], pooled["sums"]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    heads = {label: (simulation.finish(s), s.model.state_dict())[1] for label, s in setups.items()}
    assert all(torch.equal(heads["plain"][k], v) for k, v in heads["off"].items())
    if kind == "ffc":
        torch.testing.assert_close(heads["sums"]["classifier.weight"], heads["plain"]["classifier.weight"],
                                   rtol=1e-5, atol=1e-6)


def test_private_statistics_on_a_client_and_the_server() -> None:
    """A client's FFC statistics leave clipped to B; the server's noisy sums give a finite head,
    another one for another release."""
    config = _config(*UPDATES, *STATISTICS, 'algorithm.name="spherefed"', "train.rounds=1")
    s = _setup(config)
    simulation.run_round(s, 0)
    state = s.server.global_state
    stats = s.statistics(state)
    cal = s.spec.calibration
    plain = client_statistics(s.model, state, s.federation.clients[0].train, cal, 64, s.device)
    assert update_norm(plain) > 100 and update_norm(stats[0]) == pytest.approx(100, rel=1e-12)
    heads = [apply_statistics(state, [stats[c] for c in sorted(stats)], cal, *head_keys(s.model), torch.Generator(),
                              s.server.codec, release)["classifier.weight"] for release in (1, 2)]
    assert all(bool(torch.isfinite(h).all()) for h in heads) and not torch.equal(*heads)


@pytest.mark.parametrize("kind", sorted(METHODS))
def test_a_private_calibrated_run_counts_each_release(kind: str, tmp_path: Path) -> None:
    """Periodic FFC (every round) and CCVR: ε in each metrics line counts the rounds and the
    calibrations made so far, and summary.json's counts the final calibration too — dp-accounting's
    composition of both; the run repeats to the bit."""
    extra = [*METHODS[kind], *(["algorithm.ffc_every=1"] if kind == "ffc" else [])]
    config = _config(*UPDATES, *STATISTICS, *extra, "train.rounds=2")
    summaries = [fedlatent.run(config, tmp_path / name) for name in ("a", "b")]
    lines = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    per_round = [_direct_epsilon(r, r if kind == "ffc" else 0) for r in (1, 2)]
    assert [x["privacy_epsilon"] for x in lines] == pytest.approx(per_round, rel=1e-12)
    final = _direct_epsilon(2, 3 if kind == "ffc" else 1)
    assert summaries[0]["privacy_epsilon"] == pytest.approx(final, rel=1e-12) and final > per_round[-1]
    assert summaries[0]["final"]["accuracy"] == summaries[1]["final"]["accuracy"]
    assert math.isfinite(summaries[0]["final"]["loss"])


# refusals ------------------------------------------------------------------------------------------
BAD = {
    "ffc without a bound": ([*UPDATES, *METHODS["ffc"]], "ffc calibration's statistics need a bound"),
    "ccvr without a bound": ([*UPDATES, *METHODS["ccvr"]], "ccvr calibration's statistics need a bound"),
    "statistics without noise": ([*UPDATES, *METHODS["ffc"], "privacy.statistics_clip_norm=10",
                                  "privacy.statistics_noise_multiplier=0"], "without noise"),
    "centralized": ([*UPDATES, *STATISTICS, 'algorithm.calibration="centralized"'], "features themselves"),
    "statistics noise without private training": (["privacy.statistics_clip_norm=10",
                                                   "privacy.statistics_noise_multiplier=1"], "noise_multiplier > 0"),
    "bound zero": (["privacy.statistics_clip_norm=0"], "privacy.statistics_clip_norm"),
    "negative noise": (["privacy.statistics_noise_multiplier=-1"], "privacy.statistics_noise_multiplier"),
    "scaffold still": (['algorithm.name="scaffold"', *UPDATES, *STATISTICS], "part 'scaffold' uploads extras"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_statistics_setting_exits_2_in_one_line_before_any_run_folder(case: str, tmp_path: Path, capsys) -> None:
    overrides, message = BAD[case]
    assert message in _exits_2(overrides, tmp_path, capsys)
