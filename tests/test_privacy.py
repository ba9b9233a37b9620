"""Client-level DP-FedAvg (``federated.codec.GaussianCodec``, ``federated.accounting``): the
fixed-denominator estimator and its noise by construction, ε against dp-accounting called directly,
σ = 0 as the non-private run bit for bit, short private runs on the embedded backends, and the bad
settings refused in one line before any run folder exists."""
from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.cli import main
from fedlatent.errors import ConfigError
from fedlatent.experiment.runner.validation import check_model_fit, validate
from fedlatent.federated import accounting
from fedlatent.federated.codec import GaussianCodec, UpdateCodec, server_codec
from fedlatent.federated.trainer import lockstep_update
from fedlatent.federated.round import sample_clients
from fedlatent.methods.parts import Upload
from tests.private_runs import CONFIG, SMALL, TRAINERS
from tests.private_runs import set_up as _setup
from tests.private_runs import small_config as _config
from tests.stacked_runs import run_on_each_backend, run_stacked

dp_accounting = pytest.importorskip("dp_accounting", reason="the privacy extra (pip install 'fedlatent[privacy]')")

ROOT = Path(__file__).resolve().parents[1]
PRIVATE = ["privacy.noise_multiplier=0.8", "privacy.clip_norm=0.5", "privacy.delta=1e-4"]




def _direct_epsilon(num_clients: int, per_round: int, sigma: float, rounds: int, delta: float) -> float:
    """dp-accounting's RDP accountant called directly: replace-one, the Gaussian of multiplier σ/2
    (sensitivity 2C of the sum of updates clipped to C, noise σC), sampled without replacement."""
    event = dp_accounting.GaussianDpEvent(sigma / 2)
    if per_round < num_clients:
        event = dp_accounting.SampledWithoutReplacementDpEvent(num_clients, per_round, event)
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
    return accountant.get_epsilon(delta)


# the accountant --------------------------------------------------------------------------------
@pytest.mark.parametrize("num_clients, per_round, sigma, rounds, delta",
                         [(100, 10, 1.0, 50, 1e-5), (20, 5, 2.0, 7, 1e-3), (6, 3, 0.8, 3, 1e-4), (10, 10, 4.0, 20, 1e-5)])
def test_epsilon_equals_the_accountant_called_directly(num_clients, per_round, sigma, rounds, delta) -> None:
    ours = accounting.Accountant(num_clients, per_round, sigma, delta)
    assert ours.epsilon(rounds) == pytest.approx(_direct_epsilon(num_clients, per_round, sigma, rounds, delta),
                                                 rel=1e-12)
    assert ours.epsilon(0) == 0.0


def _plain_epsilon(num_clients: int, per_round: int, sigma: float, rounds: int, delta: float, seed: int = 0) -> float:
    """The plain composition over the most-selected client's participations: dp-accounting's RDP
    accountant, replace-one, the Gaussian of multiplier σ/2 composed max_k c_k times, no sampling."""
    most = max(Counter(c for r in range(rounds)
                       for c in sample_clients(seed, r, num_clients, per_round / num_clients)).values())
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma / 2), most))
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("num_clients, per_round, sigma, rounds", [(100, 10, 0.5, 10), (100, 10, 1.1, 100),
                                                                   (10, 5, 0.8, 20), (6, 3, 0.8, 3)])
def test_with_fixed_size_sampling_epsilon_is_the_smaller_of_the_amplified_and_the_worst_clients_plain_bound(
        num_clients, per_round, sigma, rounds) -> None:
    """The server's accountant (server_codec, seed 0's selection): ε equals min(the amplified RDP
    bound, the plain composition over the most-selected client's rounds), both from dp-accounting
    directly, so never above the amplified bound it reported before; at σ = 0.5, 10 of 100 clients,
    10 rounds the plain bound wins (81.1 against 131)."""
    config = _config(f"privacy.noise_multiplier={sigma}", "privacy.clip_norm=1", "privacy.delta=1e-5")
    codec = server_codec(config.privacy, 0, num_clients, per_round)
    amplified = _direct_epsilon(num_clients, per_round, sigma, rounds, 1e-5)
    plain = _plain_epsilon(num_clients, per_round, sigma, rounds, 1e-5)
    assert codec.epsilon(rounds) == pytest.approx(min(amplified, plain), rel=1e-12)
    assert codec.epsilon(rounds) <= amplified * (1 + 1e-12)
    if (num_clients, sigma, rounds) == (100, 0.5, 10):
        assert plain < amplified


