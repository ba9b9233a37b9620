"""FedUV (Son et al. 2024): hyperspherical uniformity of z + a hinge on the per-class std of the
predicted probabilities, so each client behaves as if its data were IID.

total = CE + μ·L_U + λ·L_V; paper defaults μ = 0.5, λ = C/4 (λ = −1 here means C/4); the
release's defaults are λ = 2.5, μ = 0.5. σ = median of the non-zero squared distances, not
detached (supplement and release); ``sigma_factor = 2`` is Eq. 4 of the main text. Ablations:
``mu = 0`` (only L_V), ``lam = 0`` (only L_U), ``hinge = "none" | "squared"``. Both terms read
tensors the forward pass already computes: no extra forward pass. The release anneals the
learning rate with a cosine over rounds: ``train.lr_schedule = "cosine"``.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedlatent.errors import ConfigError
from fedlatent.losses.uniformity import uniformity
from fedlatent.losses.variance import variance
from fedlatent.methods.parts import LockstepContext, MethodSpec, Part, TermContext, vmap_loss
from fedlatent.methods.registry import register_part, register_preset


class Uniformity(Part):
    name = "uniformity"
    output_only = True

    def __init__(self, mu: float, sigma_factor: float, detach_sigma: bool) -> None:
        self.weight, self.sigma_factor, self.detach_sigma = mu, sigma_factor, detach_sigma

    def lockstep_loss(self, ctx: LockstepContext) -> Tensor:
        """All clients' terms from the batched form of :func:`uniformity` (``torch.pdist`` has
        no ``vmap`` rule)."""
        return uniformity(ctx.out.z, sigma_factor=self.sigma_factor, detach_sigma=self.detach_sigma)


class Variance(Part):
    name = "variance"
    output_only = True
    coefficients = ("lam",)

    def __init__(self, lam: float, hinge: str, gamma: float) -> None:
        if hinge not in ("hinge", "none", "squared"):
            raise ConfigError(f"algorithm.hinge = {hinge!r}: allowed values are hinge, none, squared")
        self.lam, self.hinge, self.gamma = lam, hinge, gamma
        self.weight = 1.0

    def loss(self, ctx: TermContext) -> Tensor:
        return _lam(self.lam, ctx.num_classes) * self._hinge(ctx)

    def lockstep_loss(self, ctx: LockstepContext) -> Tensor:
        """λ·L_V per client: L_V under ``vmap``, times λ — a number, or one per client (stacked runs)."""
        return _lam(self.lam, ctx.num_classes) * vmap_loss(self._hinge, ctx)

    def _hinge(self, ctx: TermContext) -> Tensor:
        return variance(ctx.out.logits, gamma=self.gamma if self.gamma > 0 else None, hinge=self.hinge)


def _lam(lam: float | Tensor, num_classes: int) -> float | Tensor:
    """λ, where −1 (any negative) stands for C/4."""
    if isinstance(lam, Tensor):
        return torch.where(lam < 0, num_classes / 4, lam)
    return num_classes / 4 if lam < 0 else lam


@register_part("uniformity", mu=0.5, sigma_factor=1.0, detach_sigma=False)
def uniformity_part(opts: dict[str, Any]) -> Part:
    """FedUV hyperspherical uniformity μ·L_U of z."""
    return Uniformity(opts["mu"], opts["sigma_factor"], opts["detach_sigma"])


@register_part("variance", lam=-1.0, hinge="hinge", gamma=0.0)
def variance_part(opts: dict[str, Any]) -> Part:
    """FedUV per-class probability-std hinge λ·L_V (λ = −1: C/4; γ = 0: 1/√C)."""
    return Variance(opts["lam"], opts["hinge"], opts["gamma"])


@register_preset("feduv", mu=0.5, lam=-1.0, hinge="hinge", gamma=0.0, sigma_factor=1.0, detach_sigma=False)
def feduv(opts: dict[str, Any]) -> MethodSpec:
    """FedUV: CE + μ·uniformity + λ·variance hinge (μ = 0.5, λ = C/4)."""
    parts: list[Part] = []
    if opts["mu"] > 0:
        parts.append(Uniformity(opts["mu"], opts["sigma_factor"], opts["detach_sigma"]))
    if opts["lam"] != 0:
        parts.append(Variance(opts["lam"], opts["hinge"], opts["gamma"]))
    return MethodSpec("feduv", parts=parts)
