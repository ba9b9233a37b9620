"""FedUV L_V against an independent float64 reference (numpy, explicit loops)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedlatent.losses.variance import variance


def reference_variance(logits: np.ndarray, gamma: float | None = None, hinge: str = "hinge") -> float:
    n, c = logits.shape
    if gamma is None:
        gamma = float(np.mean(np.std(np.eye(c), axis=0, ddof=1)))
    p = np.empty_like(logits)
    for i in range(n):
        e = np.exp(logits[i] - logits[i].max())
        p[i] = e / e.sum()
    total = 0.0
    for k in range(c):
        col = p[:, k]
        std = math.sqrt(sum((v - col.mean()) ** 2 for v in col) / (n - 1)) if n > 1 else 0.0
        gap = gamma - std
        total += {"hinge": max(0.0, gap), "none": gap, "squared": max(0.0, gap) ** 2}[hinge]
    return total / c


@pytest.mark.parametrize("c", [1, 2, 3, 10, 100])
def test_default_gamma_is_identity_std(c: int) -> None:
    if c > 1:  # the unbiased std of a 1 x 1 matrix is undefined; gamma is then 1/sqrt(1)
        identity_std = float(np.mean(np.std(np.eye(c), axis=0, ddof=1)))
        assert identity_std == pytest.approx(1.0 / math.sqrt(c), rel=1e-12)
        # also through torch's own unbiased std
        assert float(torch.eye(c, dtype=torch.float64).std(dim=0).mean()) == pytest.approx(1.0 / math.sqrt(c))
    logits = torch.zeros(1, c, dtype=torch.float64)  # N = 1: std taken as 0, so L_V = gamma
    assert float(variance(logits)) == pytest.approx(1.0 / math.sqrt(c), rel=1e-12)


@pytest.mark.parametrize("hinge", ["hinge", "none", "squared"])
@pytest.mark.parametrize("n,c", [(2, 3), (8, 10), (64, 10), (5, 100)])
def test_matches_reference(hinge: str, n: int, c: int) -> None:
    rng = np.random.default_rng(n * 1000 + c)
    logits = rng.normal(scale=3.0, size=(n, c))
    got = variance(torch.from_numpy(logits), hinge=hinge)
    assert got.dtype == torch.float64
    assert float(got) == pytest.approx(reference_variance(logits, hinge=hinge), rel=1e-10, abs=1e-14)


def test_custom_gamma() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(16, 4))
    for gamma in (0.0, 0.1, 0.9):
        got = float(variance(torch.from_numpy(logits), gamma=gamma, hinge="none"))
        assert got == pytest.approx(reference_variance(logits, gamma=gamma, hinge="none"), rel=1e-10, abs=1e-14)


@pytest.mark.parametrize("hinge", ["hinge", "none", "squared"])
def test_gradcheck(hinge: str) -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: variance(x, hinge=hinge), (logits,))


def test_single_sample_is_finite() -> None:
    logits = torch.randn(1, 10, requires_grad=True)
    value = variance(logits)
    assert torch.isfinite(value)
    assert float(value.detach()) == pytest.approx(1 / math.sqrt(10), rel=1e-6)
    value.backward()
    assert torch.isfinite(logits.grad).all()
    assert float(variance(logits.detach(), hinge="squared")) == pytest.approx(0.1, rel=1e-6)


def test_identical_rows_finite_value_and_gradient() -> None:
    logits = torch.randn(1, 5, dtype=torch.float64).repeat(8, 1).requires_grad_(True)
    value = variance(logits)
    assert float(value.detach()) == pytest.approx(1 / math.sqrt(5), rel=1e-12)
    value.backward()
    assert torch.isfinite(logits.grad).all()


def test_class_never_predicted() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(32, 5))
    logits[:, 3] = -50.0  # class 3 gets ~0 probability everywhere
    t = torch.from_numpy(logits).requires_grad_(True)
    value = variance(t)
    assert float(value.detach()) == pytest.approx(reference_variance(logits), rel=1e-10)
    value.backward()
    assert torch.isfinite(t.grad).all()


def test_confident_diverse_predictions_reach_zero() -> None:
    logits = 100.0 * torch.eye(10, dtype=torch.float64)
    assert float(variance(logits)) == pytest.approx(0.0, abs=1e-12)


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        variance(torch.randn(4, 3), hinge="relu")
    with pytest.raises(ValueError):
        variance(torch.randn(4))
