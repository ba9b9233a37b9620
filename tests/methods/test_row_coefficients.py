"""A term's coefficient per client row (``methods.coefficients``: stacked runs of different
coefficients): FedProx's μ and FedUV's λ as (clients,) tensors give each client the term of its
own number, and the plain numbers keep the arithmetic a run alone had, bit for bit."""
from __future__ import annotations

import pytest
import torch

from fedlatent.methods import resolve
from fedlatent.methods.parts import LockstepContext, vmap_loss
from fedlatent.models.base import ModelOutput

GEN = torch.Generator().manual_seed(41)


def _ctx(clients: int = 3, dtype: torch.dtype = torch.float64) -> LockstepContext:
    logits = torch.randn(clients, 16, 10, generator=GEN, dtype=dtype)
    z = torch.randn(clients, 16, 8, generator=GEN, dtype=dtype)
    y = torch.randint(0, 10, (clients, 16), generator=GEN)
    params = {"w": torch.randn(clients, 5, 4, generator=GEN, dtype=dtype).requires_grad_(),
              "b": torch.randn(clients, 4, generator=GEN, dtype=dtype).requires_grad_()}
    global_params = {n: torch.randn(p.shape[1:], generator=GEN, dtype=dtype) for n, p in params.items()}
    return LockstepContext(ModelOutput(logits, z), y, params, global_params, None, 10, [])


def _part(preset: str, name: str, **keys):
    (part,) = [p for p in resolve({"name": preset, **keys}).parts if p.name == name]
    return part


@pytest.mark.parametrize("lam", [-1.0, 2.5])
def test_feduvs_variance_in_lockstep_is_its_one_client_loss_under_vmap_to_the_bit(lam: float) -> None:
    """λ applied outside vmap (so that it may be per row) computes what vmap of λ·L_V did."""
    part = _part("feduv", "variance", lam=lam)
    ctx = _ctx(dtype=torch.float32)
    assert torch.equal(part.lockstep_loss(ctx), vmap_loss(part.loss, ctx))


@pytest.mark.parametrize("preset, name, key, values", [("fedprox", "prox", "mu", (0.01, 0.1, 1.0)),
                                                       ("feduv", "variance", "lam", (-1.0, 0.5, 2.0))])
def test_a_coefficient_per_row_gives_each_client_its_own_term(preset: str, name: str, key: str,
                                                              values: tuple[float, ...]) -> None:
    ctx = _ctx()
    rows = _part(preset, name)
    setattr(rows, key, torch.tensor(values, dtype=torch.float64))
    got = rows.lockstep_loss(ctx)
    for c, value in enumerate(values):
        torch.testing.assert_close(got[c], _part(preset, name, **{key: value}).lockstep_loss(ctx)[c], rtol=1e-14, atol=0)
