"""FedDecorr's term against independent float64 references (explicit loops, np.corrcoef)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedlatent.losses.decorrelation import decorrelation


def reference_paper(z: np.ndarray, eps: float = 1e-8) -> float:
    n, d = z.shape
    mean = [sum(z[:, i]) / n for i in range(d)]
    var = [sum((z[k, i] - mean[i]) ** 2 for k in range(n)) / n for i in range(d)]
    total = 0.0
    for i in range(d):
        for j in range(d):
            cov = sum((z[k, i] - mean[i]) * (z[k, j] - mean[j]) for k in range(n)) / n
            total += (cov / math.sqrt((var[i] + eps) * (var[j] + eps))) ** 2
    return total / d**2


def reference_official(z: np.ndarray, eps: float = 1e-8) -> float:
    n, d = z.shape
    mean = [sum(z[:, i]) / n for i in range(d)]
    var = [sum((z[k, i] - mean[i]) ** 2 for k in range(n)) / (n - 1) for i in range(d)]
    total = 0.0
    for i in range(d):
        for j in range(d):
            if i == j:
                continue
            m_ij = sum((z[k, i] - mean[i]) * (z[k, j] - mean[j]) for k in range(n))
            total += (m_ij / math.sqrt((var[i] + eps) * (var[j] + eps))) ** 2
    return total / (d * (d - 1)) / n


def correlated_sample(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) @ rng.normal(size=(d, d))


@pytest.mark.parametrize("n,d", [(2, 2), (5, 3), (16, 8), (40, 5)])
def test_paper_matches_reference(n: int, d: int) -> None:
    z = correlated_sample(n, d, n + d)
    got = decorrelation(torch.from_numpy(z), "paper")
    assert got.dtype == torch.float64
    assert float(got) == pytest.approx(reference_paper(z), rel=1e-10)


@pytest.mark.parametrize("n,d", [(2, 2), (5, 3), (16, 8), (40, 5)])
def test_official_matches_reference(n: int, d: int) -> None:
    z = correlated_sample(n, d, 10 * n + d)
    got = decorrelation(torch.from_numpy(z), "official")
    assert float(got) == pytest.approx(reference_official(z), rel=1e-10)


def test_paper_is_mean_squared_correlation() -> None:
    z = correlated_sample(30, 6, 0)
    corr = np.corrcoef(z, rowvar=False)
    expected = float(np.sum(corr**2)) / 36
    assert float(decorrelation(torch.from_numpy(z), "paper", eps=0.0)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n,d", [(4, 2), (16, 8), (128, 32)])
def test_official_to_paper_ratio(n: int, d: int) -> None:
    z = torch.from_numpy(correlated_sample(n, d, 7))
    paper = float(decorrelation(z, "paper", eps=0.0))
    official = float(decorrelation(z, "official", eps=0.0))
    # official = (N-1)^2/N * d/(d-1) * (paper - 1/d): "about N d/(d-1) times" the off-diagonal part
    assert official == pytest.approx((n - 1) ** 2 / n * d / (d - 1) * (paper - 1 / d), rel=1e-10)
    # with the default eps and unit-scale data the relation holds to ~eps
    paper_eps = float(decorrelation(z, "paper"))
    official_eps = float(decorrelation(z, "official"))
    assert official_eps == pytest.approx((n - 1) ** 2 / n * d / (d - 1) * (paper_eps - 1 / d), rel=1e-6)


@pytest.mark.parametrize("semantics", ["paper", "official"])
def test_gradcheck(semantics: str) -> None:
    torch.manual_seed(0)
    z = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: decorrelation(x, semantics), (z,))


@pytest.mark.parametrize("semantics", ["paper", "official"])
def test_single_sample_is_zero(semantics: str) -> None:
    z = torch.randn(1, 5, requires_grad=True)
    value = decorrelation(z, semantics)
    assert float(value.detach()) == 0.0
    value.backward()
    assert torch.all(z.grad == 0)


@pytest.mark.parametrize("semantics", ["paper", "official"])
@pytest.mark.parametrize("eps", [1e-8, 0.0])
def test_constant_column_is_finite(semantics: str, eps: float) -> None:
    torch.manual_seed(1)
    z = torch.randn(8, 4, dtype=torch.float64)
    z[:, 2] = 3.0
    z.requires_grad_(True)
    value = decorrelation(z, semantics, eps=eps)
    assert torch.isfinite(value)
    value.backward()
    assert torch.isfinite(z.grad).all()
    # the constant column contributes nothing: same as the other three columns' terms
    rest = z.detach()[:, [0, 1, 3]].numpy()
    if semantics == "paper":
        expected = reference_paper(rest, eps) * 9 / 16  # same squared entries, divided by d^2 = 16
    else:
        expected = reference_official(rest, eps) * 6 / 12  # same off-diagonal sum over d(d-1) = 12
    assert float(value.detach()) == pytest.approx(expected, rel=1e-9)


def test_all_constant_and_one_dimension() -> None:
    assert float(decorrelation(torch.ones(6, 3), "paper")) == 0.0
    assert float(decorrelation(torch.ones(6, 3), "official")) == 0.0
    z = torch.randn(6, 1, dtype=torch.float64)
    assert float(decorrelation(z, "official")) == 0.0
    assert float(decorrelation(z, "paper")) == pytest.approx(1.0, rel=1e-6)


def test_float32_and_bounds() -> None:
    torch.manual_seed(2)
    z = torch.randn(64, 16)
    value = decorrelation(z)
    assert value.dtype == torch.float32
    assert 1 / 16 <= float(value) <= 1.0
    collinear = torch.randn(64, 1).repeat(1, 16)
    assert float(decorrelation(collinear)) == pytest.approx(1.0, rel=1e-5)


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        decorrelation(torch.randn(4, 3), "release")
    with pytest.raises(ValueError):
        decorrelation(torch.randn(4))
