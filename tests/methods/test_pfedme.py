"""pFedMe (``methods.pfedme``): with one inner step and ηλ = 1 the local model follows θ, which is
local SGD at the personal rate (FedAvg); a float64 hand loop of two rounds (θ's inner steps, w's
step, the server's β, the kept and evaluated θ), resume, bad keys."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.func import functional_call
from torch.nn import functional as F

from fedlatent.backends import simulation
from fedlatent.cli import main
from fedlatent.federated.client import PERSONAL, Workspace, prefixed
from fedlatent.federated.trainer.schedule import batches
from fedlatent.federated.personal import client_model
from fedlatent.seeding import LOCAL_TRAINING, derive_seed
from tests.methods.resume import resumed_equals_uninterrupted
from tests.methods.test_apfl import CONFIG, TRAINERS, _rounds
from tests.methods.test_ditto import small_config


def _plain(config, lr: float):
    """``config`` with plain SGD at ``lr``."""
    config.train.momentum, config.train.weight_decay, config.train.lr = 0.0, 0.0, lr
    return config


@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_one_inner_step_with_eta_lambda_one_is_fedavg_at_the_personal_rate(backend: str) -> None:
    """θ starts each step at w (w ← w − ηλ(w − θ) = θ), so θ ← w − ν∇f(w; ξ) and w ← θ: local SGD at ν."""
    fedavg, fedavg_lines, _ = _rounds(_plain(small_config("fedavg"), 0.05), TRAINERS[backend], float64=True)
    config = _plain(small_config("pfedme", lam=2.0, inner_steps=1, personal_lr=0.05), 0.5)
    pfedme, pfedme_lines, _ = _rounds(config, TRAINERS[backend], float64=True)
    for k, v in fedavg.server.global_state.items():
        torch.testing.assert_close(pfedme.server.global_state[k], v, rtol=0, atol=1e-12)
    # the loss recorded: θ's at its inner step, here f(w; ξ), FedAvg's
    assert [line["train_loss"] for line in pfedme_lines] == pytest.approx(
        [line["train_loss"] for line in fedavg_lines], abs=1e-12)


def _hand_loop(config, s, initial: dict, lam: float, steps: int, nu: float, beta: float) -> tuple[dict, list[dict]]:
    """Algorithm 1 in float64 with plain SGD: per batch, K steps θ −= ν(∇f(θ; ξ) + λ(θ − w)) from the
    previous step's θ (the round's global weights at its first), then w −= ηλ(w − θ); the server
    w̄ ← (1 − β)w̄ + β Σ p_k w_k. Returns w̄ and each client's last θ."""
    t = config.train
    model = simulation.make_model(config, s.federation, s.spec).double()
    clients = s.federation.clients
    sizes = [len(c.train) for c in clients]
    w_bar = {k: v.clone() for k, v in initial.items()}
    thetas: list[dict] = [{}] * len(clients)

    def grad(weights: dict, x, y) -> dict:
        leaves = {k: v.detach().requires_grad_(True) for k, v in weights.items()}
        loss = F.cross_entropy(functional_call(model, leaves, (x,)).logits, y)
        return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))

    for rnd in range(t.rounds):
        trained = []
        for cid, client in enumerate(clients):
            w, theta = dict(w_bar), dict(w_bar)
            generator = torch.Generator().manual_seed(derive_seed(config.seed, LOCAL_TRAINING, rnd, cid))
            for idx in batches(len(client.train), t.batch_size, t.drop_last, generator):
                x, y = client.train.x[idx].double(), client.train.y[idx]
                for _ in range(steps):
                    g = grad(theta, x, y)
                    theta = {k: theta[k] - nu * (g[k] + lam * (theta[k] - w[k])) for k in theta}
                w = {k: w[k] - t.lr * lam * (w[k] - theta[k]) for k in w}
            trained.append(w)
            thetas[cid] = theta
        mean = {k: sum(w[k] * (n / sum(sizes)) for w, n in zip(trained, sizes)) for k in w_bar}
        w_bar = {k: w_bar[k] + beta * (mean[k] - w_bar[k]) for k in w_bar}
    return w_bar, thetas


@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_two_rounds_match_a_float64_hand_loop(backend: str) -> None:
    config = _plain(small_config("pfedme", lam=3.0, inner_steps=3, personal_lr=0.05), 0.2)
    config.server.lr = 0.7  # β: the server's SGD step on the pseudo-gradient
    s, _, initial = _rounds(config, TRAINERS[backend], float64=True)
    w_bar, thetas = _hand_loop(config, s, initial, 3.0, 3, 0.05, 0.7)
    for k, v in w_bar.items():
        torch.testing.assert_close(s.server.global_state[k], v, rtol=0, atol=1e-10)
    for cid, state in enumerate(s.client_states):
        own = prefixed(state, PERSONAL)
        assert sorted(own) == sorted(thetas[cid])
        for k, v in thetas[cid].items():
            torch.testing.assert_close(own[k], v, rtol=0, atol=1e-10)
        assert max(float((own[k] - w_bar[k]).abs().max()) for k in own) > 1e-3  # θ is not the global model
        model = client_model(Workspace(s.workspace.model), s.spec, state, s.server.global_state, cid,
                             s.federation.clients[cid].train, None, torch.Generator())
        for k, value in model.state_dict().items():  # evaluated on θ
            torch.testing.assert_close(value, thetas[cid][k], rtol=0, atol=1e-10)


@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run(tmp_path: Path, monkeypatch, crash_at_round_2) -> None:
    clients = resumed_equals_uninterrupted(_plain(small_config("pfedme", rounds=3), 0.05), tmp_path, monkeypatch)
    assert all(prefixed(c, PERSONAL) for c in clients)


@pytest.mark.parametrize("setting, key", [("algorithm.inner_steps=0", "algorithm.inner_steps"),
                                          ("algorithm.lam=0.0", "algorithm.lam"),
                                          ("algorithm.personal_lr=-0.1", "algorithm.personal_lr")])
def test_a_bad_key_exits_2_in_one_line_before_any_folder(setting: str, key: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["run", str(CONFIG), "--no-progress", "--set", 'algorithm.name="pfedme"',
                 "--set", setting, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and key in err and not out.exists()