def test_full_participation_is_the_gaussian_alone_within_the_classic_rdp_bound() -> None:
    """m = n: no subsampling event; ε is at most the classic conversion of the Gaussian's RDP,
    min over α of T·α / (2 s²) + log(1/δ) / (α − 1), s = σ/2 (Mironov 2017, Proposition 3)."""
    sigma, rounds, delta = 4.0, 20, 1e-5
    assert accounting.round_event(10, 10, sigma) == dp_accounting.GaussianDpEvent(sigma / 2)
    s = sigma / 2
    classic = min(rounds * a / (2 * s * s) + math.log(1 / delta) / (a - 1) for a in np.linspace(1.01, 256, 20000))
    epsilon = accounting.Accountant(10, 10, sigma, delta).epsilon(rounds)
    assert 0 < epsilon <= classic


def test_epsilon_grows_with_rounds_and_falls_with_sigma() -> None:
    by_rounds = [accounting.Accountant(100, 10, 1.0, 1e-5).epsilon(t) for t in (1, 5, 20, 100)]
    assert all(a < b for a, b in zip(by_rounds, by_rounds[1:]))
    by_sigma = [accounting.Accountant(100, 10, s, 1e-5).epsilon(20) for s in (0.5, 1.0, 2.0, 4.0)]
    assert all(a > b for a, b in zip(by_sigma, by_sigma[1:]))
    subsampled, full = (accounting.Accountant(100, m, 1.0, 1e-5).epsilon(20) for m in (10, 100))
    assert subsampled < full


# the estimator and its noise -------------------------------------------------------------------
def _uploads(deltas: list[dict[str, torch.Tensor]], reference: dict[str, torch.Tensor]) -> list[Upload]:
    return [Upload(i, {k: reference[k] + d[k] if k in d else reference[k] for k in reference}, 10 * (i + 1), 1, 0.1, 0.0)
            for i, d in enumerate(deltas)]


def test_without_noise_the_estimator_is_the_uniform_sum_over_the_expected_count() -> None:
    """σ = 0: w̄ + Σ_k Δ_k / m with m the clients a round samples, whatever the sample counts and
    however many replied (a dropped client changes no other's weight); entries that never travel and
    integer entries stay at w̄."""
    generator = torch.Generator().manual_seed(0)
    reference = {"w": torch.randn(3, 4, generator=generator), "head": torch.randn(2, generator=generator),
                 "count": torch.tensor(5)}
    deltas = [{"w": torch.randn(3, 4, generator=generator), "head": torch.randn(2, generator=generator)}
              for _ in range(3)]
    uploads = _uploads(deltas, reference)
    codec = GaussianCodec(1e9, 0.0, per_round=4, seed=0)
    got = codec.round_combine(0, reference, {"head"}, {})(uploads, None, None)
    want = reference["w"].double() + sum(d["w"].double() for d in deltas) / 4
    torch.testing.assert_close(got["w"], want.float(), rtol=0, atol=1e-6)
    assert got["head"] is reference["head"] and got["count"] is reference["count"]
    with pytest.raises(ValueError, match="alike"):
        codec.round_combine(0, reference, set(), {})(uploads, ["w"], [0.2, 0.3, 0.5])
    with pytest.raises(TypeError):
        codec.combine(uploads)
    assert codec.epsilon(3) is None and UpdateCodec().epsilon(3) is None


def test_the_noise_on_the_sum_has_std_sigma_c_and_mean_zero_and_is_seeded() -> None:
    """Every client sends w̄ itself, so m · (w̄' − w̄) is the noise on the sum: over 200 000
    coordinates its std is σ·C within 1 % (the sample std's own std is σC/√(2N) ≈ 0.16 %) and its
    mean 0 within 5 standard errors; the same (seed, round) draws the same noise, another round or
    seed other noise."""
    sigma, bound, m = 1.3, 0.7, 5
    reference = {"w": torch.full((400, 500), 0.25, dtype=torch.float64)}
    uploads = _uploads([{}] * 3, reference)
    codec = GaussianCodec(bound, sigma, per_round=m, seed=11)

    def noise(c: GaussianCodec, rnd: int) -> torch.Tensor:
        return (c.round_combine(rnd, reference, set(), {})(uploads, None, None)["w"] - reference["w"]) * m

    draw = noise(codec, 2)
    assert float(draw.std()) == pytest.approx(sigma * bound, rel=0.01)
    assert abs(float(draw.mean())) < 5 * sigma * bound / math.sqrt(draw.numel())
    assert torch.equal(draw, noise(GaussianCodec(bound, sigma, per_round=m, seed=11), 2))
    assert not torch.equal(draw, noise(codec, 3))
    assert not torch.equal(draw, noise(GaussianCodec(bound, sigma, per_round=m, seed=12), 2))


