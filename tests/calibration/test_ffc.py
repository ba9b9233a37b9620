"""FFC against numpy least squares on the pooled features (float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlatent.calibration.ffc import ffc_solve, ffc_statistics


def pooled_problem(n: int, l: int, c: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, l))
    y = rng.integers(0, c, size=n)
    onehot = np.zeros((n, c))
    onehot[np.arange(n), y] = 1.0
    return z, y, onehot


def three_client_statistics(z: np.ndarray, y: np.ndarray, c: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    parts = np.split(order, sorted(rng.choice(np.arange(1, len(y)), size=2, replace=False)))
    return [ffc_statistics(torch.from_numpy(z[p]), torch.from_numpy(y[p]), c) for p in parts]


def test_statistics_match_loops() -> None:
    z, y, onehot = pooled_problem(12, 4, 3, 0)
    v, u = ffc_statistics(torch.from_numpy(z), torch.from_numpy(y), 3)
    v_ref = sum(np.outer(z[i], z[i]) for i in range(12))
    u_ref = sum(np.outer(z[i], onehot[i]) for i in range(12))
    assert v.shape == (4, 4) and u.shape == (4, 3)
    np.testing.assert_allclose(v.numpy(), v_ref, rtol=1e-12)
    np.testing.assert_allclose(u.numpy(), u_ref, rtol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_three_clients_equal_pooled_lstsq(seed: int) -> None:
    n, l, c = 300, 16, 10
    z, y, onehot = pooled_problem(n, l, c, seed)
    w = ffc_solve(three_client_statistics(z, y, c, seed))
    expected = np.linalg.lstsq(z, onehot, rcond=None)[0].T
    assert w.shape == (c, l) and w.dtype == torch.float64
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("ridge", [0.1, 1.0, 25.0])
def test_ridge_closed_form(ridge: float) -> None:
    n, l, c = 200, 12, 5
    z, y, onehot = pooled_problem(n, l, c, 4)
    w = ffc_solve(three_client_statistics(z, y, c, 4), ridge=ridge)
    expected = np.linalg.solve(z.T @ z + ridge * np.eye(l), z.T @ onehot).T
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_singular_more_dimensions_than_samples_gives_minimum_norm() -> None:
    n, l, c = 10, 25, 4
    z, y, onehot = pooled_problem(n, l, c, 5)
    w = ffc_solve(three_client_statistics(z, y, c, 5))
    expected = np.linalg.lstsq(z, onehot, rcond=None)[0].T  # numpy's lstsq is minimum-norm
    np.testing.assert_allclose(expected, (np.linalg.pinv(z) @ onehot).T, atol=1e-10)
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6, atol=1e-6)
    # it interpolates the labels (rank n) and has no component outside the row space of z
    np.testing.assert_allclose(z @ w.numpy().T, onehot, atol=1e-8)
    null = np.linalg.svd(z)[2][n:]
    assert np.abs(null @ w.numpy().T).max() < 1e-8


def test_rank_deficient_columns_give_minimum_norm() -> None:
    n, c = 50, 3
    z, y, onehot = pooled_problem(n, 6, c, 6)
    z = np.concatenate([z, z[:, :2], np.zeros((n, 1))], axis=1)  # duplicated and zero columns
    w = ffc_solve(three_client_statistics(z, y, c, 6))
    expected = np.linalg.lstsq(z, onehot, rcond=None)[0].T
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_collapsed_float32_features_drop_rounding_noise_directions() -> None:
    """Features of rank 20 in 64 dimensions, rounded to float32: the rounding makes the pooled
    matrix full rank with singular values ~1e-7 relative. lstsq with its default cutoff fits
    that noise with a huge classifier; FFC drops directions below sqrt(rtol) = 1e-5 relative,
    which is lstsq with rcond=1e-5, with (almost) the same residual."""
    g = torch.Generator().manual_seed(0)
    z = torch.nn.functional.normalize(torch.randn(3000, 20, generator=g) @ torch.randn(20, 64, generator=g), dim=1)
    y = torch.randint(0, 10, (3000,), generator=g)
    zz, onehot = z.double().numpy(), np.eye(10)[y.numpy()]
    stats = [ffc_statistics(z[i::3], y[i::3], 10, dtype=torch.float64) for i in range(3)]
    w = ffc_solve(stats).numpy()
    truncated = np.linalg.lstsq(zz, onehot, rcond=1e-5)[0].T
    np.testing.assert_allclose(w, truncated, rtol=1e-6, atol=1e-8)
    noisy = np.linalg.lstsq(zz, onehot, rcond=None)[0].T
    assert np.linalg.norm(w) < 1e-3 * np.linalg.norm(noisy)
    residual = np.linalg.norm(zz @ w.T - onehot)
    assert residual < 1.01 * np.linalg.norm(zz @ noisy.T - onehot)


def test_single_pair_and_personalised_variant() -> None:
    z, y, onehot = pooled_problem(80, 5, 3, 7)
    stats = three_client_statistics(z, y, 3, 7)
    assert torch.equal(ffc_solve(stats[0]), ffc_solve([stats[0]]))
    v0, u0 = stats[0]
    expected = np.linalg.solve(v0.numpy() + 0.1 * np.eye(5), u0.numpy()).T
    np.testing.assert_allclose(ffc_solve(stats[0], ridge=0.1).numpy(), expected, rtol=1e-8)


def test_float32_in_float32_out_and_linear_layout() -> None:
    torch.manual_seed(0)
    z = torch.nn.functional.normalize(torch.randn(400, 8), dim=1)
    y = torch.randint(0, 4, (400,))
    stats = ffc_statistics(z, y, 4)
    assert stats[0].dtype == torch.float32
    w = ffc_solve(stats)
    assert w.dtype == torch.float32 and w.shape == (4, 8)
    head = torch.nn.Linear(8, 4, bias=False)
    with torch.no_grad():
        head.weight.copy_(w)
    expected = np.linalg.lstsq(z.double().numpy(), np.eye(4)[y.numpy()], rcond=None)[0].T
    np.testing.assert_allclose(head.weight.detach().numpy(), expected, rtol=1e-4, atol=1e-5)
    stats64 = ffc_statistics(z, y, 4, dtype=torch.float64)
    assert stats64[1].dtype == torch.float64


def test_no_data_gives_zero_classifier() -> None:
    w = ffc_solve(ffc_statistics(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), 2))
    assert w.shape == (2, 3) and torch.all(w == 0)


def test_rejects_bad_input() -> None:
    v, u = ffc_statistics(torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 0]), 2)
    with pytest.raises(ValueError):
        ffc_solve([])
    with pytest.raises(ValueError):
        ffc_solve((v, u), ridge=-1.0)
    with pytest.raises(ValueError):
        ffc_solve([(v, u), (v[:2, :2], u[:2])])
    with pytest.raises(ValueError):
        ffc_statistics(torch.randn(5, 3), torch.tensor([0, 1]), 2)
