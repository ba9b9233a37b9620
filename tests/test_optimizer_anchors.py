"""Adam and AdamW through the trainer (both embedded backends, FedAvg, fresh optimiser state each
round) against a float64 hand loop of Kingma & Ba (2015, Algorithm 1) and Loshchilov & Hutter
(2019, Algorithm 2) written out with no fedlatent code on the update path: the trainer's only
anchors before were SGD hand loops and torch.optim on one bare model."""
from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call
from torch.nn import functional as F

from fedlatent.backends import simulation
from fedlatent.federated.trainer.schedule import batches
from fedlatent.seeding import LOCAL_TRAINING, SAMPLE_NOISE, derive_seed
from tests.methods.test_apfl import TRAINERS, _rounds
from tests.methods.test_ditto import small_config

BETA1, BETA2, EPS = 0.9, 0.999, 1e-8  # the papers' (and torch's) defaults


def _adam_hand_loop(config, s, initial: dict, decoupled: bool) -> dict:
    """FedAvg's rounds with Adam (``decoupled`` False: L2 decay λw added to the gradient) or AdamW
    (True: w ← w − η(m̂/(√v̂ + ε) + λw)), in float64; m, v and t start at zero each round (fresh
    state); the global model is the sample-weighted mean of the clients' weights."""
    t = config.train
    model = simulation.make_model(config, s.federation, s.spec).double()
    clients = s.federation.clients
    sizes = [len(c.train) for c in clients]
    w_bar = {k: v.clone() for k, v in initial.items()}
    lr, decay = t.lr, t.weight_decay
    for rnd in range(t.rounds):
        trained = []
        for cid, client in enumerate(clients):
            w = dict(w_bar)
            m = {k: torch.zeros_like(v) for k, v in w.items()}
            v2 = {k: torch.zeros_like(v) for k, v in w.items()}
            step = 0
            generator = torch.Generator().manual_seed(derive_seed(config.seed, LOCAL_TRAINING, rnd, cid))
            for _ in range(t.local_epochs):
                for idx in batches(len(client.train), t.batch_size, t.drop_last, generator):
                    x, y = client.train.x[idx].double(), client.train.y[idx]
                    leaves = {k: p.detach().requires_grad_(True) for k, p in w.items()}
                    loss = F.cross_entropy(functional_call(model, leaves, (x,)).logits, y)
                    g = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
                    step += 1
                    new = {}
                    for k in w:
                        grad = g[k] if decoupled else g[k] + decay * w[k]
                        m[k] = BETA1 * m[k] + (1 - BETA1) * grad
                        v2[k] = BETA2 * v2[k] + (1 - BETA2) * grad * grad
                        m_hat = m[k] / (1 - BETA1 ** step)
                        v_hat = v2[k] / (1 - BETA2 ** step)
                        direction = m_hat / (v_hat.sqrt() + EPS)
                        if decoupled:
                            direction = direction + decay * w[k]
                        new[k] = w[k] - lr * direction
                    w = new
            trained.append(w)
        w_bar = {k: sum(w[k] * (n / sum(sizes)) for w, n in zip(trained, sizes)) for k in w_bar}
    return w_bar


@pytest.mark.parametrize("backend", sorted(TRAINERS))
@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_two_rounds_of_adam_match_a_float64_hand_loop(backend: str, kind: str) -> None:
    config = small_config("fedavg")
    config.train.optimizer, config.train.momentum = kind, 0.0
    config.train.lr, config.train.weight_decay = 0.01, 0.05
    s, _, initial = _rounds(config, TRAINERS[backend], float64=True)
    w_bar = _adam_hand_loop(config, s, initial, decoupled=kind == "adamw")
    moved = max(float((w_bar[k] - initial[k]).abs().max()) for k in w_bar)
    assert moved > 1e-2  # the rounds trained (the identity is not vacuous)
    for k, v in w_bar.items():
        torch.testing.assert_close(s.server.global_state[k], v, rtol=0, atol=1e-10)


def test_adams_l2_decay_and_adamws_decoupled_decay_differ() -> None:
    """The two rules of one configuration part: Adam's decay is scaled by 1/√v̂, AdamW's is not."""
    finals = {}
    for kind in ("adam", "adamw"):
        config = small_config("fedavg", rounds=1)
        config.train.optimizer, config.train.momentum = kind, 0.0
        config.train.lr, config.train.weight_decay = 0.01, 0.5
        s, _, _ = _rounds(config, TRAINERS["simulation"], float64=True)
        finals[kind] = s.server.global_state
    gap = max(float((finals["adam"][k] - finals["adamw"][k]).abs().max()) for k in finals["adam"])
    assert gap > 1e-4 and math.isfinite(gap)


