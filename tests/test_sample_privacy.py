"""Sample-level DP-SGD (``federated.sample_dp``, ``losses.dp_sgd``, ``federated.accounting.SampleAccountant``):
per-sample gradients against a float64 loop over samples, the clip and the noise by construction,
Poisson batches, ε against dp-accounting called directly, the plain run untouched, short private
runs on every embedded backend repeating to the bit, and the bad settings refused in one line
before any run folder exists."""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.cli import main
from fedlatent.data.federation import build_federation
from fedlatent.federated import sample_dp
from fedlatent.federated.accounting import SampleAccountant
from fedlatent.federated.client import LocalSettings
from fedlatent.federated.trainer.schedule import poisson_batches, poisson_rate, poisson_steps
from fedlatent.federated.trainer import lockstep_update
from fedlatent.federated.round import plan_round, sample_clients
from fedlatent.losses.dp_sgd import clip_factors, private_gradient, sample_norms
from fedlatent.methods.parts import ClientRound, task_loss
from fedlatent.models.convnet7 import build as convnet7
from fedlatent.models.mlp import build as mlp
from tests.private_runs import CONFIG, SMALL, TRAINERS
from tests.private_runs import set_up as _setup
from tests.private_runs import small_config as _config
from tests.stacked_runs import run_on_each_backend, run_stacked

dp_accounting = pytest.importorskip("dp_accounting", reason="the privacy extra (pip install 'fedlatent[privacy]')")

PRIVATE = ["privacy.sample_clip_norm=0.7", "privacy.sample_noise_multiplier=1.1", 'privacy.batch_sampling="poisson"',
           "privacy.delta=1e-4"]




def _same(a: simulation.Setup, b: simulation.Setup) -> bool:
    return all(torch.equal(a.server.global_state[k], v) for k, v in b.server.global_state.items())


def _settings(**kw) -> LocalSettings:
    base = dict(epochs=1, batch_size=8, lr=0.1, momentum=0.0, weight_decay=0.0, drop_last=False, augment=False,
                num_classes=10, sample_clip_norm=0.5)
    return LocalSettings(**{**base, **kw})


def _rounds(count: int, seed: int = 0, rnd: int = 0) -> list[ClientRound]:
    return [ClientRound(c, None, {}, {}, {}, 0.1, 40, count, 40 * count, 0.0, seed=seed, round=rnd)
            for c in range(count)]


# per-sample gradients ---------------------------------------------------------------------------
def _loop_gradients(model: torch.nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                    loss: str) -> dict[str, torch.Tensor]:
    """Each sample's gradient in float64, one sample after another through the module's own forward."""
    reference = copy.deepcopy(model).double()
    out: dict[str, list[torch.Tensor]] = {n: [] for n, _ in reference.named_parameters()}
    for c in range(x.shape[0]):
        reference.load_state_dict({n: v[c].double() for n, v in params.items()})
        for i in range(x.shape[1]):
            value = task_loss(loss, reference(x[c, i:i + 1].double()).logits, y[c, i:i + 1])
            for (n, _), g in zip(reference.named_parameters(),
                                 torch.autograd.grad(value, list(reference.parameters()))):
                out[n].append(g)
    return {n: torch.stack(gs).unflatten(0, x.shape[:2]) for n, gs in out.items()}


@pytest.mark.parametrize("arch, loss", [("mlp", "ce"), ("mlp", "mse"), ("convnet7", "ce")])
def test_per_sample_gradients_equal_a_float64_loop_over_samples(arch: str, loss: str) -> None:
    """torch.func's per-sample gradients of two stacked clients (their own weights each), and of one
    client alone, equal each sample's gradient taken alone in float64; a GroupNorm convolutional net
    as well."""
    torch.manual_seed(0)
    if arch == "mlp":
        model, shape = mlp((1, 8, 8), 10, hidden=[16, 12]), (1, 8, 8)
    else:
        model, shape = convnet7((3, 32, 32), 10, norm="group"), (3, 32, 32)
    params = {n: torch.stack([p.detach(), p.detach() + 0.05 * torch.randn_like(p)]) for n, p in model.named_parameters()}
    x, y = torch.randn(2, 3, *shape), torch.randint(0, 10, (2, 3))
    per_sample = sample_dp.per_sample_gradients(model, loss, 1.0)
    grads, losses = per_sample(params, {}, x, y)
    alone, _ = per_sample({n: v[1:] for n, v in params.items()}, {}, x[1:], y[1:])  # a group of one
    want = _loop_gradients(model, params, x, y, loss)
    for n, g in want.items():
        torch.testing.assert_close(grads[n].double(), g, atol=2e-5, rtol=1e-4, msg=n)
        torch.testing.assert_close(alone[n].double(), g[1:], atol=2e-5, rtol=1e-4, msg=n)
    assert losses.shape == (2, 3)


