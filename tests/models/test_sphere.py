"""unit_rows: F.normalize's value and gradient; checked in float64, under vmap,
on zero and clamped rows."""
from __future__ import annotations

import torch
from torch.nn import functional as F

from fedlatent.models.sphere import unit_rows


def _z(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def test_value_is_rows_over_their_norms() -> None:
    z = _z(7, 5)
    expected = z / torch.sqrt((z * z).sum(dim=1, keepdim=True))
    torch.testing.assert_close(unit_rows(z), expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(unit_rows(z).norm(dim=1), torch.ones(7, dtype=torch.float64))


def test_gradient_matches_finite_differences_and_autograd_of_the_composition() -> None:
    z = _z(6, 4).requires_grad_()
    assert torch.autograd.gradcheck(unit_rows, (z,))
    weights = _z(6, 4) + 1
    (g_ours,) = torch.autograd.grad((unit_rows(z) * weights).sum(), z)
    (g_ref,) = torch.autograd.grad((F.normalize(z, dim=1) * weights).sum(), z)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-12, atol=1e-14)


def test_gradient_is_tangent_to_the_sphere() -> None:
    z = _z(5, 3).requires_grad_()
    (g,) = torch.autograd.grad((unit_rows(z) * _z(5, 3)).sum(), z)
    torch.testing.assert_close((g * z.detach()).sum(dim=1), torch.zeros(5, dtype=torch.float64), atol=1e-12, rtol=0)


def test_zero_and_clamped_rows_behave_as_f_normalize() -> None:
    z = _z(4, 3)
    z[1] = 0.0           # no direction: value 0, gradient g / eps
    z[2] = 1e-14         # below eps = 1e-12: y = z / eps is linear in z
    z.requires_grad_()
    weights = _z(4, 3)
    (g_ours,) = torch.autograd.grad((unit_rows(z) * weights).sum(), z)
    (g_ref,) = torch.autograd.grad((F.normalize(z, dim=1) * weights).sum(), z)
    assert torch.isfinite(g_ours).all()
    torch.testing.assert_close(unit_rows(z), F.normalize(z, dim=1), rtol=1e-12, atol=0)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-12, atol=1e-14)


def test_vmap_over_a_client_axis_equals_the_loop() -> None:
    z = _z(3, 5, 4)
    weights = _z(3, 5, 4)

    def loss(rows: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (unit_rows(rows) * w).sum()

    batched = torch.func.vmap(torch.func.grad(loss))(z, weights)
    looped = torch.stack([torch.func.grad(loss)(z[i], weights[i]) for i in range(3)])
    torch.testing.assert_close(batched, looped, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.func.vmap(unit_rows)(z), F.normalize(z, dim=2), rtol=1e-12, atol=0)


def test_float32_input_keeps_its_dtype() -> None:
    z = torch.randn(2, 3)
    assert unit_rows(z).dtype == torch.float32
