"""Server side against float64 hand formulas: the server optimisers on the pseudo-gradient
(FedAvgM in both forms, FedAdam / FedAdagrad / FedYogi as in Reddi et al. 2021, Algorithm 2),
FedNova's normalising factor and aggregation, and the sample-weighted mean."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedlatent.config import ServerConfig
from fedlatent.methods.aggregation import weighted_mean
from fedlatent.methods.fednova import FedNova, normalising_factor
from fedlatent.methods.parts import MethodSpec, Upload
from fedlatent.federated.server import OPT, Server, resolve_server, server_step

STEPS = 3


def _trajectory(seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """A starting weight vector and three 'aggregates' the server receives in turn (float64)."""
    rng = np.random.default_rng(seed)
    w0 = rng.normal(size=7)
    # mixed signs and magnitudes, one coordinate with Δ = 0 at some step
    deltas = [rng.normal(scale=s, size=7) for s in (0.5, 0.05, 1.5)]
    deltas[1][3] = 0.0
    return w0, deltas


def _library(kind: str, cfg: ServerConfig, lr: float, w0: np.ndarray, deltas: list[np.ndarray]) -> list[np.ndarray]:
    """Run ``server_step`` for every step; the aggregate at step t is w_t + Δ_t."""
    state: dict[str, torch.Tensor] = {}
    w = {"w": torch.tensor(w0), "buf": torch.tensor([5.0], dtype=torch.float64)}
    out = []
    for delta in deltas:
        new = {"w": w["w"] + torch.tensor(delta), "buf": torch.tensor([7.0], dtype=torch.float64)}
        w = server_step(kind, w, new, ["w"], state, cfg, lr)
        assert w["buf"].item() == 7.0  # not a trainable name: taken from the aggregate as it is
        out.append(w["w"].numpy().copy())
    return out


def _hand(kind: str, cfg: ServerConfig, lr: float, w0: np.ndarray, deltas: list[np.ndarray]) -> list[np.ndarray]:
    w, out = w0.copy(), []
    m = np.zeros_like(w0)
    v = np.full_like(w0, cfg.tau ** 2)  # Reddi et al. Alg. 2: v_{-1} = τ²
    for d in deltas:
        if kind == "sgd":
            w = w + lr * d
        elif kind == "momentum":
            m = cfg.momentum * m + (d if cfg.momentum_form == "hsu" else (1 - cfg.momentum) * d)
            w = w + lr * m
        else:
            m = cfg.beta1 * m + (1 - cfg.beta1) * d
            if kind == "adam":
                v = cfg.beta2 * v + (1 - cfg.beta2) * d ** 2
            elif kind == "adagrad":
                v = v + d ** 2
            else:  # yogi
                v = v - (1 - cfg.beta2) * d ** 2 * np.sign(v - d ** 2)
            w = w + lr * m / (np.sqrt(v) + cfg.tau)
        out.append(w.copy())
    return out


CASES = [
    ("sgd", ServerConfig(), 0.7),
    ("momentum", ServerConfig(momentum=0.9, momentum_form="hsu"), 1.0),
    ("momentum", ServerConfig(momentum=0.6, momentum_form="hsu"), 0.5),
    ("momentum", ServerConfig(momentum=0.9, momentum_form="ema"), 1.0),
    ("momentum", ServerConfig(momentum=0.6, momentum_form="ema"), 0.5),
    ("adam", ServerConfig(beta1=0.9, beta2=0.99, tau=1e-3), 0.01),
    ("adam", ServerConfig(beta1=0.5, beta2=0.9, tau=0.1), 0.3),
    ("adagrad", ServerConfig(beta1=0.9, tau=1e-3), 0.01),
    ("adagrad", ServerConfig(beta1=0.0, tau=0.1), 0.3),
    ("yogi", ServerConfig(beta1=0.9, beta2=0.99, tau=1e-3), 0.01),
    ("yogi", ServerConfig(beta1=0.5, beta2=0.9, tau=0.1), 0.3),
]


@pytest.mark.parametrize("kind,cfg,lr", CASES, ids=[f"{k}-{c.momentum_form if k == 'momentum' else c.tau}-{lr}"
                                                     for k, c, lr in CASES])
def test_server_optimiser_matches_hand_formula_over_three_steps(kind, cfg, lr) -> None:
    w0, deltas = _trajectory()
    got = _library(kind, cfg, lr, w0, deltas)
    want = _hand(kind, cfg, lr, w0, deltas)
    assert len(got) == STEPS
    for t in range(STEPS):
        np.testing.assert_allclose(got[t], want[t], rtol=1e-12, atol=1e-12, err_msg=f"{kind} step {t + 1}")


def test_momentum_forms_differ_and_state_is_kept_under_the_documented_keys() -> None:
    w0, deltas = _trajectory(1)
    hsu = _library("momentum", ServerConfig(momentum=0.9, momentum_form="hsu"), 1.0, w0, deltas)
    ema = _library("momentum", ServerConfig(momentum=0.9, momentum_form="ema"), 1.0, w0, deltas)
    assert not np.allclose(hsu[0], ema[0])
    state: dict[str, torch.Tensor] = {}
    old = {"w": torch.tensor(w0)}
    server_step("adam", old, {"w": old["w"] + 1.0}, ["w"], state, ServerConfig(), 0.01)
    assert set(state) == {f"{OPT}m.w", f"{OPT}v.w"}


def test_adam_first_step_is_about_lr_times_sign() -> None:
    """Reddi et al. without bias correction: m = (1−β1)Δ, √v ≈ √(1−β2)|Δ| → step ≈ η·0.1/0.1·sign(Δ)."""
    cfg = ServerConfig(beta1=0.9, beta2=0.99, tau=1e-3)
    old = {"w": torch.zeros(3, dtype=torch.float64)}
    delta = torch.tensor([2.0, -3.0, 5.0], dtype=torch.float64)
    out = server_step("adam", old, {"w": delta}, ["w"], {}, cfg, 0.01)
    np.testing.assert_allclose(out["w"].numpy(), 0.01 * np.sign(delta.numpy()), rtol=1e-2)


def test_sgd_with_unit_lr_returns_the_aggregate_unchanged() -> None:
    old = {"w": torch.zeros(2)}
    new = {"w": torch.tensor([1.0, 2.0])}
    assert server_step("sgd", old, new, ["w"], {}, ServerConfig(), 1.0) is new


def test_resolve_server_defaults() -> None:
    assert resolve_server(ServerConfig(), MethodSpec("x")) == ("sgd", 1.0)
    assert resolve_server(ServerConfig(), MethodSpec("x", server_optimizer="momentum")) == ("momentum", 1.0)
    assert resolve_server(ServerConfig(), MethodSpec("x", server_optimizer="adam")) == ("adam", 0.01)
    assert resolve_server(ServerConfig(optimizer="yogi", lr=0.2), MethodSpec("x")) == ("yogi", 0.2)


# ---- FedNova ---------------------------------------------------------------------------------------

def _nova_factor_by_unrolling(steps: int, rho: float) -> float:
    """Σ_{t<τ} Σ_{s≤t} ρ^s: the total displacement of τ heavy-ball steps (buf = ρ·buf + g) under a
    constant gradient, in units of lr·g (FedNova, Wang et al. 2020, appendix on momentum)."""
    total, buf = 0.0, 0.0
    for _ in range(steps):
        buf = rho * buf + 1.0
        total += buf
    return total


@pytest.mark.parametrize("steps", [1, 2, 5, 17])
@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9, 0.99])
def test_fednova_normalising_factor(steps: int, rho: float) -> None:
    want = _nova_factor_by_unrolling(steps, rho)
    if rho > 0:  # the closed form of METHODS.md
        closed = (steps - rho * (1 - rho ** steps) / (1 - rho)) / (1 - rho)
        assert math.isclose(want, closed, rel_tol=1e-12)
    assert math.isclose(normalising_factor(steps, rho), want, rel_tol=1e-10)


@pytest.mark.parametrize("steps", [1, 3, 40])
def test_fednova_factor_tends_to_tau_as_momentum_vanishes(steps: int) -> None:
    assert normalising_factor(steps, 0.0) == float(steps)
    for rho in (1e-4, 1e-7):
        assert abs(normalising_factor(steps, rho) - steps) < 10 * rho * steps ** 2
    assert normalising_factor(steps, 1e-7) != float(steps) or steps == 1


def test_fednova_aggregate_matches_formula_with_unequal_steps() -> None:
    rng = np.random.default_rng(3)
    wg = rng.normal(size=(3, 2))
    counts, steps, rhos = [10, 30, 60], [2, 6, 11], [0.0, 0.9, 0.5]
    locals_ = [wg + rng.normal(scale=0.3, size=wg.shape) for _ in counts]
    tracked = [4, 5, 7]
    uploads = [Upload(i, {"w": torch.tensor(w), "bn.num_batches_tracked": torch.tensor(b)}, n, k, 0.1, r)
               for i, (w, b, n, k, r) in enumerate(zip(locals_, tracked, counts, steps, rhos))]
    state = {"w": torch.tensor(wg), "bn.num_batches_tracked": torch.tensor(0)}
    out = FedNova().aggregate(state, uploads, {}, {"w"}, num_clients=5)
    p = np.array(counts) / sum(counts)
    a = np.array([_nova_factor_by_unrolling(k, r) for k, r in zip(steps, rhos)])
    direction = sum(pi * (wg - wi) / ai for pi, ai, wi in zip(p, a, locals_))
    want = wg - (p @ a) * direction
    np.testing.assert_allclose(out["w"].numpy(), want, rtol=1e-12, atol=1e-12)
    # buffers: the sample-weighted mean, rounded back (4·0.1 + 5·0.3 + 7·0.6 = 6.1 → 6)
    assert out["bn.num_batches_tracked"].dtype == torch.int64
    assert int(out["bn.num_batches_tracked"]) == 6
    # unlike the plain mean
    plain = sum(pi * wi for pi, wi in zip(p, locals_))
    assert not np.allclose(out["w"].numpy(), plain, atol=1e-3)


def test_fednova_with_equal_plain_sgd_steps_is_the_weighted_mean() -> None:
    rng = np.random.default_rng(4)
    wg = rng.normal(size=5)
    counts = [3, 9]
    locals_ = [wg + rng.normal(size=5) for _ in counts]
    uploads = [Upload(i, {"w": torch.tensor(w)}, n, 7, 0.1, 0.0) for i, (w, n) in enumerate(zip(locals_, counts))]
    out = FedNova().aggregate({"w": torch.tensor(wg)}, uploads, {}, {"w"}, num_clients=2)
    np.testing.assert_allclose(out["w"].numpy(), (3 * locals_[0] + 9 * locals_[1]) / 12, rtol=1e-12)


# ---- weighted mean ---------------------------------------------------------------------------------

def test_weighted_mean_by_hand_including_integer_and_float64_buffers() -> None:
    ups = [
        Upload(0, {"w": torch.tensor([1.0, -2.0]), "n": torch.tensor(10), "d": torch.tensor([0.1], dtype=torch.float64)},
               num_samples=3, steps=1, lr=0.1, momentum=0.0),
        Upload(1, {"w": torch.tensor([5.0, 2.0]), "n": torch.tensor(21), "d": torch.tensor([0.3], dtype=torch.float64)},
               num_samples=1, steps=1, lr=0.1, momentum=0.0),
    ]
    out = weighted_mean(ups)
    # (3·w0 + 1·w1)/4
    np.testing.assert_allclose(out["w"].numpy(), [(3 * 1 + 5) / 4, (3 * -2 + 2) / 4], rtol=1e-7)
    assert out["w"].dtype == torch.float32
    # integer buffer: (3·10 + 21)/4 = 12.75 → rounded back to 13, still int64
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 13
    assert out["d"].dtype == torch.float64
    assert out["d"].item() == pytest.approx((3 * 0.1 + 0.3) / 4, rel=1e-15)
    # a subset of keys
    assert set(weighted_mean(ups, ["w"])) == {"w"}


def test_server_round_uses_weighted_mean_and_keeps_frozen_parameters() -> None:
    spec = MethodSpec("fedavg")
    old = {"a": torch.zeros(2), "head": torch.ones(2), "bn": torch.tensor(0)}
    server = Server(spec, old, ["a", "head"], ["a"], ServerConfig(), num_clients=4)
    ups = [Upload(0, {"a": torch.tensor([1.0, 1.0]), "head": torch.tensor([9.0, 9.0]), "bn": torch.tensor(2)}, 1, 1, 0.1, 0.0),
           Upload(1, {"a": torch.tensor([4.0, 0.0]), "head": torch.tensor([9.0, 9.0]), "bn": torch.tensor(6)}, 2, 1, 0.1, 0.0)]
    server.aggregate(ups)
    np.testing.assert_allclose(server.global_state["a"].numpy(), [3.0, 1 / 3], rtol=1e-6)
    assert torch.equal(server.global_state["head"], torch.ones(2))  # a frozen parameter is never aggregated
    assert int(server.global_state["bn"]) == round((2 + 12) / 3)
