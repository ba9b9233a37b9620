"""Adaptive clipping of client-level DP-FedAvg (Andrew, Thakkar, McMahan and Ramaswamy 2021,
"Differentially private learning with adaptive clipping", NeurIPS, Algorithm 1 with the geometric
update): the clip norm C follows the γ-quantile of the clients' update norms instead of being fixed.

Each round the server sends C with the global model (the codec's payload, :data:`CLIP_NORM`); each
client clips its update to C and sends, beside it, the bit b_k = 1[‖Δ_k‖ ≤ C]
(``extras[CODEC][UNCLIPPED]``). The server forms b̄ = (Σ_k b_k + N(0, σ_b²)) / m, m the clients a
round samples, and takes the geometric step C ← C · exp(−η_C (b̄ − γ)): C shrinks while more than a
fraction γ of the clients fit within it and grows while fewer do. C is server state (``Server.state``
under :data:`CLIP_NORM`, float64), so a checkpoint holds it and a resumed run goes on from it.

The count is released too, so it costs privacy: by the paper's Theorem 1 a round with update noise
multiplier σ_Δ and count noise σ_b is the Gaussian mechanism of multiplier
σ = (σ_Δ⁻² + (2σ_b)⁻²)^(−1/2). fedlatent keeps ``privacy.noise_multiplier`` as that total σ — what the
accountant is given — and noises the updates with σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2)
(:func:`update_noise_multiplier`), which needs 2σ_b > σ.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedlatent.methods.parts import Tensors, Upload
from fedlatent.federated.randomness import Randomness, privacy_generator, standard_normal
from fedlatent.seeding import PRIVACY_CLIP_COUNT

CLIP_NORM = "codec.clip_norm"  # the round's clip norm: the server state's and the payload's key
CODEC = "codec"  # an upload's extras written by the codec (not a part's)
UNCLIPPED = "unclipped"  # the client's bit b_k = 1[‖Δ_k‖ ≤ C], in ``extras[CODEC]``


def update_noise_multiplier(noise_multiplier: float, count_noise: float) -> float:
    """σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2): the updates' noise multiplier that, with the count's noise σ_b,
    spends the privacy of the Gaussian mechanism of multiplier σ (Andrew et al. 2021, Theorem 1);
    0 when σ = 0 (no noise). Raises ValueError unless 2σ_b > σ."""
    if noise_multiplier == 0:
        return 0.0
    if not 2 * count_noise > noise_multiplier:
        raise ValueError(f"the count noise {count_noise} must exceed noise_multiplier / 2 = {noise_multiplier / 2}")
    return (noise_multiplier ** -2 - (2 * count_noise) ** -2) ** -0.5


def next_clip_norm(clip_norm: float, unclipped: float, per_round: int, target_quantile: float,
                   learning_rate: float, noise: float) -> float:
    """The geometric update C · exp(−η_C (b̄ − γ)) with b̄ = (Σ_k b_k + noise) / m (Andrew et al. 2021,
    Algorithm 1): ``unclipped`` = Σ_k b_k, ``per_round`` = m, ``noise`` the draw of N(0, σ_b²)."""
    fraction = (unclipped + noise) / per_round
    return clip_norm * math.exp(-learning_rate * (fraction - target_quantile))


def unclipped_bit(norm: float, bound: float) -> Tensors:
    """What a client sends beside its clipped update: b_k = 1[‖Δ_k‖ ≤ C] (float64, 0-dimensional)."""
    return {UNCLIPPED: torch.tensor(float(norm <= bound), dtype=torch.float64)}


@dataclass(frozen=True)
class AdaptiveClipping:
    """The server's side of adaptive clipping: C₀ = ``initial``, the target quantile γ, the step η_C,
    the count's noise σ_b, the m clients a round samples and the run's seed (the count's noise is
    drawn from (seed, ``PRIVACY_CLIP_COUNT``, round), a stream of its own)."""

    initial: float
    target_quantile: float
    learning_rate: float
    count_noise: float
    per_round: int
    seed: int | Randomness  # a Randomness: privacy.randomness's source (a bare seed: the seeded one)

    def current(self, state: Tensors) -> float:
        """The clip norm the server holds: C₀ before the first update."""
        return float(state[CLIP_NORM]) if CLIP_NORM in state else self.initial

    def payload(self, state: Tensors) -> Tensors:
        """What the clients learn of it each round: the clip norm to clip their updates to."""
        return {CLIP_NORM: torch.tensor(self.current(state), dtype=torch.float64)}

    def update(self, rnd: int, uploads: list[Upload], state: Tensors) -> None:
        """After round ``rnd`` (0-based): C in ``state`` moved by the uploads' bits
        (:func:`next_clip_norm`), the count's noise drawn from (seed, round)."""
        unclipped = sum(float(u.extras[CODEC][UNCLIPPED]) for u in uploads)
        noise = 0.0
        if self.count_noise > 0:
            generator = privacy_generator(self.seed, PRIVACY_CLIP_COUNT, rnd)
            noise = self.count_noise * float(standard_normal((), generator, torch.float64))
        state[CLIP_NORM] = torch.tensor(next_clip_norm(self.current(state), unclipped, self.per_round,
                                                       self.target_quantile, self.learning_rate, noise),
                                        dtype=torch.float64)
