"""Arithmetic of the programs that take inner steps on a batch (Per-FedAvg's adaptation, pFedMe's
personal problem): gradients with respect to named weights, per-client inner products. Pure tensor
functions; the weights carry a leading client axis."""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor


def gradients(loss: Tensor, weights: Mapping[str, Tensor], create_graph: bool = False) -> dict[str, Tensor]:
    """The gradients of ``loss`` (summed over the clients: each client's loss reads its own rows
    only) with respect to the ``weights`` that require grad, by name."""
    trained = {n: t for n, t in weights.items() if t.requires_grad}
    values = torch.autograd.grad(loss.sum(), list(trained.values()), create_graph=create_graph)
    return dict(zip(trained, values))


def per_client_dot(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> Tensor:
    """Σ_n ⟨a_n, b_n⟩ per client, over the names of ``a``: (clients,)."""
    return torch.cat([(a[n] * b[n]).flatten(1) for n in a], 1).sum(1)
