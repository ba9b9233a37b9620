"""FedALA (``methods.fedala``): no adaptive layers starts every round from the global model, which is
FedAvg exactly, and so do weights fixed at one up to rounding; a float64 hand loop of three rounds (W learned until convergence in a client's first
round with a local model, one pass later, the start weights, the kept and evaluated local model);
the sample's batches, resume, bad keys."""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch
from torch.func import functional_call
from torch.nn import functional as F

from fedlatent.backends import simulation
from fedlatent.cli import main
from fedlatent.federated.client import Workspace, prefixed
from fedlatent.federated.trainer.schedule import batches
from fedlatent.federated.personal import client_model
from fedlatent.methods.fedala import LOCAL_MODEL, WEIGHTS, sample_batches
from fedlatent.seeding import ADAPTIVE_AGGREGATION, LOCAL_TRAINING, derive_seed
from tests.methods.resume import resumed_equals_uninterrupted
from tests.methods.test_apfl import CONFIG, TRAINERS, _rounds
from tests.methods.test_ditto import small_config


@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_no_adaptive_layers_starts_from_the_global_model_which_is_fedavg_exactly(backend: str) -> None:
    fedavg, fedavg_lines, _ = _rounds(small_config("fedavg", rounds=3), TRAINERS[backend])
    ala, ala_lines, _ = _rounds(small_config("fedala", rounds=3, ala_layers=0), TRAINERS[backend])
    for k, v in fedavg.server.global_state.items():
        torch.testing.assert_close(ala.server.global_state[k], v, rtol=0, atol=0)
    assert [line["train_loss"] for line in ala_lines] == [line["train_loss"] for line in fedavg_lines]
    for state in ala.client_states:  # each kept its local model, and learned no W
        assert prefixed(state, LOCAL_MODEL) and not prefixed(state, WEIGHTS)


@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_weights_fixed_at_one_start_from_the_global_model_which_is_fedavg(backend: str) -> None:
    """η = 0 keeps W at its initial ones: ŵ = w + (w̄ − w) = w̄ up to rounding, FedAvg to 1e-12 in float64."""
    fedavg, _, _ = _rounds(small_config("fedavg", rounds=3), TRAINERS[backend], float64=True)
    ala, _, _ = _rounds(small_config("fedala", rounds=3, eta=0.0), TRAINERS[backend], float64=True)
    for k, v in fedavg.server.global_state.items():
        torch.testing.assert_close(ala.server.global_state[k], v, rtol=0, atol=1e-12)
    for state in ala.client_states:  # W was learned (with η = 0) and kept
        assert all(bool((w == 1).all()) for w in prefixed(state, WEIGHTS).values()) and prefixed(state, WEIGHTS)


def test_the_sample_is_a_seeded_share_of_the_split_in_full_batches() -> None:
    chunks = sample_batches(100, 80, 32, torch.Generator().manual_seed(0))
    assert [len(c) for c in chunks] == [32, 32]  # 80 samples: the incomplete last batch of 16 dropped
    drawn = torch.cat(chunks)
    assert len(set(drawn.tolist())) == 64 and int(drawn.max()) < 100
    again = sample_batches(100, 80, 32, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(chunks, again))
    assert [len(c) for c in sample_batches(20, 50, 32, torch.Generator().manual_seed(0))] == [10]  # the only batch


