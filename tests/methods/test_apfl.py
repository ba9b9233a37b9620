"""APFL (``methods.apfl``): α fixed at 0 trains FedAvg's global model exactly, a float64 hand loop of
two rounds (w, v, α, the evaluated mixture), the α step and its clipping, resume, bad keys."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.func import functional_call
from torch.nn import functional as F

from fedlatent.backends import simulation
from fedlatent.cli import main
from fedlatent.data.federation import build_federation
from fedlatent.federated.client import PERSONAL, Workspace, prefixed
from fedlatent.federated.trainer.schedule import batches
from fedlatent.federated.trainer import lockstep_update
from fedlatent.federated.personal import client_model
from fedlatent.methods import resolve
from fedlatent.methods.apfl import ALPHA, ApflProgram
from fedlatent.seeding import LOCAL_TRAINING, derive_seed
from tests.methods.resume import resumed_equals_uninterrupted
from tests.conftest import in_float64
from tests.methods.test_ditto import small_config

TRAINERS = {"simulation": simulation.train_in_turn, "vectorized": lockstep_update}
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "digits_fedavg.toml"


def _rounds(config, trainer, float64: bool = False):
    """The setup after ``config.train.rounds`` rounds, its round lines and the initial global state."""
    before = torch.get_default_dtype()
    if float64:
        torch.set_default_dtype(torch.float64)
    try:
        fed = build_federation(config.data, config.data_seed)
        if float64:
            fed = in_float64(fed)
        s = simulation.setup(config, fed, resolve(config.algorithm, config.terms), trainer)
        initial = {k: v.clone() for k, v in s.server.global_state.items()}
        lines = [simulation.run_round(s, rnd) for rnd in range(config.train.rounds)]
    finally:
        torch.set_default_dtype(before)
    return s, lines, initial


@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_alpha_fixed_at_zero_trains_fedavgs_global_model_exactly(backend: str) -> None:
    fedavg, fedavg_lines, _ = _rounds(small_config("fedavg"), TRAINERS[backend])
    apfl, apfl_lines, _ = _rounds(small_config("apfl", alpha=0.0, adapt_alpha=False), TRAINERS[backend])
    for k, v in fedavg.server.global_state.items():
        torch.testing.assert_close(apfl.server.global_state[k], v, rtol=0, atol=0)
    assert [line["train_loss"] for line in apfl_lines] == [line["train_loss"] for line in fedavg_lines]
    for state in apfl.client_states:  # a personal model was trained beside it (the identity is not vacuous)
        assert float(state[ALPHA]) == 0.0 and prefixed(state, PERSONAL)


def _hand_loop(config, s, initial: dict, alpha0: float) -> tuple[dict, list[dict], list[float]]:
    """Algorithm 1 written out in float64 with plain SGD: per batch, from the values before the step,
    w −= η∇f(w), v −= η α ∇f(v̄), α = clip(α − η⟨v − w, ∇f(v̄)⟩, 0, 1), v̄ = αv + (1 − α)w; the
    global model the sample-weighted mean of the w's. Returns w̄, the v's and the α's."""
    t = config.train
    model = simulation.make_model(config, s.federation, s.spec).double()
    clients = s.federation.clients
    sizes = [len(c.train) for c in clients]
    w_bar = {k: v.clone() for k, v in initial.items()}
    personal: list[dict | None] = [None] * len(clients)
    alphas = [alpha0] * len(clients)

    def grad(weights: dict, x, y) -> dict:
        leaves = {k: v.detach().requires_grad_(True) for k, v in weights.items()}
        loss = F.cross_entropy(functional_call(model, leaves, (x,)).logits, y)
        return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))

    for rnd in range(t.rounds):
        trained = []
        for cid, client in enumerate(clients):
            w = dict(w_bar)
            v = personal[cid] or dict(w_bar)
            a = alphas[cid]
            generator = torch.Generator().manual_seed(derive_seed(config.seed, LOCAL_TRAINING, rnd, cid))
            for _ in range(t.local_epochs):
                for idx in batches(len(client.train), t.batch_size, t.drop_last, generator):
                    x, y = client.train.x[idx].double(), client.train.y[idx]
                    g_w = grad(w, x, y)
                    g_mix = grad({k: a * v[k] + (1 - a) * w[k] for k in w}, x, y)
                    g_a = float(sum((v[k] - w[k]).mul(g_mix[k]).sum() for k in w))
                    w, v = {k: w[k] - t.lr * g_w[k] for k in w}, {k: v[k] - t.lr * a * g_mix[k] for k in v}
                    a = min(1.0, max(0.0, a - t.lr * g_a))
            trained.append(w)
            personal[cid], alphas[cid] = v, a
        w_bar = {k: sum(w[k] * (n / sum(sizes)) for w, n in zip(trained, sizes)) for k in w_bar}
    return w_bar, personal, alphas


