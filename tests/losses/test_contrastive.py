"""MOON, FedProx and FedProto terms against independent float64 references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedlatent.losses.contrastive import moon_contrastive, prototype_distance, proximal


def reference_moon(z: np.ndarray, z_glob: np.ndarray, z_prevs: list[np.ndarray], tau: float) -> float:
    def cos(a: np.ndarray, b: np.ndarray) -> float:
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))

    total = 0.0
    for i in range(z.shape[0]):
        pos = math.exp(cos(z[i], z_glob[i]) / tau)
        neg = sum(math.exp(cos(z[i], p[i]) / tau) for p in z_prevs)
        total += -math.log(pos / (pos + neg))
    return total / z.shape[0]


def test_hand_calculation() -> None:
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    z_glob = torch.tensor([[3.0, 0.0], [0.0, 1.0]], dtype=torch.float64)  # cos = 1 for both
    z_prev = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)  # cos = 0 for both
    # l = -log(e^{1/tau} / (e^{1/tau} + e^{0})) = log(1 + e^{-1/tau})
    assert float(moon_contrastive(z, z_glob, z_prev, 0.5)) == pytest.approx(math.log(1 + math.exp(-2.0)), rel=1e-14)
    assert float(moon_contrastive(z, z_glob, z_prev, 1.0)) == pytest.approx(math.log(1 + math.exp(-1.0)), rel=1e-14)
    # two previous models, one of them identical to the positive: log(1 + e^{-2} + 1)
    got = moon_contrastive(z, z_glob, [z_prev, z_glob], 0.5)
    assert float(got) == pytest.approx(math.log(2 + math.exp(-2.0)), rel=1e-14)


@pytest.mark.parametrize("tau", [0.5, 1.0, 0.07])
@pytest.mark.parametrize("num_prev", [1, 2, 3])
def test_matches_reference(tau: float, num_prev: int) -> None:
    rng = np.random.default_rng(num_prev)
    z, z_glob = rng.normal(size=(2, 9, 6))
    prevs = list(rng.normal(size=(num_prev, 9, 6)))
    t = [torch.from_numpy(a) for a in prevs]
    got = moon_contrastive(torch.from_numpy(z), torch.from_numpy(z_glob), t if num_prev > 1 else t[0], tau)
    assert float(got) == pytest.approx(reference_moon(z, z_glob, prevs, tau), rel=1e-12)


def test_batched_batches_are_independent_references() -> None:
    """(B, N, d) inputs: one value per batch, each its own float64 reference; no previous model:
    B zeros."""
    rng = np.random.default_rng(7)
    z, z_glob, z_prev = rng.normal(size=(3, 4, 9, 6))
    got = moon_contrastive(torch.from_numpy(z), torch.from_numpy(z_glob), torch.from_numpy(z_prev), 0.5)
    assert got.shape == (4,)
    for b in range(4):
        assert float(got[b]) == pytest.approx(reference_moon(z[b], z_glob[b], [z_prev[b]], 0.5), rel=1e-12)
    none = moon_contrastive(torch.from_numpy(z), torch.from_numpy(z_glob), None, 0.5)
    assert none.shape == (4,) and not none.any()


@pytest.mark.parametrize("z_prev", [None, []])
def test_round_zero_is_zero(z_prev: object) -> None:
    z = torch.randn(5, 4, requires_grad=True)
    value = moon_contrastive(z, torch.randn(5, 4), z_prev, 0.5)  # type: ignore[arg-type]
    assert float(value.detach()) == 0.0
    value.backward()
    assert torch.all(z.grad == 0)


def test_small_temperature_is_stable() -> None:
    torch.manual_seed(0)
    z = torch.randn(4, 3)
    value = moon_contrastive(z, -z, z, 1e-4)  # cos = -1 vs +1: exp(2e4) would overflow
    assert torch.isfinite(value)
    assert float(value) == pytest.approx(2.0 / 1e-4, rel=1e-4)


def test_gradcheck_moon() -> None:
    torch.manual_seed(1)
    args = [torch.randn(5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    assert torch.autograd.gradcheck(lambda a, b, c: moon_contrastive(a, b, [c], 0.5), tuple(args))


def test_moon_shape_mismatch() -> None:
    with pytest.raises(ValueError):
        moon_contrastive(torch.randn(3, 2), torch.randn(3, 2), torch.randn(4, 2), 0.5)
    with pytest.raises(ValueError):
        moon_contrastive(torch.randn(3, 2), torch.randn(3, 2), None, 0.0)


def test_proximal_matches_reference() -> None:
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (4,), (2, 2, 2)]
    w = [rng.normal(size=s) for s in shapes]
    w_ref = [rng.normal(size=s) for s in shapes]
    expected = 0.01 / 2 * sum(float(((a - b) ** 2).sum()) for a, b in zip(w, w_ref))
    got = proximal([torch.from_numpy(a) for a in w], [torch.from_numpy(b) for b in w_ref], 0.01)
    assert float(got) == pytest.approx(expected, rel=1e-12)


def test_proximal_gradient_and_edge_cases() -> None:
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    ref = torch.randn(3, dtype=torch.float64)
    (grad,) = torch.autograd.grad(proximal([w], [ref], 0.3), w)
    assert torch.allclose(grad, 0.3 * (w.detach() - ref))
    assert float(proximal([w], [w.detach()], 1.0).detach()) == 0.0
    assert float(proximal([], [], 1.0)) == 0.0
    with pytest.raises(ValueError):
        proximal([w], [], 1.0)
    with pytest.raises(ValueError):
        proximal([w], [torch.zeros(4)], 1.0)


def reference_prototype(z: np.ndarray, y: np.ndarray, protos: np.ndarray, present: np.ndarray) -> float:
    dists = [float(((z[i] - protos[y[i]]) ** 2).sum()) for i in range(len(y)) if present[y[i]]]
    return sum(dists) / len(dists) if dists else 0.0


def test_prototype_distance_matches_reference() -> None:
    rng = np.random.default_rng(2)
    z = rng.normal(size=(20, 5))
    y = rng.integers(0, 4, size=20)
    protos = rng.normal(size=(4, 5))
    present = np.array([True, False, True, True])
    protos[1] = np.nan  # an absent class's row is never read
    got = prototype_distance(torch.from_numpy(z), torch.from_numpy(y), torch.from_numpy(protos), torch.from_numpy(present))
    assert float(got) == pytest.approx(reference_prototype(z, y, protos, present), rel=1e-12)


def test_prototype_distance_official_is_release_mse() -> None:
    rng = np.random.default_rng(3)
    z = torch.from_numpy(rng.normal(size=(10, 3)))
    y = torch.from_numpy(rng.integers(0, 3, size=10))
    protos = torch.from_numpy(rng.normal(size=(3, 3)))
    present = torch.tensor([True, True, False])
    target = z.clone()
    for i in range(10):
        if present[y[i]]:
            target[i] = protos[y[i]]
    expected = torch.nn.functional.mse_loss(target, z)
    got = prototype_distance(z, y, protos, present, semantics="official")
    assert float(got) == pytest.approx(float(expected), rel=1e-12)


def test_prototype_distance_edge_cases_and_gradient() -> None:
    z = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 1, 1, 2, 0, 2])
    protos = torch.randn(3, 3, dtype=torch.float64)
    none_present = torch.zeros(3, dtype=torch.bool)
    value = prototype_distance(z, y, protos, none_present)
    assert float(value.detach()) == 0.0 and torch.isfinite(value)
    value.backward()
    assert torch.all(z.grad == 0)
    mask = torch.tensor([True, False, True])
    assert torch.autograd.gradcheck(lambda x: prototype_distance(x, y, protos, mask), (z,))
    assert float(prototype_distance(z[:0], y[:0], protos, mask).detach()) == 0.0
