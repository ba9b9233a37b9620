"""FedUV L_U against an independent float64 reference (explicit loops over pairs)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedlatent.losses.uniformity import uniformity


def reference_uniformity(z: np.ndarray, sigma_factor: float = 1.0) -> float:
    n = z.shape[0]
    sq = []
    for i in range(n):
        for j in range(i + 1, n):
            sq.append(float(np.sum((z[i] - z[j]) ** 2)))
    if not sq:
        return 0.0
    nonzero = sorted(v for v in sq if v != 0.0)
    if not nonzero:
        return 1.0
    sigma = nonzero[(len(nonzero) - 1) // 2]  # torch.median: the lower middle value
    return sum(math.exp(-v / (sigma_factor * sigma)) for v in sq) / len(sq)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 16])
@pytest.mark.parametrize("sigma_factor", [1.0, 2.0])
def test_matches_reference(n: int, sigma_factor: float) -> None:
    rng = np.random.default_rng(n)
    z = rng.normal(size=(n, 5))
    got = uniformity(torch.from_numpy(z), sigma_factor=sigma_factor)
    assert got.dtype == torch.float64
    assert float(got) == pytest.approx(reference_uniformity(z, sigma_factor), rel=1e-12, abs=1e-14)


def test_duplicate_rows_excluded_from_median_but_counted_in_mean() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(size=(6, 3))
    z[4] = z[1]
    z[5] = z[1]
    got = float(uniformity(torch.from_numpy(z)))
    assert got == pytest.approx(reference_uniformity(z), rel=1e-12)


def test_release_expression() -> None:
    """Same value as the released code's expression (pdist, median of non-zero entries)."""
    torch.manual_seed(1)
    z = torch.randn(10, 4, dtype=torch.float64)
    sq = torch.pdist(z, p=2).pow(2)
    expected = sq.mul(-1 / torch.median(sq[sq != 0])).exp().mean()
    assert torch.allclose(uniformity(z), expected, rtol=1e-12)


@pytest.mark.parametrize("sigma_factor", [1.0, 2.0])
def test_gradcheck(sigma_factor: float) -> None:
    torch.manual_seed(2)
    z = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: uniformity(x, sigma_factor=sigma_factor), (z,))


def test_detach_sigma_gradient_treats_sigma_as_constant() -> None:
    torch.manual_seed(3)
    z = torch.randn(6, 3, dtype=torch.float64)
    sigma = 2.0 * torch.median(torch.pdist(z).pow(2))  # the 15 pairs are all non-zero

    def fixed_bandwidth(x: torch.Tensor) -> torch.Tensor:
        rows, cols = np.triu_indices(x.shape[0], 1)
        sq = ((x[rows] - x[cols]) ** 2).sum(dim=1)
        return torch.exp(-sq / sigma).mean()

    x1 = z.clone().requires_grad_(True)
    x2 = z.clone().requires_grad_(True)
    value = uniformity(x1, sigma_factor=2.0, detach_sigma=True)
    (g1,) = torch.autograd.grad(value, x1)
    (g2,) = torch.autograd.grad(fixed_bandwidth(x2), x2)
    assert torch.allclose(value, uniformity(z, sigma_factor=2.0))
    assert torch.allclose(g1, g2, rtol=1e-10, atol=1e-12)
    (g_full,) = torch.autograd.grad(uniformity(x2, sigma_factor=2.0), x2)
    assert not torch.allclose(g_full, g1)


@pytest.mark.parametrize("n", [0, 1])
def test_fewer_than_two_samples_is_zero(n: int) -> None:
    z = torch.randn(n, 4, requires_grad=True)
    value = uniformity(z)
    assert float(value.detach()) == 0.0
    value.backward()
    assert torch.all(z.grad == 0)


def test_all_identical_rows_is_one_with_zero_gradient() -> None:
    z = torch.ones(5, 3, dtype=torch.float64).mul(0.7).requires_grad_(True)
    value = uniformity(z)
    assert float(value.detach()) == 1.0
    value.backward()
    assert torch.isfinite(z.grad).all() and torch.all(z.grad == 0)
    assert float(uniformity(z.detach(), sigma_factor=2.0, detach_sigma=True)) == 1.0


def test_float32_and_scale_invariance() -> None:
    torch.manual_seed(4)
    z = torch.randn(12, 8)
    value = uniformity(z)
    assert value.dtype == torch.float32
    assert torch.allclose(value, uniformity(10.0 * z), rtol=1e-5)
    assert 0.0 < float(value) < 1.0


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # pdist has no vmap rule; (B, N, d) is the fast path
def test_vmap_matches_loop() -> None:
    torch.manual_seed(5)
    batch = torch.randn(3, 6, 4, dtype=torch.float64)
    batch[1, 2] = batch[1, 0]
    got = torch.func.vmap(uniformity)(batch)
    expected = torch.stack([uniformity(b) for b in batch])
    assert torch.allclose(got, expected, rtol=1e-12)
    grads = torch.func.vmap(torch.func.grad(uniformity))(batch)
    assert torch.isfinite(grads).all()


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        uniformity(torch.randn(3))
    with pytest.raises(ValueError):
        uniformity(torch.randn(2, 3, 4, 2))
    with pytest.raises(ValueError):
        uniformity(torch.randn(3, 2), sigma_factor=0.0)


def test_batched_input_matches_loop() -> None:
    """(B, N, d) is B independent batches (the vectorized backend's clients), duplicates included."""
    torch.manual_seed(6)
    batch = torch.randn(3, 6, 4, dtype=torch.float64)
    batch[1, 2] = batch[1, 0]
    batch[2] = batch[2, 0]  # one client fully collapsed
    x = batch.clone().requires_grad_(True)
    got = uniformity(x, sigma_factor=2.0)
    assert got.shape == (3,)
    assert got.tolist() == pytest.approx([reference_uniformity(b.numpy(), 2.0) for b in batch], rel=1e-12)
    (grads,) = torch.autograd.grad(got.sum(), x)
    for b, g in zip(batch, grads):
        leaf = b.clone().requires_grad_(True)
        (expected,) = torch.autograd.grad(uniformity(leaf, sigma_factor=2.0), leaf)
        assert torch.allclose(g, expected, rtol=1e-10, atol=1e-14)
    assert torch.all(grads[2] == 0)
