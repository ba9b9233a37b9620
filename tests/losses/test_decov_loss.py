"""DeCov and Structured-DeCov against float64 loops by hand, identities and bad input."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlatent.losses import decov, structured_decov
from fedlatent.losses.decov import covariance, group_of


def _reference(h: np.ndarray, group: list[int]) -> float:
    """½ Σ over pairs (i, j) in different groups of C_ij², C the 1/N covariance, by explicit loops."""
    n, d = h.shape
    mu = [sum(h[k, i] for k in range(n)) / n for i in range(d)]
    total = 0.0
    for i in range(d):
        for j in range(d):
            if group[i] != group[j]:
                c = sum((h[k, i] - mu[i]) * (h[k, j] - mu[j]) for k in range(n)) / n
                total += c * c
    return 0.5 * total


def test_decov_matches_a_float64_reference() -> None:
    h = np.random.default_rng(0).normal(size=(12, 5)) @ np.random.default_rng(1).normal(size=(5, 5))
    got = decov(torch.from_numpy(h))
    assert got.dtype == torch.float64
    assert float(got) == pytest.approx(_reference(h, list(range(5))), rel=1e-12)
    assert torch.allclose(covariance(torch.from_numpy(h)), torch.from_numpy(np.cov(h.T, bias=True)))


def test_structured_decov_matches_a_float64_reference() -> None:
    h = np.random.default_rng(2).normal(size=(10, 7)) @ np.random.default_rng(3).normal(size=(7, 7))
    groups = group_of(7, 3).tolist()
    assert groups == [0, 0, 0, 1, 1, 2, 2]
    assert float(structured_decov(torch.from_numpy(h), 3)) == pytest.approx(_reference(h, groups), rel=1e-12)


def test_uncorrelated_features_give_zero() -> None:
    # the columns of a 4×4 Hadamard matrix (minus the constant one) are centred and mutually orthogonal
    h = torch.tensor([[1, 1, 1], [-1, 1, -1], [1, -1, -1], [-1, -1, 1]], dtype=torch.float64) * torch.tensor([1.0, 3.0, 0.5])
    assert float(decov(h)) == 0.0
    assert float(structured_decov(h, 2)) == 0.0
    assert torch.equal(covariance(h), torch.diag(torch.tensor([1.0, 9.0, 0.25], dtype=torch.float64)))


def test_identities_between_the_two() -> None:
    h = torch.randn(16, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert torch.allclose(structured_decov(h, 6), decov(h), rtol=1e-12)     # one unit per group
    assert float(structured_decov(h, 1)) == 0.0                             # one group: nothing across
    assert 0 < float(structured_decov(h, 3)) < float(decov(h))
    # a hand value: h = [[1, -1], [-1, 1]] has C = [[1, -1], [-1, 1]], so ½ (4 − 2) = 1
    assert float(decov(torch.tensor([[1.0, -1.0], [-1.0, 1.0]]))) == 1.0


def test_gradients_are_correct() -> None:
    h = torch.randn(8, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(decov, (h,))
    assert torch.autograd.gradcheck(lambda x: structured_decov(x, 2), (h,))


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="shape"):
        decov(torch.zeros(3, 2, 2))
    with pytest.raises(ValueError, match="groups"):
        structured_decov(torch.zeros(4, 3), 4)