@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_two_rounds_match_a_float64_hand_loop(backend: str) -> None:
    config = small_config("apfl", alpha=0.3)
    config.train.momentum, config.train.weight_decay, config.train.lr = 0.0, 0.0, 0.2
    s, _, initial = _rounds(config, TRAINERS[backend], float64=True)
    w_bar, personal, alphas = _hand_loop(config, s, initial, 0.3)
    for k, v in w_bar.items():
        torch.testing.assert_close(s.server.global_state[k], v, rtol=0, atol=1e-10)
    assert len({round(a, 6) for a in alphas}) > 1 and all(a != 0.3 for a in alphas)  # α moved, per client
    for cid, state in enumerate(s.client_states):
        assert float(state[ALPHA]) == pytest.approx(alphas[cid], abs=1e-10)
        own = prefixed(state, PERSONAL)
        for k, v in personal[cid].items():
            torch.testing.assert_close(own[k], v, rtol=0, atol=1e-10)
        # evaluated on the mixture α v + (1 − α) w̄
        model = client_model(Workspace(s.workspace.model), s.spec, state, s.server.global_state, cid,
                             s.federation.clients[cid].train, None, torch.Generator())
        for k, value in model.state_dict().items():
            expected = alphas[cid] * personal[cid][k] + (1 - alphas[cid]) * w_bar[k]
            torch.testing.assert_close(value, expected.to(value.dtype), rtol=0, atol=1e-10)


class _Step:
    """The Step a program sees, reduced to what APFL's reads: a group of three clients."""

    def __init__(self, alpha: torch.Tensor, grad: torch.Tensor) -> None:
        self.data, self.lr, self.grad, self.trained = alpha, 2.0, grad, []
        self.w = {"p": torch.zeros(3, 2), "buffer": torch.zeros(3)}

    def rows(self, values):
        return values

    def put(self, values, rows):
        values.copy_(rows)

    def weights(self, copy):
        return self.w

    def objective(self, copy, weights=None):
        self.mixture = weights
        return None

    def train(self, copy, objective=None, extras=(), again=None):
        self.trained.append((copy, len(extras)))
        return [self.grad] if extras else []


def test_the_alpha_step_is_clipped_to_the_unit_interval_and_skips_a_non_finite_row() -> None:
    st = _Step(torch.tensor([0.9, 0.1, 0.5]), torch.tensor([-2.0, 3.0, float("nan")]))
    ApflProgram(0.5, adapt=True).step(st)
    assert st.trained == [("personal", 1), ("global", 0)]  # v's step (α's gradient with it), then w's
    assert st.data.tolist() == [1.0, 0.0, 0.5]  # 0.9 + 4 → 1, 0.1 − 6 → 0, NaN (skipped fp16 row): kept
    v = {"p": torch.ones(3, 2, requires_grad=True), "buffer": torch.full((3,), 7.0)}
    mixed = st.mixture(v)
    torch.testing.assert_close(mixed["p"], torch.tensor([[0.9] * 2, [0.1] * 2, [0.5] * 2]))
    assert mixed["buffer"] is v["buffer"]  # running statistics: v's own
    fixed = _Step(torch.tensor([0.9, 0.1, 0.5]), torch.tensor([-2.0, 3.0, 1.0]))
    ApflProgram(0.5, adapt=False).step(fixed)
    assert fixed.trained == [("personal", 0), ("global", 0)] and fixed.data.tolist() == pytest.approx([0.9, 0.1, 0.5])


@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run(tmp_path: Path, monkeypatch, crash_at_round_2) -> None:
    clients = resumed_equals_uninterrupted(small_config("apfl", rounds=3), tmp_path, monkeypatch)
    assert all(ALPHA in c and prefixed(c, PERSONAL) for c in clients)


@pytest.mark.parametrize("value", ["1.5", "-0.5"])
def test_an_alpha_outside_the_unit_interval_exits_2_in_one_line_before_any_folder(
        value: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["run", str(CONFIG), "--no-progress", "--set", 'algorithm.name="apfl"',
                 "--set", f"algorithm.alpha={value}", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and "algorithm.alpha" in err and not out.exists()