def test_server_codec_follows_the_privacy_section() -> None:
    assert type(server_codec(_config().privacy, 0, 6, 3)) is UpdateCodec
    codec = server_codec(_config(*PRIVATE).privacy, 7, 6, 3)
    assert isinstance(codec, GaussianCodec)
    assert (codec.clip_norm, codec.noise_multiplier, codec.per_round, codec.seed) == (0.5, 0.8, 3, 7)
    assert codec.epsilon(3) == pytest.approx(_direct_epsilon(6, 3, 0.8, 3, 1e-4), rel=1e-12)


# on the backends -------------------------------------------------------------------------------
def _same(a: simulation.Setup, b: simulation.Setup) -> bool:
    return all(torch.equal(a.server.global_state[k], v) for k, v in b.server.global_state.items())


@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_sigma_zero_without_clipping_is_the_plain_run_bit_for_bit(backend: str) -> None:
    plain = _setup(_config(), TRAINERS[backend])
    zero = _setup(_config("privacy.noise_multiplier=0", "privacy.delta=0.01"), TRAINERS[backend])
    lines = [[simulation.run_round(s, rnd) for rnd in range(3)] for s in (plain, zero)]
    assert _same(plain, zero)
    assert [x["train_loss"] for x in lines[0]] == [x["train_loss"] for x in lines[1]]
    assert not any("privacy_epsilon" in x for x in lines[1])


def test_sigma_zero_without_clipping_is_the_plain_stacked_run_bit_for_bit() -> None:
    plain = run_stacked([_config(), _config("seed=1")], _setup)
    zero = run_stacked([_config("privacy.noise_multiplier=0", "privacy.delta=0.01"),
                        _config("seed=1", "privacy.noise_multiplier=0", "privacy.delta=0.01")], _setup)
    assert all(_same(a, b) for a, b in zip(plain, zero))


def test_private_backends_agree_and_stacked_runs_equal_runs_alone() -> None:
    """The noise is the server's, seeded by (seed, round): the simulation and vectorized backends
    draw the same and agree up to float rounding of the trained updates; a stack of two private
    runs gives each run's weights alone."""
    config = _config(*PRIVATE)
    alone = run_on_each_backend(config, _setup, TRAINERS)
    other = dataclasses.replace(config, seed=1)
    stacked = run_stacked([config, other], _setup)
    single = _setup(other, lockstep_update)
    for rnd in range(2):
        simulation.run_round(single, rnd)
    for got, want in zip(stacked, [alone["vectorized"], single]):
        for k, v in want.server.global_state.items():
            torch.testing.assert_close(got.server.global_state[k], v, atol=2e-5, rtol=1e-4, msg=k)


@pytest.mark.parametrize("backend", ["simulation", "vectorized"])
def test_a_private_digits_run_writes_epsilon_every_round(backend: str, tmp_path: Path) -> None:
    """A short DP run completes on each embedded backend, writes ε at δ after every round (the
    accountant's, growing), the last one in summary.json; run again, it gives the same numbers."""
    config = _config(*PRIVATE, f'backend="{backend}"')
    summaries, lines = [], []
    for name in ("a", "b"):
        summaries.append(fedlatent.run(config, tmp_path / name))
        lines.append([json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()])
    epsilons = [x["privacy_epsilon"] for x in lines[0]]
    want = [_direct_epsilon(6, 3, 0.8, r, 1e-4) for r in (1, 2, 3)]
    assert epsilons == pytest.approx(want, rel=1e-12) and epsilons == sorted(epsilons)
    assert summaries[0]["status"] == "completed" and summaries[0]["privacy_epsilon"] == epsilons[-1]
    assert summaries[0]["privacy_delta"] == 1e-4
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["privacy_epsilon"] == epsilons[-1]
    for key in ("train_loss", "test_accuracy", "privacy_epsilon"):
        assert [x[key] for x in lines[0]] == [x[key] for x in lines[1]], key


