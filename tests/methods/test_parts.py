"""The parts a method is composed of, against float64 hand computations and METHODS.md: the
FedProx, FedDyn and MOON terms, SCAFFOLD's control variates (client and server, two rounds),
FedDyn's λ_k and server update, FedProto's prototypes, FedUV's ablations, and the registry's
composition rules and errors."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import fedlatent
from fedlatent.config import ServerConfig
from fedlatent.data.types import Split
from fedlatent.errors import ConfigError
from fedlatent.federated.client import LocalSettings, Workspace
from fedlatent.federated.trainer.schedule import batches
from fedlatent.federated.trainer import local_update
from fedlatent.federated.server import Server
from fedlatent.methods import PRESETS, resolve
from fedlatent.methods.feddyn import FedDyn
from fedlatent.methods.fedprox import Prox
from fedlatent.methods.fedproto import PRESENT, PROTO, FedProto
from fedlatent.methods.feduv import Uniformity, Variance
from fedlatent.methods.moon import Moon
from fedlatent.methods.parts import ClientRound, TermContext, Upload, task_loss, trainable_names
from fedlatent.methods.scaffold import Scaffold
from fedlatent.models.base import FedModel, ModelOutput

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "configs" / "digits_fedavg.toml"


# ---- a linear model and a hand-written float64 SGD ---------------------------------------------------

class LinearModel(FedModel):
    """z = x; logits = Wx + b (the classifier is the only layer)."""

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__(encoder_dim=dim, num_classes=num_classes)

    def encode(self, x, taps):
        return x, {}


D, C = 4, 3


def _linear_model(seed: int = 0) -> LinearModel:
    torch.manual_seed(seed)
    return LinearModel(D, C).double()


def _clients(sizes: list[int], seed: int = 1) -> list[Split]:
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(sizes):
        x = rng.normal(loc=0.5 * i, size=(n, D))
        y = rng.integers(0, C, size=n)
        out.append(Split(torch.tensor(x), torch.tensor(y, dtype=torch.int64)))
    return out


def _ce_grad(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """∇ of the mean cross-entropy of softmax(x wᵀ + b) w.r.t. (w, b)."""
    logits = x @ w.T + b
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    g = (p - np.eye(w.shape[0])[y]) / len(y)
    return g.T @ x, g.sum(axis=0)


def _np(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {"w": state["classifier.weight"].numpy().copy(), "b": state["classifier.bias"].numpy().copy()}


def _settings(lr: float, epochs: int, batch_size: int) -> LocalSettings:
    return LocalSettings(epochs=epochs, batch_size=batch_size, lr=lr, momentum=0.0, weight_decay=0.0,
                         drop_last=False, augment=False, num_classes=C)


def _library_round(spec, server: Server, model: FedModel, clients: list[Split], states: list[dict],
                   participants: list[int], s: LocalSettings, rnd: int) -> list[Upload]:
    payload = {k: v for p in server.payload().values() for k, v in p.items()}
    total = sum(len(c) for c in clients)
    uploads = []
    for cid in participants:
        rc = ClientRound(cid, model, {}, states[cid], payload, s.lr, len(clients[cid]), len(clients), total, 0.0)
        uploads.append(local_update(Workspace(model), server.global_state, clients[cid], spec, rc, s,
                                    torch.Generator().manual_seed(100 * rnd + cid)))
    server.aggregate(uploads)
    return uploads


def _batch_order(n: int, s: LocalSettings, rnd: int, cid: int) -> list[np.ndarray]:
    """The mini-batches a client sees (the same seeded permutations as the client)."""
    g = torch.Generator().manual_seed(100 * rnd + cid)
    return [idx.numpy() for _ in range(s.epochs) for idx in batches(n, s.batch_size, s.drop_last, g)]


# ---- SCAFFOLD -----------------------------------------------------------------------------------------

def test_scaffold_two_rounds_match_a_float64_hand_loop() -> None:
    """3 clients of unequal size (so unequal step counts K), 2 participating per round:
    local w ← w − lr·∇ then w ← w − lr·(c − c_i); c_i⁺ = c_i − c + (w_g − w_i)/(K·lr);
    server: sample-weighted mean of the w_i, c += (1/N)·Σ(c_i⁺ − c_i) with N = 3 (all clients)."""
    lr = 0.3
    s = _settings(lr, epochs=2, batch_size=4)
    clients = _clients([8, 12, 10])
    model = _linear_model()
    spec = resolve({"name": "scaffold"})
    assert [type(p) for p in spec.parts] == [Scaffold]
    server = Server(spec, {k: v.clone() for k, v in model.state_dict().items()}, [n for n, _ in model.named_parameters()],
                    trainable_names(model), ServerConfig(), num_clients=3)
    states: list[dict] = [{}, {}, {}]

    wg = _np(server.global_state)
    c = {k: np.zeros_like(v) for k, v in wg.items()}
    ci = [{k: np.zeros_like(v) for k, v in wg.items()} for _ in clients]
    rounds = [[0, 1], [1, 2]]
    for rnd, participants in enumerate(rounds):
        uploads = _library_round(spec, server, model, clients, states, participants, s, rnd)
        # the hand loop
        new_w, deltas, counts = [], [], []
        for cid in participants:
            w = {k: v.copy() for k, v in wg.items()}
            x, y = clients[cid].x.numpy(), clients[cid].y.numpy()
            steps = 0
            for idx in _batch_order(len(y), s, rnd, cid):
                gw, gb = _ce_grad(w["w"], w["b"], x[idx], y[idx])
                w["w"] -= lr * gw
                w["b"] -= lr * gb
                for k in w:
                    w[k] -= lr * (c[k] - ci[cid][k])
                steps += 1
            new_ci = {k: ci[cid][k] - c[k] + (wg[k] - w[k]) / (steps * lr) for k in w}
            deltas.append({k: new_ci[k] - ci[cid][k] for k in w})
            ci[cid] = new_ci
            new_w.append(w)
            counts.append(len(y))
            up = next(u for u in uploads if u.client_id == cid)
            assert up.steps == steps == s.epochs * math.ceil(len(y) / s.batch_size)
        total = sum(counts)
        wg = {k: sum(n * w[k] for n, w in zip(counts, new_w)) / total for k in wg}
        c = {k: c[k] + sum(d[k] for d in deltas) / 3 for k in c}

        got = _np(server.global_state)
        for k, name in (("w", "classifier.weight"), ("b", "classifier.bias")):
            np.testing.assert_allclose(got[k], wg[k], rtol=1e-10, atol=1e-12, err_msg=f"round {rnd + 1} w_g {k}")
            np.testing.assert_allclose(server.state[f"scaffold.c.{name}"].numpy(), c[k], rtol=1e-10, atol=1e-12,
                                       err_msg=f"round {rnd + 1} c {k}")
            for cid in range(3):
                stored = states[cid].get(f"scaffold.ci.{name}")
                if stored is None:
                    assert not np.any(ci[cid][k])  # never participated yet
                else:
                    np.testing.assert_allclose(stored.numpy(), ci[cid][k], rtol=1e-10, atol=1e-12,
                                               err_msg=f"round {rnd + 1} c_{cid} {k}")
    # c actually moved and client 1 (in both rounds) holds a control variate that differs from client 0's
    assert np.abs(c["w"]).max() > 1e-3
    assert not np.allclose(ci[0]["w"], ci[1]["w"])


# ---- FedDyn -------------------------------------------------------------------------------------------

def test_feddyn_two_rounds_match_a_float64_hand_loop() -> None:
    """α_k = α/(n_k·N/Σn); loss += α_k⟨θ, λ_k − θ_srv⟩ + (α_k/2)‖θ‖² (weight decay); λ_k += θ_k − θ_srv;
    server θ_srv = mean of participating θ_k + mean over all N clients of λ_k."""
    alpha, lr = 0.5, 0.2
    s = _settings(lr, epochs=2, batch_size=5)
    sizes = [6, 15, 9]
    clients = _clients(sizes, seed=2)
    model = _linear_model(3)
    spec = resolve({"name": "feddyn", "alpha": alpha})
    assert [type(p) for p in spec.parts] == [FedDyn] and spec.aggregator is spec.parts[0]
    server = Server(spec, {k: v.clone() for k, v in model.state_dict().items()}, [n for n, _ in model.named_parameters()],
                    trainable_names(model), ServerConfig(), num_clients=3)
    states: list[dict] = [{}, {}, {}]
    N, total = 3, sum(sizes)
    wg = _np(server.global_state)
    lam = [{k: np.zeros_like(v) for k, v in wg.items()} for _ in sizes]
    for rnd, participants in enumerate([[0, 1], [1, 2]]):
        uploads = _library_round(spec, server, model, clients, states, participants, s, rnd)
        thetas = []
        for cid in participants:
            alpha_k = alpha / (sizes[cid] * N / total)
            lin = {k: lam[cid][k] - wg[k] for k in wg}
            w = {k: v.copy() for k, v in wg.items()}
            x, y = clients[cid].x.numpy(), clients[cid].y.numpy()
            terms = []
            for idx in _batch_order(len(y), s, rnd, cid):
                terms.append(alpha_k * sum((w[k] * lin[k]).sum() for k in w))
                gw, gb = _ce_grad(w["w"], w["b"], x[idx], y[idx])
                grads = {"w": gw, "b": gb}
                for k in w:  # linear term + weight decay α_k
                    w[k] = w[k] - lr * (grads[k] + alpha_k * lin[k] + alpha_k * w[k])
            for k in w:
                lam[cid][k] = lam[cid][k] + w[k] - wg[k]
            thetas.append(w)
            up = next(u for u in uploads if u.client_id == cid)
            if rnd > 0:  # round 1: λ_k = 0 and θ = θ_srv at the first step, later steps see θ ≠ θ_srv
                assert up.metrics["term_feddyn"] == pytest.approx(float(np.mean(terms)), rel=1e-9, abs=1e-12)
        wg = {k: sum(t[k] for t in thetas) / len(thetas) + sum(l[k] for l in lam) / N for k in wg}
        got = _np(server.global_state)
        for k, name in (("w", "classifier.weight"), ("b", "classifier.bias")):
            np.testing.assert_allclose(got[k], wg[k], rtol=1e-10, atol=1e-12, err_msg=f"round {rnd + 1} θ_srv {k}")
            for cid in participants:
                np.testing.assert_allclose(states[cid][f"feddyn.lambda.{name}"].numpy(), lam[cid][k],
                                           rtol=1e-10, atol=1e-12, err_msg=f"round {rnd + 1} λ_{cid} {k}")
    for cid in range(3):  # client 0 sat out round 2: its λ is still the round-1 value
        np.testing.assert_allclose(states[cid]["feddyn.lambda.classifier.weight"].numpy(), lam[cid]["w"],
                                   rtol=1e-10, atol=1e-12)


def test_feddyn_term_value_and_weight_decay_from_begin() -> None:
    model = _linear_model(4)
    theta_srv = {n: p.detach().clone() for n, p in model.named_parameters()}
    lam = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    state = {f"feddyn.lambda.{n}": v for n, v in lam.items()}
    rc = ClientRound(0, model, theta_srv, state, {}, 0.1, num_samples=30, num_clients=4, total_samples=200, momentum=0.0)
    part = FedDyn(alpha=0.01)
    part.begin(rc)
    alpha_k = 0.01 / (30 * 4 / 200)
    assert rc.extra_weight_decay == pytest.approx(alpha_k, rel=1e-12)
    with torch.no_grad():  # move θ away from θ_srv
        for p in model.parameters():
            p.add_(0.1)
    params = dict(model.named_parameters())
    out = model(torch.zeros(2, D, dtype=torch.float64))
    ctx = TermContext(out, torch.zeros(2, dtype=torch.int64), params, theta_srv, None, None, C, state, {}, rc.scratch)
    want = alpha_k * sum(float((params[n].detach() * (lam[n] - theta_srv[n])).sum()) for n in params)
    assert float(part.loss(ctx).detach()) == pytest.approx(want, rel=1e-12)
    extras = part.finish(rc)
    for n in params:  # λ_k += θ_k − θ_srv = λ + 0.1
        torch.testing.assert_close(state[f"feddyn.lambda.{n}"], lam[n] + 0.1, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(extras[n], torch.full_like(lam[n], 0.1), rtol=1e-12, atol=1e-12)


# ---- FedProx ------------------------------------------------------------------------------------------

def test_fedprox_term_is_half_mu_squared_distance_over_trainable_parameters() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)).double()
    model[1].bias.requires_grad_(False)  # not trainable: must not count
    params = dict(model.named_parameters())
    rng = np.random.default_rng(5)
    glob = {n: p.detach() + torch.tensor(rng.normal(size=tuple(p.shape))) for n, p in params.items()}
    mu = 0.37
    ctx = TermContext(ModelOutput(torch.zeros(1, 2), torch.zeros(1, 4)), torch.zeros(1, dtype=torch.int64),
                      params, glob, None, None, 2, {}, {})
    value = Prox(mu).loss(ctx)
    want = 0.5 * mu * sum(float(((params[n].detach() - glob[n]) ** 2).sum()) for n in params if n != "1.bias")
    assert float(value.detach()) == pytest.approx(want, rel=1e-12)
    value.backward()
    torch.testing.assert_close(params["0.weight"].grad, mu * (params["0.weight"].detach() - glob["0.weight"]))
    assert resolve({"name": "fedprox"}).parts[0].mu == 0.01  # METHODS.md: typical μ = 0.001–0.01


# ---- MOON ---------------------------------------------------------------------------------------------

def _ctx_with(z, zg, zp) -> TermContext:
    out = ModelOutput(torch.zeros(len(z), C), z)
    return TermContext(out, torch.zeros(len(z), dtype=torch.int64), {}, {},
                       ModelOutput(torch.zeros(len(z), C), zg), None if zp is None else ModelOutput(torch.zeros(len(z), C), zp),
                       C, {}, {})


def test_moon_part_without_previous_model_returns_none_and_with_it_the_formula() -> None:
    g = torch.Generator().manual_seed(0)
    z, zg, zp = (torch.randn(5, 6, generator=g, dtype=torch.float64) for _ in range(3))
    part = resolve({"name": "moon", "mu": 5.0, "tau": 0.5}).parts[0]
    assert isinstance(part, Moon) and part.weight == 5.0
    assert part.loss(_ctx_with(z, zg, None)) is None
    cos = lambda a, b: (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))  # noqa: E731
    pos, neg = torch.exp(cos(z, zg) / 0.5), torch.exp(cos(z, zp) / 0.5)
    want = float((-torch.log(pos / (pos + neg))).mean())
    assert float(part.loss(_ctx_with(z, zg, zp))) == pytest.approx(want, rel=1e-12)


# ---- FedProto -----------------------------------------------------------------------------------------

def test_fedproto_server_prototypes_are_count_weighted_means() -> None:
    """Two clients see different classes in different amounts; the global prototype of a class is
    the mean of z over *all* its samples (= count-weighted mean of the per-client means); a class
    nobody saw is marked absent. The two clients' rounds are interleaved on the one part object:
    each keeps its running sums in its own scratch."""
    g = torch.Generator().manual_seed(1)
    num_classes, d = 4, 3
    part = resolve({"name": "fedproto"}).parts[0]
    assert isinstance(part, FedProto)
    data = {0: [(torch.randn(5, d, generator=g, dtype=torch.float64), torch.tensor([0, 0, 1, 1, 1])),
                (torch.randn(3, d, generator=g, dtype=torch.float64), torch.tensor([0, 1, 1]))],
            1: [(torch.randn(6, d, generator=g, dtype=torch.float64), torch.tensor([1, 2, 2, 2, 2, 2]))]}
    rcs = {cid: ClientRound(cid, None, {}, {}, {}, 0.1, 0, 2, 0, 0.0) for cid in data}
    for rc in rcs.values():
        part.begin(rc)
    for step in range(2):
        for cid, batches_ in data.items():
            if step < len(batches_):
                z, y = batches_[step]
                ctx = TermContext(ModelOutput(torch.zeros(len(y), num_classes), z), y, {}, {}, None, None,
                                  num_classes, {}, {}, rcs[cid].scratch)
                assert part.loss(ctx) is None  # no global prototypes yet
    uploads = [Upload(cid, {}, 0, 0, 0.1, 0.0, extras={"fedproto": part.finish(rc)}) for cid, rc in rcs.items()]
    server_state: dict[str, torch.Tensor] = {}
    part.server_update(uploads, server_state, num_clients=2)
    all_z = torch.cat([z for b in data.values() for z, _ in b])
    all_y = torch.cat([y for b in data.values() for _, y in b])
    for k in range(3):
        want = all_z[all_y == k].mean(0)
        torch.testing.assert_close(server_state[PROTO][k].double(), want, rtol=1e-6, atol=1e-6)
    # class 1: client 0 has 5 samples, client 1 has 1 → weights 5/6, 1/6 (not 1/2, 1/2)
    m0 = torch.cat([z[y == 1] for z, y in data[0]]).mean(0)
    m1 = data[1][0][0][data[1][0][1] == 1].mean(0)
    torch.testing.assert_close(server_state[PROTO][1].double(), (5 * m0 + m1) / 6, rtol=1e-6, atol=1e-6)
    assert server_state[PRESENT].tolist() == [True, True, True, False]
    # next round: the payload carries them and the term is ‖z − p_y‖² averaged over N·d ('official')
    payload = part.payload(server_state)
    rc = ClientRound(0, None, {}, {}, payload, 0.1, 0, 2, 0, 0.0)
    part.begin(rc)
    z, y = torch.randn(4, d, generator=g), torch.tensor([0, 3, 2, 2])
    ctx = TermContext(ModelOutput(torch.zeros(4, num_classes), z), y, {}, {}, None, None, num_classes, {}, payload,
                      rc.scratch)
    protos = server_state[PROTO]
    want = sum(float(((z[i] - protos[y[i]]) ** 2).sum()) for i in range(4) if y[i] != 3) / (4 * d)
    assert float(part.loss(ctx)) == pytest.approx(want, rel=1e-5)


# ---- FedUV --------------------------------------------------------------------------------------------

def _hand_uniformity(z: np.ndarray) -> float:
    n = len(z)
    d2 = [float(((z[i] - z[j]) ** 2).sum()) for i in range(n) for j in range(i + 1, n)]
    nonzero = sorted(v for v in d2 if v > 0)
    sigma = nonzero[(len(nonzero) - 1) // 2]  # lower middle value (torch.median)
    return float(np.mean([math.exp(-v / sigma) for v in d2]))


def _hand_variance(logits: np.ndarray) -> float:
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    gamma = 1 / math.sqrt(logits.shape[1])
    return float(np.mean(np.maximum(0.0, gamma - p.std(axis=0, ddof=1))))


def _feduv_total(spec, z: torch.Tensor, logits: torch.Tensor) -> float:
    ctx = TermContext(ModelOutput(logits, z), torch.zeros(len(z), dtype=torch.int64), {}, {}, None, None,
                      logits.shape[1], {}, {})
    return sum(p.weight * float(p.loss(ctx)) for p in spec.parts)


def test_feduv_preset_and_its_ablations() -> None:
    g = torch.Generator().manual_seed(2)
    z = torch.randn(9, 5, generator=g, dtype=torch.float64)
    logits = 0.3 * torch.randn(9, 8, generator=g, dtype=torch.float64)
    lu, lv = _hand_uniformity(z.numpy()), _hand_variance(logits.numpy())
    assert lu > 0 and lv > 0
    full = resolve({"name": "feduv"})
    assert sorted(type(p).__name__ for p in full.parts) == ["Uniformity", "Variance"]
    # paper defaults: μ = 0.5, λ = C/4
    assert _feduv_total(full, z, logits) == pytest.approx(0.5 * lu + 8 / 4 * lv, rel=1e-9)
    only_v = resolve({"name": "feduv", "mu": 0})
    assert [type(p) for p in only_v.parts] == [Variance]
    assert _feduv_total(only_v, z, logits) == pytest.approx(8 / 4 * lv, rel=1e-9)
    only_u = resolve({"name": "feduv", "lam": 0})
    assert [type(p) for p in only_u.parts] == [Uniformity]
    assert _feduv_total(only_u, z, logits) == pytest.approx(0.5 * lu, rel=1e-9)
    release = resolve({"name": "feduv", "lam": 2.5, "mu": 0.5})
    assert _feduv_total(release, z, logits) == pytest.approx(0.5 * lu + 2.5 * lv, rel=1e-9)
    assert resolve({"name": "feduv", "mu": 0, "lam": 0}).parts == []


# ---- registry: errors and composition -----------------------------------------------------------------

@pytest.mark.parametrize("algorithm,terms,needle", [
    ({"name": "fedsomething"}, [], "algorithm.name"),
    ({"name": "fedprox", "mux": 0.1}, [], "algorithm.mux"),
    ({"name": "fedprox", "mu": "large"}, [], "algorithm.mu"),
    ({"name": "fedprox", "mu": True}, [], "algorithm.mu"),
    ({"name": "fedprox", "mu": -0.1}, [], "algorithm.mu"),
    ({"name": "feduv", "hinge": "cubic"}, [], "algorithm.hinge"),
    ({"name": "fedavg", "loss": "hinge"}, [], "algorithm.loss"),
    ({"name": "fedavg", "finetune_epochs": 1.5}, [], "algorithm.finetune_epochs"),
    ({"name": "fedavg"}, [{"name": "nope"}], "terms[0].name"),
    ({"name": "fedavg"}, [{"name": "prox"}, {"name": "moon", "temperature": 1.0}], "terms[1].temperature"),
    ({"name": "fedavg"}, [{"name": "prox", "mu": "x"}], "terms[0].mu"),
])
def test_registry_errors_name_the_key(algorithm, terms, needle) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(algorithm, terms)
    message = str(err.value)
    assert needle in message and "\n" not in message


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="fedavg"):
        resolve({"name": "fedsomething"})


def test_config_with_a_bad_method_key_is_rejected_before_training(tmp_path) -> None:
    config = fedlatent.load_config(DIGITS, ['algorithm.name="fedprox"', 'algorithm.mu="x"'])
    with pytest.raises(ConfigError, match="algorithm.mu"):
        fedlatent.run(config, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_two_aggregation_owners_are_rejected() -> None:
    with pytest.raises(ConfigError, match="fednova and feddyn"):
        resolve({"name": "fednova"}, [{"name": "feddyn"}])
    with pytest.raises(ConfigError, match="aggregation"):
        resolve({"name": "feddyn"}, [{"name": "fednova"}])
    # one owner plus terms that do not aggregate is fine
    spec = resolve({"name": "fednova"}, [{"name": "prox"}, {"name": "spherefed"}])
    assert spec.aggregator.name == "fednova" and spec.head.fixed and spec.loss == "mse"


def test_terms_stack_on_a_preset() -> None:
    spec = resolve({"name": "fedprox", "mu": 0.05}, [{"name": "moon", "mu": 2.0}, {"name": "decorrelation"}])
    assert [type(p).__name__ for p in spec.parts] == ["Prox", "Moon", "Decorrelation"]
    assert spec.parts[0].mu == 0.05 and spec.parts[1].weight == 2.0 and spec.parts[2].weight == 0.1


COMPOSED = """
seed = 3
[data]
dataset = "digits"
partition = "iid"
num_clients = 4
[model]
arch = "mlp"
hidden = [32]
[train]
rounds = 2
batch_size = 32
lr = 0.05
momentum = 0.9
[algorithm]
name = "fedprox"
mu = 0.01
[[terms]]
name = "moon"
mu = 1.0
tau = 0.5
"""


@pytest.mark.slow
def test_fedprox_plus_moon_resolves_to_both_and_runs(tmp_path) -> None:
    path = tmp_path / "composed.toml"
    path.write_text(COMPOSED)
    config = fedlatent.load_config(path)
    spec = resolve(config.algorithm, config.terms)
    assert [type(p).__name__ for p in spec.parts] == ["Prox", "Moon"]
    summary = fedlatent.run(config, tmp_path / "run")
    assert summary["rounds_completed"] == 2 and summary["method"] == "fedprox"
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # round 1: prox is on (it is 0 at the first step but not after), MOON has no previous model yet
    assert rows[0]["term_prox"] > 0 and "term_moon" not in rows[0]
    # round 2: both terms act
    assert rows[1]["term_prox"] > 0 and rows[1]["term_moon"] > 0
    assert summary["final"]["accuracy"] > 0.5


def test_every_preset_resolves_and_documents_itself() -> None:
    for name, entry in PRESETS.items():
        spec = resolve({"name": name})
        assert spec.name == name and entry.doc, name


def test_universal_switches_given_explicitly_win_over_spherefed_choices() -> None:
    """registry._apply_common: 'Universal switches override the preset's choices when given' — also
    the choices a part makes in ``configure`` (SphereFed's head, loss and FFC)."""
    default = resolve({"name": "spherefed"})
    assert default.head.fixed and default.head.init == "orthogonal" and not default.head.bias
    assert default.head.normalize_z and default.loss == "mse" and default.calibration.kind == "ffc"
    spec = resolve({"name": "spherefed", "normalize_z": "false", "calibration": "none", "loss": "ce"})
    assert not spec.head.normalize_z and spec.calibration.kind == "none" and spec.loss == "ce"
    assert resolve({"name": "spherefed", "calibration_ridge": 0.1}).calibration.ridge == 0.1
    stacked = resolve({"name": "fedavg", "loss": "ce"}, [{"name": "spherefed"}])
    assert stacked.loss == "ce" and stacked.head.fixed
    assert resolve({"name": "fedavg"}, [{"name": "spherefed"}]).loss == "mse"


@pytest.mark.parametrize("kind,temperature", [("ce", 1.0), ("ce", 0.5), ("mse", 1.0)])
def test_stacked_task_loss_is_each_client_s_own(kind: str, temperature: float) -> None:
    """(clients, batch, classes) logits, as the lockstep trainer's stacked forward gives them
    (here a view of feature-major values, as ``stacked_linear`` makes them): per sample, the loss
    each client's own (batch, classes) logits have, in float64."""
    gen = torch.Generator().manual_seed(5)
    stored = torch.randn(3, 4, 7, generator=gen, dtype=torch.float64)  # (clients, classes, batch)
    logits, y = stored.transpose(1, 2), torch.randint(0, 4, (3, 7), generator=gen)
    per = task_loss(kind, logits, y, reduction="none", temperature=temperature)
    for c in range(3):
        own = task_loss(kind, logits[c].contiguous(), y[c], reduction="none", temperature=temperature)
        torch.testing.assert_close(per[c], own, rtol=1e-12, atol=0)
    assert task_loss(kind, logits, y, temperature=temperature).item() == pytest.approx(per.mean().item(), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mse_task_loss_is_the_mean_squared_distance_to_one_hot_targets(dtype: torch.dtype) -> None:
    """SphereFed's loss (1/C)‖logits − onehot(y)‖² averaged over the batch, computed by hand; the
    per-element form averages to it; an out-of-range label is refused, not silently wrapped."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 4, generator=gen, dtype=dtype)
    y = torch.tensor([0, 3, 1, 1, 2, 0])
    expected = sum(((logits[i, c] - (1.0 if c == y[i] else 0.0)) ** 2).item() for i in range(6) for c in range(4)) / 24
    assert task_loss("mse", logits, y).item() == pytest.approx(expected, rel=1e-6)
    per_element = task_loss("mse", logits, y, reduction="none")
    assert per_element.shape == (6, 4) and per_element.mean().item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(IndexError):
        task_loss("mse", logits, torch.tensor([0, 4, 1, 1, 2, 0]))
