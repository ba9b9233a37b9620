"""FedProx (Li et al. 2020): (μ/2)·Σ‖w − w_global‖² over trainable parameters.

The FedDecorr release's FedProx compares the local model with itself (the term is always 0);
fedlatent implements the paper's term.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedlatent.methods.parts import LockstepContext, MethodSpec, Part
from fedlatent.methods.registry import register_part, register_preset


class Prox(Part):
    name = "prox"
    term_reads_batch = False  # ‖w − w_global‖²: the weights alone
    needs_global_params = True
    coefficients = ("mu",)

    def __init__(self, mu: float) -> None:
        self.weight = 1.0
        self.mu = mu

    def lockstep_loss(self, ctx: LockstepContext) -> Tensor:
        """(μ/2)‖w − w_global‖² per client of stacked weights (the global weights with or without a
        client axis): one foreach difference and one reduction over the concatenated weights
        rather than a few small operations per tensor (one client's step costs as much as
        :func:`~fedlatent.losses.contrastive.proximal`); μ a number, or one per client (stacked runs)."""
        names = [n for n, p in ctx.params.items() if p.requires_grad]
        diffs = torch._foreach_sub([ctx.params[n] for n in names], [ctx.global_params[n] for n in names])
        return 0.5 * self.mu * torch.cat([d.flatten(1) for d in diffs], 1).square().sum(1)


@register_part("prox", mu=0.01)
def prox_part(opts: dict[str, Any]) -> Part:
    """FedProx proximal term (μ/2)‖w − w_global‖²."""
    return Prox(opts["mu"])


@register_preset("fedprox", mu=0.01)
def fedprox(opts: dict[str, Any]) -> MethodSpec:
    """FedProx: FedAvg + proximal term (μ = 0.01; typical 0.001–0.01)."""
    return MethodSpec("fedprox", parts=[Prox(opts["mu"])])