# refusals --------------------------------------------------------------------------------------
BAD = {
    "negative sigma": (["privacy.noise_multiplier=-0.5"], "privacy.noise_multiplier"),
    "delta zero": (["privacy.delta=0"], "privacy.delta"),
    "delta one": (["privacy.delta=1"], "privacy.delta"),
    "delta above one": (["privacy.delta=2.5"], "privacy.delta"),
    "clip zero": (["privacy.clip_norm=0"], "privacy.clip_norm"),
    "noise without a bound": (["privacy.noise_multiplier=1"], "finite privacy.clip_norm"),
    "scaffold": (['algorithm.name="scaffold"', *PRIVATE], "part 'scaffold' uploads extras"),
    "feddyn": (['algorithm.name="feddyn"', *PRIVATE], "part 'feddyn'"),
    "fednova": (['algorithm.name="fednova"', *PRIVATE], "part 'fednova'"),
    "ffc": (['algorithm.name="spherefed"', *PRIVATE], "ffc calibration's statistics"),
    "ccvr": (['algorithm.name="ccvr"', *PRIVATE], "ccvr calibration's statistics"),
    "batchnorm": (['model.arch="resnet18"', *PRIVATE], "running statistics would travel in the update"),
    "batchnorm only": (['data.dataset="cifar10"', 'model.arch="cifar_convnet"', *PRIVATE], "no GroupNorm variant"),
    # σ = inf passes a range check and would make round 1's model infinite; nan compares false with any bound
    "infinite sigma": (["privacy.clip_norm=1", "privacy.noise_multiplier=inf"],
                       "privacy.noise_multiplier = inf: must be a finite number"),
    "nan sigma": (["privacy.clip_norm=1", "privacy.noise_multiplier=nan"], "privacy.noise_multiplier = nan"),
    "infinite sample sigma": (["privacy.sample_clip_norm=1", "privacy.sample_noise_multiplier=inf"],
                              "privacy.sample_noise_multiplier = inf"),
    "infinite statistics sigma": ([*PRIVATE, "privacy.statistics_noise_multiplier=inf"],
                                  "privacy.statistics_noise_multiplier = inf"),
    "infinite count noise": (["privacy.clip_norm=1", "privacy.target_quantile=0.5", "privacy.clip_count_noise=inf"],
                             "privacy.clip_count_noise = inf"),
    # the quantile's bound says what it enforces: 1 itself is refused, and so is 1.5, by the same words
    "quantile one": (["privacy.clip_norm=1", "privacy.target_quantile=1"], "privacy.target_quantile = 1.0: must be < 1.0"),
    "quantile above one": (["privacy.clip_norm=1", "privacy.target_quantile=1.5"],
                           "privacy.target_quantile = 1.5: must be < 1.0"),
    "unknown randomness": (['privacy.randomness="os"'], "privacy.randomness"),
    # per-client releases computed from un-noised updates or data, outside ε
    "client diagnostics": ([*PRIVATE, 'diagnostics.which=["alignment"]', "diagnostics.clients=true"],
                           "diagnostics.clients = true (each local model: the un-noised upload)"),
    "tsne": ([*PRIVATE, 'diagnostics.which=["tsne"]'], "'tsne' (the clients' features): a per-client release"),
    "data figures": ([*PRIVATE, 'diagnostics.which=["data"]'], "'data' (each client's label counts"),
    "step trace": ([*PRIVATE, "diagnostics.trace_terms=true"], "diagnostics.trace_terms = true"),
    "tsne under dp-sgd": (["privacy.sample_clip_norm=1", "privacy.sample_noise_multiplier=1",
                           'privacy.batch_sampling="poisson"', 'diagnostics.which=["tsne"]'],
                          "privacy.sample_noise_multiplier > 0 with diagnostics.which 'tsne'"),
}