def _hand_loop(config, s, initial: dict, eta: float, percent: int, threshold: float, num_pre_loss: int):
    """FedALA in float64 with plain SGD: a client with a local model w learns W on its sample (Eq. 6:
    W ← clip(W − η ∇f(ŵ) ⊙ (w̄ − w), 0, 1), ŵ = w + (w̄ − w) ⊙ W on the classifier, w̄ below), all
    ones at first and until the last epochs' losses settle, one pass later; trains ŵ; keeps it.
    Returns w̄, the local models, the W's and the epochs of each client's W learning."""
    t = config.train
    model = simulation.make_model(config, s.federation, s.spec).double()
    clients = s.federation.clients
    sizes = [len(c.train) for c in clients]
    top = ["classifier.weight", "classifier.bias"]
    w_bar = {k: v.clone() for k, v in initial.items()}
    local: list[dict | None] = [None] * len(clients)
    weights: list[dict | None] = [None] * len(clients)
    epochs: list[list[int]] = [[] for _ in clients]

    def grad(params: dict, x, y) -> tuple[dict, float]:
        leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        loss = F.cross_entropy(functional_call(model, leaves, (x,)).logits, y)
        return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values())))), float(loss.detach())

    for rnd in range(t.rounds):
        trained = []
        for cid, client in enumerate(clients):
            w = dict(w_bar)
            if local[cid] is not None:
                own, first = local[cid], weights[cid] is None
                W = weights[cid] or {k: torch.ones_like(own[k]) for k in top}
                generator = torch.Generator().manual_seed(derive_seed(config.seed, ADAPTIVE_AGGREGATION, rnd, cid))
                n = len(client.train)
                chosen = torch.randperm(n, generator=generator)[:int(percent / 100 * n)]
                chunks = [chosen[i:i + t.batch_size] for i in range(0, len(chosen) - t.batch_size + 1, t.batch_size)]
                losses = []
                while True:
                    for idx in chunks:
                        at = {**w_bar, **{k: own[k] + (w_bar[k] - own[k]) * W[k] for k in top}}
                        g, loss = grad(at, client.train.x[idx].double(), client.train.y[idx])
                        W = {k: (W[k] - eta * g[k] * (w_bar[k] - own[k])).clamp(0, 1) for k in top}
                    losses.append(loss)
                    if not first or (len(losses) > num_pre_loss
                                     and statistics.pstdev(losses[-num_pre_loss:]) < threshold):
                        break
                weights[cid] = W
                epochs[cid].append(len(losses))
                w = {**w_bar, **{k: own[k] + (w_bar[k] - own[k]) * W[k] for k in top}}
            generator = torch.Generator().manual_seed(derive_seed(config.seed, LOCAL_TRAINING, rnd, cid))
            for idx in batches(len(client.train), t.batch_size, t.drop_last, generator):
                g, _ = grad(w, client.train.x[idx].double(), client.train.y[idx])
                w = {k: w[k] - t.lr * g[k] for k in w}
            trained.append(w)
            local[cid] = w
        w_bar = {k: sum(w[k] * (n / sum(sizes)) for w, n in zip(trained, sizes)) for k in w_bar}
    return w_bar, local, weights, epochs


@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_three_rounds_match_a_float64_hand_loop(backend: str) -> None:
    config = small_config("fedala", rounds=3, eta=1.0, rand_percent=60, threshold=0.05, num_pre_loss=3)
    config.train.momentum, config.train.weight_decay, config.train.lr = 0.0, 0.0, 0.2
    s, _, initial = _rounds(config, TRAINERS[backend], float64=True)
    w_bar, local, weights, epochs = _hand_loop(config, s, initial, 1.0, 60, 0.05, 3)
    for k, v in w_bar.items():
        torch.testing.assert_close(s.server.global_state[k], v, rtol=0, atol=1e-10)
    assert all(e[0] > 3 and e[1] == 1 for e in epochs)  # until convergence in round 2, one pass in round 3
    assert any(float(W.min()) < 0.99 for ws in weights for W in ws.values())  # W moved
    for cid, state in enumerate(s.client_states):
        own, W = prefixed(state, LOCAL_MODEL), prefixed(state, WEIGHTS)
        assert sorted(W) == ["classifier.bias", "classifier.weight"]
        for k, v in weights[cid].items():
            torch.testing.assert_close(W[k], v, rtol=0, atol=1e-10)
        for k, v in local[cid].items():
            torch.testing.assert_close(own[k], v, rtol=0, atol=1e-10)
        model = client_model(Workspace(s.workspace.model), s.spec, state, s.server.global_state, cid,
                             s.federation.clients[cid].train, None, torch.Generator())
        for k, value in model.state_dict().items():  # evaluated on its local model
            torch.testing.assert_close(value, local[cid][k], rtol=0, atol=1e-10)


@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run(tmp_path: Path, monkeypatch, crash_at_round_2) -> None:
    clients = resumed_equals_uninterrupted(small_config("fedala", rounds=3), tmp_path, monkeypatch)
    assert all(prefixed(c, LOCAL_MODEL) and prefixed(c, WEIGHTS) for c in clients)


@pytest.mark.parametrize("setting, key", [("algorithm.rand_percent=0", "algorithm.rand_percent"),
                                          ("algorithm.rand_percent=101", "algorithm.rand_percent"),
                                          ("algorithm.num_pre_loss=0", "algorithm.num_pre_loss"),
                                          ("algorithm.eta=-1.0", "algorithm.eta")])
def test_a_bad_key_exits_2_in_one_line_before_any_folder(setting: str, key: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["run", str(CONFIG), "--no-progress", "--set", 'algorithm.name="fedala"',
                 "--set", setting, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and key in err and not out.exists()