def test_each_clipped_per_sample_gradient_has_norm_at_most_c() -> None:
    """min(1, C/‖g_i‖)·g_i: norm C where ‖g_i‖ > C, the gradient itself below (and a zero gradient
    stays zero); the norm is over every weight together."""
    generator = torch.Generator().manual_seed(1)
    per_sample = [torch.randn(2, 50, 4, 3, generator=generator) * torch.rand(2, 50, 1, 1, generator=generator) * 4,
                  torch.randn(2, 50, 5, generator=generator)]
    per_sample[0][0, 0], per_sample[1][0, 0] = 0.0, 0.0
    bound = 3.0
    norms = sample_norms(per_sample)
    want = torch.cat([g.flatten(2) for g in per_sample], 2).double().norm(dim=2)
    torch.testing.assert_close(norms.double(), want, rtol=1e-6, atol=0)
    clipped = clip_factors(per_sample, bound) * norms
    assert bool((clipped <= bound * (1 + 1e-6)).all())
    over = norms > bound
    assert 0 < int(over.sum()) < over.numel()
    torch.testing.assert_close(clipped[over], torch.full_like(clipped[over], bound))
    torch.testing.assert_close(clipped[~over], norms[~over])
    assert float(clip_factors(per_sample, bound)[0, 0]) == 1.0


def test_the_private_gradient_is_the_clipped_sum_over_the_denominator() -> None:
    """Without noise: Σ_i w_i min(1, C/‖g_i‖) g_i / L per client, in float64 by hand (padding rows
    weighted 0, each client its own denominator)."""
    generator = torch.Generator().manual_seed(2)
    per_sample = [torch.randn(2, 4, 3, generator=generator), torch.randn(2, 4, generator=generator)]
    weights = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
    denominators = torch.tensor([8.0, 5.0])
    got = private_gradient(per_sample, 1.5, weights, denominators)
    for c in range(2):
        for k, g in enumerate(per_sample):
            total = torch.zeros(g.shape[2:], dtype=torch.float64)
            for i in range(4):
                norm = math.sqrt(sum(float(h[c, i].double().square().sum()) for h in per_sample))
                total += float(weights[c, i]) * min(1.0, 1.5 / norm) * g[c, i].double()
            torch.testing.assert_close(got[k][c].double(), total / float(denominators[c]), atol=1e-6, rtol=0)


def test_the_noise_has_std_sigma_c_over_b_and_repeats_for_its_seed() -> None:
    """A step whose rows are all padding (weight 0) is the noise alone over the denominator: over
    ~100 000 draws its std is σ·C/B within 1.5 % and its mean 0 within 5 standard errors (Poisson:
    B the expected batch size, b); the same (seed, round, client) draws the same noise, another
    round or client other noise, and the personal model's stream is another one."""
    sigma, bound, b = 1.3, 0.6, 8
    model = mlp((1, 8, 8), 10, hidden=[100])
    s = _settings(batch_size=b, sample_clip_norm=bound, sample_noise_multiplier=sigma, poisson=True)
    params = {n: p.detach().unsqueeze(0).expand(2, *p.shape) for n, p in model.named_parameters()}
    x, y, weights = torch.randn(2, 3, 1, 8, 8), torch.randint(0, 10, (2, 3)), torch.zeros(2, 3)
    trainable = list(params)

    def draws(rcs: list[ClientRound], which: int = sample_dp.GLOBAL, steps: int = 10) -> torch.Tensor:
        private = sample_dp.PrivateGradients(model, "ce", 1.0, s, rcs, [100, 100], trainable, which)
        return torch.stack([torch.cat([g.flatten(1) for g in private(params, [0, 1], x, y, weights, [0, 0])[0]], 1)
                            for _ in range(steps)])

    noise = draws(_rounds(2, seed=5, rnd=3))
    assert noise.numel() > 100_000
    assert float(noise.std()) == pytest.approx(sigma * bound / b, rel=0.015)
    assert abs(float(noise.mean())) < 5 * sigma * bound / b / math.sqrt(noise.numel())
    assert torch.equal(noise, draws(_rounds(2, seed=5, rnd=3)))
    assert not torch.equal(noise[:, 0], noise[:, 1])
    assert not torch.equal(noise, draws(_rounds(2, seed=5, rnd=4)))
    assert not torch.equal(noise, draws(_rounds(2, seed=5, rnd=3), sample_dp.PERSONAL))