def _dp_sgd_hand_loop(config, s, initial: dict) -> tuple[dict, float]:
    """One FedAvg round of DP-SGD (Abadi et al. 2016, Algorithm 1) in float64, sample by sample:
    each step's batch takes every sample with probability q = b / n (one uniform draw per sample
    and step, from the client's (seed, LOCAL_TRAINING, round, client) stream); the gradient is
    (Σ_i min(1, C/‖g_i‖) g_i + σC·z) / L with g_i one sample's cross-entropy gradient, z one
    standard normal entry per weight from the (seed, SAMPLE_NOISE, round, client, 0) stream, L =
    min(b, n); then L2 decay and heavy-ball momentum (buffer = g on the first step). Returns the
    global model and the share of per-sample gradients the clip scaled down."""
    t, p = config.train, config.privacy
    model = simulation.make_model(config, s.federation, s.spec).double()
    names = [n for n, _ in model.named_parameters()]
    clients = s.federation.clients
    sizes = [len(c.train) for c in clients]
    trained, clipped, seen = [], 0, 0
    for cid, client in enumerate(clients):
        n = len(client.train)
        w = {k: v.clone() for k, v in initial.items()}
        buffers: dict = {}
        batch_stream = torch.Generator().manual_seed(derive_seed(config.seed, LOCAL_TRAINING, 0, cid))
        noise_stream = torch.Generator().manual_seed(derive_seed(config.seed, SAMPLE_NOISE, 0, cid, 0))
        steps = t.local_epochs * -(-n // t.batch_size)
        # float64: the trainer's run above drew its uniforms with float64 the default dtype
        taken = torch.rand(steps, n, generator=batch_stream, dtype=torch.float64) < min(1.0, t.batch_size / n)
        for row in taken:
            total = {k: torch.zeros_like(w[k]) for k in names}
            for i in row.nonzero().flatten().tolist():
                leaves = {k: w[k].detach().requires_grad_(True) for k in names}
                x, y = client.train.x[i:i + 1].double(), client.train.y[i:i + 1]
                loss = F.cross_entropy(functional_call(model, leaves, (x,)).logits, y)
                g = dict(zip(names, torch.autograd.grad(loss, list(leaves.values()))))
                norm = math.sqrt(sum(float(v.square().sum()) for v in g.values()))
                clipped, seen = clipped + (norm > p.sample_clip_norm), seen + 1
                for k in names:
                    total[k] += min(1.0, p.sample_clip_norm / norm) * g[k]
            z = torch.randn(sum(w[k].numel() for k in names), generator=noise_stream, dtype=torch.float64)
            noise = dict(zip(names, (part.reshape(w[k].shape) for part, k in
                                     zip(z.split([w[k].numel() for k in names]), names))))
            for k in names:
                grad = (total[k] + p.sample_noise_multiplier * p.sample_clip_norm * noise[k]) / min(t.batch_size, n)
                grad = grad + t.weight_decay * w[k]
                buffers[k] = grad if k not in buffers else t.momentum * buffers[k] + grad
                w[k] = w[k] - t.lr * buffers[k]
        trained.append(w)
    return {k: sum(w[k] * (n / sum(sizes)) for w, n in zip(trained, sizes)) for k in initial}, clipped / seen


@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_a_dp_sgd_round_matches_a_float64_hand_loop(backend: str) -> None:
    config = small_config("fedavg", rounds=1)
    config.privacy.sample_clip_norm, config.privacy.sample_noise_multiplier = 1.5, 1.1
    config.privacy.batch_sampling, config.privacy.delta = "poisson", 1e-4
    s, lines, initial = _rounds(config, TRAINERS[backend], float64=True)
    w_bar, clipped = _dp_sgd_hand_loop(config, s, initial)
    assert 0.1 < clipped < 0.9  # the clip acted on some samples and not on others
    assert max(float((w_bar[k] - initial[k]).abs().max()) for k in w_bar) > 1e-2
    for k, v in w_bar.items():
        torch.testing.assert_close(s.server.global_state[k], v, rtol=0, atol=1e-10)
