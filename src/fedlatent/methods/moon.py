"""MOON (Li, He & Song 2021): model-contrastive term pulling z towards the global model's
representation and away from the client's previous local model's.

Round-0 behaviour: a client with no previous local model yet (its first participation) skips the
term (value 0), rather than contrasting with the initial global model as the release does.
Costs two extra forward passes per batch, only while MOON is on. The classifier sits on the
model's z, so give the model a projector (``model.projector = 256``) to match the paper's head.
The FedDecorr release ignores τ (τ = 1); set ``tau = 1.0`` for that behaviour.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedlatent.losses.contrastive import moon_contrastive
from fedlatent.methods.parts import LockstepContext, MethodSpec, Part
from fedlatent.methods.registry import register_part, register_preset


class Moon(Part):
    name = "moon"
    needs_global_out = True
    needs_prev_out = True

    def __init__(self, mu: float, tau: float) -> None:
        self.weight, self.tau = mu, tau

    def lockstep_loss(self, ctx: LockstepContext) -> Tensor | None:
        """The term per client (the batched form of :func:`moon_contrastive`); None when no client
        has a previous model, 0 for a client without one (its term is left out of its metrics)."""
        if ctx.prev_out is None:
            return None
        values = moon_contrastive(ctx.out.z, ctx.global_out.z, ctx.prev_out.z, self.tau)
        if ctx.prev_present is None:
            return values
        return torch.where(ctx.prev_present, values, torch.zeros_like(values))


@register_part("moon", mu=1.0, tau=0.5)
def moon_part(opts: dict[str, Any]) -> Part:
    """MOON model-contrastive term (μ, τ)."""
    return Moon(opts["mu"], opts["tau"])


@register_preset("moon", mu=1.0, tau=0.5)
def moon(opts: dict[str, Any]) -> MethodSpec:
    """MOON: FedAvg + model-contrastive term (μ = 1 CIFAR-100, 5 CIFAR-10; τ = 0.5)."""
    return MethodSpec("moon", parts=[Moon(opts["mu"], opts["tau"])])