def test_poisson_batches_take_each_sample_with_probability_q() -> None:
    """Each sample joins each of the round's batches with probability q = b / n (the number of
    batches ⌈n / b⌉ an epoch, or the step budget): its empirical frequency within 5 standard errors;
    the batch sizes' mean within 5 standard errors of b; empty batches come as empty index tensors."""
    n, b = 50, 4
    s = _settings(batch_size=b, epochs=200, poisson=True)
    batches = poisson_batches(n, s, torch.Generator().manual_seed(3), offset=100)
    assert len(batches) == poisson_steps(n, b, 200, 0) == 200 * 13
    counts = torch.bincount(torch.cat(batches) - 100, minlength=n).double() / len(batches)
    q = poisson_rate(n, b)
    assert q == b / n and poisson_rate(3, b) == 1.0 and poisson_rate(0, b) == 0.0
    error = math.sqrt(q * (1 - q) / len(batches))
    assert float((counts - q).abs().max()) < 5 * error
    sizes = torch.tensor([len(x) for x in batches], dtype=torch.float64)
    assert abs(float(sizes.mean()) - b) < 5 * math.sqrt(n * q * (1 - q) / len(batches))
    assert any(len(x) == 0 for x in batches)
    assert poisson_steps(n, b, 3, 7) == 7 and poisson_steps(0, b, 3, 7) == 0


# the accountant -------------------------------------------------------------------------------
@functools.cache
def _direct_epsilon(rate: float, sigma: float, steps: int, delta: float) -> float:
    """dp-accounting's RDP accountant called directly: add-or-remove-one, each step the Gaussian of
    multiplier σ on a Poisson sample of rate q, composed ``steps`` times (none: 0)."""
    if not steps:
        return 0.0
    event = dp_accounting.GaussianDpEvent(sigma)
    if rate < 1:
        event = dp_accounting.PoissonSampledDpEvent(rate, event)
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("sizes, batch, epochs, budget, sigma, delta",
                         [([100, 37, 250, 0], 16, 2, 0, 1.1, 1e-5), ([60, 60, 12], 32, 1, 5, 0.8, 1e-3)])
def test_sample_epsilon_equals_the_accountant_called_directly(sizes, batch, epochs, budget, sigma, delta) -> None:
    """Each client's ε after r rounds: its c_k(r) selections × T_k steps of the Poisson-sampled
    Gaussian, composed by dp-accounting directly; the reported ε is the largest; a client never
    selected or without data has spent none."""
    plan = {0: [0, 1], 1: [1, 2], 2: [0, 1], 3: [2]}
    ours = SampleAccountant(sizes, batch, epochs, budget, sigma, delta, lambda rnd: plan[rnd])
    assert ours.epsilon(0) == 0.0
    for rounds in (1, 4):
        counts = [sum(k in plan[r] for r in range(rounds)) for k in range(len(sizes))]
        want = [_direct_epsilon(poisson_rate(n, batch), sigma, c * poisson_steps(n, batch, epochs, budget), delta)
                for n, c in zip(sizes, counts)]
        assert ours.epsilons(rounds) == pytest.approx(want, rel=1e-9)
        assert ours.epsilon(rounds) == max(want)


def test_sample_epsilon_falls_with_sigma_and_grows_with_rounds() -> None:
    def accountant(sigma: float) -> SampleAccountant:
        return SampleAccountant([200] * 4, 20, 1, 0, sigma, 1e-5, lambda rnd: [0, 1, 2, 3])
    by_rounds = [accountant(1.0).epsilon(r) for r in (1, 5, 20)]
    assert by_rounds == sorted(by_rounds) and len(set(by_rounds)) == 3
    by_sigma = [accountant(s).epsilon(10) for s in (0.7, 1.0, 2.0)]
    assert by_sigma == sorted(by_sigma, reverse=True) and len(set(by_sigma)) == 3