def _exits_2(overrides: list[str], tmp_path: Path, capsys) -> str:
    out = tmp_path / "run"
    args = [a for o in [*SMALL, *overrides] for a in ("--set", o)]
    assert main(["run", str(CONFIG), "--no-progress", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert not out.exists()
    return err


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_privacy_setting_exits_2_in_one_line_before_any_run_folder(case: str, tmp_path: Path, capsys) -> None:
    overrides, message = BAD[case]
    assert message in _exits_2(overrides, tmp_path, capsys)


def test_batchnorm_kept_on_the_clients_or_replaced_by_groupnorm_is_accepted_under_noise() -> None:
    """The refusal names two ways out, and both pass validation: FedBN keeps every BatchNorm layer
    (statistics included) on its client, so none travels; GroupNorm keeps no running statistics."""
    for extra in (['algorithm.name="fedbn"'], ['model.norm="group"']):
        config = _config(*PRIVATE, 'model.arch="resnet18"', *extra)
        check_model_fit(config, validate(config), (1, 8, 8), 10)
    with pytest.raises(ConfigError, match="fedbn"):
        config = _config(*PRIVATE, 'model.arch="resnet18"')
        check_model_fit(config, validate(config), (1, 8, 8), 10)


def test_without_the_extra_a_plain_run_works_and_a_private_one_names_it(tmp_path: Path) -> None:
    """dp-accounting made unimportable in a fresh process: the package imports and runs without
    it; a private run exits 2 in one line naming the extra, before any run folder."""
    script = ("import sys; sys.modules['dp_accounting'] = None\n"
              "from fedlatent.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    env = {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-c", script, "run", str(CONFIG), "--no-progress", "--set", "train.rounds=1"]
    plain = subprocess.run([*base, "--out", str(tmp_path / "plain")], capture_output=True, text=True, env=env)
    assert plain.returncode == 0, plain.stderr
    private = subprocess.run([*base, *[a for o in PRIVATE for a in ("--set", o)], "--out", str(tmp_path / "dp")],
                             capture_output=True, text=True, env=env)
    assert private.returncode == 2
    assert private.stderr.strip().count("\n") == 0 and "fedlatent[privacy]" in private.stderr
    assert not (tmp_path / "dp").exists()


# a private run stopped and resumed ----------------------------------------------------------------
RESUMED = {"simulation": ['backend="simulation"'], "vectorized": ['backend="vectorized"'],
           # FFC after every round and at the end: each calibration a release the accountant counts
           "ffc": ['backend="simulation"', 'algorithm.name="spherefed"', "algorithm.ffc_every=1",
                   "privacy.statistics_clip_norm=50", "privacy.statistics_noise_multiplier=4"]}


@pytest.mark.parametrize("case", sorted(RESUMED))
def test_a_private_run_stopped_after_two_rounds_and_resumed_ends_as_the_uninterrupted_one(
        case: str, tmp_path: Path, crash_at_round_2, monkeypatch: pytest.MonkeyPatch) -> None:
    """DP-FedAvg (σ > 0, fixed clip) stopped after two of four rounds and resumed: the same global
    and server state in the last checkpoint, the same metrics lines (ε at δ in each) and the same
    final evaluation and ε in summary.json as the run never stopped — the noise of rounds 3 and 4
    drawn from (seed, round), not from where a process started."""
    from safetensors.torch import load_file

    config = _config(*PRIVATE, "train.rounds=4", *RESUMED[case])
    with pytest.raises(KeyboardInterrupt):
        fedlatent.run(config, tmp_path / "stopped")
    assert json.loads((tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()[-1])["round"] == 2
    monkeypatch.undo()
    whole = fedlatent.run(config, tmp_path / "whole")
    resumed = fedlatent.run(config, tmp_path / "stopped", resume=True)
    lines = {run: [{k: v for k, v in json.loads(x).items() if not k.startswith("time_")}
                   for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()] for run in ("stopped", "whole")}
    assert lines["stopped"] == lines["whole"] and len(lines["whole"]) == 4
    epsilons = [x["privacy_epsilon"] for x in lines["whole"]]
    assert epsilons == sorted(epsilons) and epsilons[0] > 0
    assert resumed["final"] == whole["final"]
    assert resumed["privacy_epsilon"] == whole["privacy_epsilon"] >= epsilons[-1]
    for name in ("global.safetensors", "server.safetensors"):
        a, b = (load_file(str(tmp_path / run / "checkpoints" / "round00004" / name)) for run in ("stopped", "whole"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
