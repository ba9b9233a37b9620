"""DP-SGD's gradient of a batch from its per-sample gradients (Abadi et al. 2016, "Deep Learning with
Differential Privacy", Algorithm 1): each sample's gradient clipped to L2 norm C over all the
weights together, the clipped gradients summed, Gaussian noise N(0, σ²C²I) added to the sum, and
the result divided by the batch's denominator L,

    g̃ = (Σ_i g_i / max(1, ‖g_i‖₂ / C) + N(0, σ²C² I)) / L.

Pure functions of tensors, for a group of clients at once: per-sample gradients (clients, batch, …)
per weight, a row weight per (client, sample) (0 for the padding of a shorter batch), the standard
normal draws per client and weight, L per client.
"""
from __future__ import annotations

import torch
from torch import Tensor


def sample_norms(per_sample: list[Tensor]) -> Tensor:
    """(clients, batch) L2 norms of each sample's gradient over every weight of ``per_sample``
    (one (clients, batch, …) tensor per weight)."""
    return torch.stack([g.reshape(*g.shape[:2], -1).square().sum(2) for g in per_sample]).sum(0).sqrt()


def clip_factors(per_sample: list[Tensor], clip_norm: float) -> Tensor:
    """(clients, batch) min(1, C / ‖g_i‖): the factor that clips each sample's gradient to norm C
    (1 for a zero gradient, and for every sample when C = ∞)."""
    return (clip_norm / sample_norms(per_sample)).clamp(max=1.0)


def private_gradient(per_sample: list[Tensor], clip_norm: float, weights: Tensor | None, denominators: Tensor,
                     noise: list[Tensor] | None = None, noise_multiplier: float = 0.0) -> list[Tensor]:
    """Each client's DP-SGD gradient per weight, (clients, …): the sum over the batch of the clipped
    per-sample gradients (each times its row weight ``weights``, (clients, batch); None: all 1), plus
    σ·C times ``noise`` (standard normal draws shaped as the result; None: no noise), divided by
    ``denominators`` (clients,)."""
    factors = clip_factors(per_sample, clip_norm)
    if weights is not None:
        factors = factors * weights
    out = []
    for i, g in enumerate(per_sample):
        total = torch.einsum("cb,cb...->c...", factors, g)
        if noise is not None:
            total = total + (noise_multiplier * clip_norm) * noise[i]
        out.append(total / denominators.view(-1, *[1] * (total.dim() - 1)))
    return out