# on the backends -------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_no_clip_and_no_noise_is_the_plain_run_bit_for_bit(backend: str) -> None:
    plain = _setup(_config(), TRAINERS[backend])
    off = _setup(_config("privacy.sample_clip_norm=inf", "privacy.sample_noise_multiplier=0"), TRAINERS[backend])
    lines = [[simulation.run_round(s, rnd) for rnd in range(2)] for s in (plain, off)]
    assert _same(plain, off)
    assert [x["train_loss"] for x in lines[0]] == [x["train_loss"] for x in lines[1]]
    assert not any("sample_level_epsilon" in x for x in lines[1])


def test_clipping_beyond_every_norm_is_the_plain_step_up_to_rounding() -> None:
    """Per-sample gradients summed over the batch size, none clipped, are the batch's mean gradient:
    a run clipped at 10⁹ without noise (shuffled batches, as the plain run's) gives its weights up to
    float rounding, on both backends."""
    for trainer in TRAINERS.values():
        plain, clipped = _setup(_config(), trainer), _setup(_config("privacy.sample_clip_norm=1e9"), trainer)
        for s in (plain, clipped):
            for rnd in range(2):
                simulation.run_round(s, rnd)
        for k, v in plain.server.global_state.items():
            torch.testing.assert_close(clipped.server.global_state[k], v, atol=1e-6, rtol=1e-5, msg=k)


def test_empty_poisson_batches_train_alike_alone_and_stacked() -> None:
    """Batches of expected size 1 (q = 1 / n_k: most of them empty, each then a stand-in row weighted
    0, the noise alone): the simulation and vectorized backends agree, and every client takes the
    T_k steps the accountant counts."""
    config = _config(*PRIVATE, "train.batch_size=1", "train.local_steps=12")
    outcomes = {}
    for name, trainer in TRAINERS.items():
        s = _setup(config, trainer)
        outcomes[name], _ = s.train(plan_round(s.server, config, 0, s.train_sizes))
    assert [u.steps for u in outcomes["simulation"]] == [12] * 3 == [u.steps for u in outcomes["vectorized"]]
    for a, b in zip(outcomes["simulation"], outcomes["vectorized"]):
        for k, v in a.state.items():
            torch.testing.assert_close(b.state[k], v, atol=1e-5, rtol=1e-4, msg=k)


@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_a_private_digits_run_writes_its_epsilon_every_round_and_repeats(backend: str, tmp_path: Path) -> None:
    """A short DP-SGD run completes on each embedded backend, writes the worst client's ε after every
    round (dp-accounting's, for the clients the rounds selected), beside no client-level key, and the
    last in summary.json; run again, it gives the same numbers to the bit."""
    config = _config(*PRIVATE, f'backend="{backend}"')
    summaries, lines = [], []
    for name in ("a", "b"):
        summaries.append(fedlatent.run(config, tmp_path / name))
        lines.append([json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()])
    sizes = [len(c.train) for c in build_federation(config.data, config.data_seed).clients]
    want = []
    for rounds in (1, 2, 3):
        counts = [sum(k in sample_clients(0, r, 6, 0.5) for r in range(rounds)) for k in range(6)]
        want.append(max(_direct_epsilon(poisson_rate(n, 32), 1.1, c * poisson_steps(n, 32, 1, 0), 1e-4)
                        for n, c in zip(sizes, counts)))
    epsilons = [x["sample_level_epsilon"] for x in lines[0]]
    assert epsilons == pytest.approx(want, rel=1e-9) and epsilons == sorted(epsilons)
    assert not any("privacy_epsilon" in x for x in lines[0])
    assert summaries[0]["status"] == "completed" and summaries[0]["sample_level_epsilon"] == epsilons[-1]
    assert summaries[0]["sample_level_delta"] == 1e-4 and "privacy_epsilon" not in summaries[0]
    for key in ("train_loss", "test_accuracy", "sample_level_epsilon"):
        assert [x[key] for x in lines[0]] == [x[key] for x in lines[1]], key


def test_private_runs_agree_across_backends_and_a_stack_repeats_to_float32_rounding() -> None:
    """The noise is each client's own stream: simulation and vectorized agree up to float rounding;
    a stack of two private runs (other seeds, other noise) repeats — the same noise, the same
    weights, to one rounding of float32 (a CPU's vectorised sum can round its last bit by where
    the tensor lies in memory: 7.5e-9 in a bias, in about one repeat of ten, as at a32049f) — and
    gives each run's weights alone; FedProx's proximal term and Ditto's personal model train
    privately too."""
    config = _config(*PRIVATE, 'algorithm.name="fedprox"')
    alone = run_on_each_backend(config, _setup, TRAINERS)
    other = dataclasses.replace(config, seed=1)
    stacks = [run_stacked([config, other], _setup) for _ in range(2)]
    for first, again in zip(*stacks):
        for k, v in again.server.global_state.items():
            torch.testing.assert_close(first.server.global_state[k], v, atol=1e-7, rtol=1e-6, msg=k)
    single = _setup(other, lockstep_update)
    for rnd in range(2):
        simulation.run_round(single, rnd)
    for got, want in zip(stacks[0], [alone["vectorized"], single]):
        for k, v in want.server.global_state.items():
            torch.testing.assert_close(got.server.global_state[k], v, atol=2e-5, rtol=1e-4, msg=k)
    run_on_each_backend(_config(*PRIVATE, 'algorithm.name="ditto"'), _setup, TRAINERS)


# refusals --------------------------------------------------------------------------------------
BAD = {
    "negative clip": (["privacy.sample_clip_norm=-1"], "privacy.sample_clip_norm"),
    "zero clip": (["privacy.sample_clip_norm=0"], "privacy.sample_clip_norm"),
    "nan clip": (["privacy.sample_clip_norm=nan"], "privacy.sample_clip_norm = nan"),
    "negative sigma": (["privacy.sample_noise_multiplier=-0.5"], "privacy.sample_noise_multiplier"),
    "nan sigma": (["privacy.sample_noise_multiplier=nan"], "privacy.sample_noise_multiplier = nan"),
    "noise without a bound": (["privacy.sample_noise_multiplier=1", 'privacy.batch_sampling="poisson"'],
                              "finite privacy.sample_clip_norm"),
    "noise on shuffled batches": (["privacy.sample_clip_norm=1", "privacy.sample_noise_multiplier=1"],
                                  "batch_sampling = 'poisson'"),
    "poisson without a bound": (['privacy.batch_sampling="poisson"'], "finite privacy.sample_clip_norm"),
    "batchnorm": (["privacy.sample_clip_norm=1", 'model.arch="resnet18"'], "model.norm = 'group' (GroupNorm)"),
    "batchnorm projector": (["privacy.sample_clip_norm=1", 'model.arch="resnet18"', 'model.norm="group"',
                             "model.projector=16"], "model.projector = 0"),
    "batchnorm only": (["privacy.sample_clip_norm=1", 'data.dataset="cifar10"', 'model.arch="cifar_convnet"'],
                       "no GroupNorm variant"),
    "uniformity": (["privacy.sample_clip_norm=1", 'algorithm.name="feduv"'], "part 'uniformity' reads the batch"),
    "decorrelation": (["privacy.sample_clip_norm=1", 'algorithm.name="feddecorr"'], "reads the batch"),
    "moon": (["privacy.sample_clip_norm=1", 'algorithm.name="moon"'], "part 'moon' reads the batch"),
    "mmd": (["privacy.sample_clip_norm=1", 'algorithm.name="ditto_mkmmd"'], "reads the batch"),
    "fedrep": (["privacy.sample_clip_norm=1", 'algorithm.name="fedrep"'], "program trains around the trainer"),
    "apfl": (["privacy.sample_clip_norm=1", 'algorithm.name="apfl"'], "takes its own steps"),
    "perfedavg": (["privacy.sample_clip_norm=1", 'algorithm.name="perfedavg"'], "takes its own steps"),
    "pfedme": (["privacy.sample_clip_norm=1", 'algorithm.name="pfedme"'], "takes its own steps"),
    "fedala": (["privacy.sample_clip_norm=1", 'algorithm.name="fedala"'], "a round-start procedure on the client's data"),
    "ffc": (["privacy.sample_clip_norm=1", 'algorithm.name="spherefed"'], "ffc calibration's statistics"),
    "bf16": (["privacy.sample_clip_norm=1", 'train.precision="bf16"'], "float32"),
    "compile": (["privacy.sample_clip_norm=1", "train.compile=true"], "train.compile = false"),
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
def test_a_bad_sample_privacy_setting_exits_2_in_one_line_before_any_run_folder(case: str, tmp_path: Path,
                                                                                capsys) -> None:
    overrides, message = BAD[case]
    assert message in _exits_2(overrides, tmp_path, capsys)
