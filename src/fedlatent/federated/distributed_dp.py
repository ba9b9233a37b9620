"""Distributed DP through the codec chain: the distributed Skellam mechanism (Agarwal, Kairouz and Liu
2021, "The Skellam mechanism for differentially private federated learning", Algorithm 1), with the
pipeline of the distributed discrete Gaussian (Kairouz, Liu and Steinke 2021, Algorithm 1/2): each
client adds its *share* of the noise to its own clipped, quantised update, so that no party — the
server included — sees an un-noised update once the sum is taken under secure aggregation.

Client k, in round r (``privacy.distributed = "skellam"``, after the clip link at C = ``clip_norm``):

1. flatten Δ_k (every floating-point entry that travels, the reference's order; clipped again to C in
   float64, where the clip link's float32 arithmetic left it a rounding above), zero-pad to
   d = 2^⌈log₂ D⌉ and rotate: y = H·diag(s)·Δ_k, H the orthonormal Walsh–Hadamard matrix and s the
   round's random signs, the same for every client and the server (public randomness, as in the
   papers: from the round's rotation seed, (run seed, ``DISTRIBUTED_ROTATION``, r), which a Flower
   node is sent) — a rotation keeps the L2 norm and spreads the update evenly over the coordinates,
   so that the modular clip rarely bites;
2. scale by 1/γ and round *conditionally*: stochastic rounding, drawn again until the rounded
   vector's norm is within Δ₂ = √min(c² + d/4 + √(2 ln(1/β))·(c + √d/2), (c + √d)²), c = C/γ,
   β = e^{−1/2} (the papers' bound; it is what the accountant takes as the sensitivity);
3. add Skellam noise of variance μ_k = σ²C²/(γ² m) per coordinate (Poisson(μ_k/2) − Poisson(μ_k/2)),
   m the clients a round samples: the sum of m shares is Skellam of variance σ²C²/γ², the central
   mechanism's N(0, σ²C²) on the sum in γ units; the rounding and the share come from the client's
   noise source (:data:`NoiseSource`): seeded, (run seed, ``DISTRIBUTED_NOISE``, r, k); secret, a
   stream no other party can reproduce (:mod:`fedlatent.federated.randomness`);
4. reduce modulo 2^b (``distributed_bits``): the message is one vector of Z_{2^b} (``MESSAGE``),
   b·d bits on the wire.

The server sums the vectors modulo 2^b (on Flower SecAgg+'s unmasked sum, which masks these very
vectors in Z_{2^b}: ``backends.flower.secagg_codec``; on the embedded backends the plain modular
sum), maps the sum to [−2^{b−1}, 2^{b−1}), multiplies by γ, rotates back and takes the
fixed-denominator mean w̄ + S/m, as DP-FedAvg. γ = 4·C·√(σ² + m) / (2^{b−1} − m) leaves four
standard deviations of the noise plus a worst-case aligned sum of m clipped updates inside the range,
so the modular clip does not wrap for any configuration the accountant covers (the m in the
denominator absorbs the rounding).

**Dropouts and the accountant.** Only the clients whose vectors reach the sum add noise to it: with
n of the m surviving, the sum carries variance nμ_k, less than planned. The accountant
(:class:`SkellamAccountant`) therefore takes the worst case the run allows — the fewest clients a
round may aggregate, t = max(1, ``train.min_clients``; on Flower also SecAgg+'s threshold, below
which no sum is unmasked) — so the reported ε holds whoever drops out:
each round is the Skellam mechanism of variance tμ_k with replace-one sensitivities 2Δ₂ and 2Δ₁,
Δ₁ = min(Δ₂², √d·Δ₂) (an integer vector's L1 norm is at most its squared L2 norm), RDP of order α
(their Corollary 3.6)

    ε(α) ≤ α(2Δ₂)²/(2μ) + min(((2α − 1)(2Δ₂)² + 6·2Δ₁)/(4μ²), 3·2Δ₁/(2μ)),

composed over the rounds without amplification by sampling (a bound that holds for any selection)
and converted to (ε, δ) as dp-accounting's RDP accountant does (Balle et al. 2020).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection

import torch

from fedlatent.federated.codec_chain import (CODED_BYTES, Combiner, EncodeContext, EncodeLink, RoundContext,
                                             UpdateSum)
from fedlatent.federated.randomness import Source, poisson, uniform
from fedlatent.methods.parts import Tensors, Upload
from fedlatent.seeding import DISTRIBUTED_ROTATION, derive_seed

MESSAGE = "distributed"  # the one entry of a client's message: its vector of Z_{2^b}
BETA = math.exp(-0.5)  # the conditional rounding's failure probability per draw (the papers' choice)
HEADROOM = 4.0  # standard deviations of the sum kept inside the modular range
ORDERS = [*range(2, 64), *range(64, 1025, 8)]  # the RDP orders searched
Rotation = Callable[[int], int]  # round r → the seed of its random signs (public, the same for every party)
NoiseSource = Callable[[int, int], Source]  # (round, client) → the source of that client's rounding and share


def padded(size: int) -> int:
    """The rotation's dimension: the smallest power of two ≥ ``size``."""
    return 1 << max(0, (size - 1).bit_length())


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """H·x for the orthonormal Walsh–Hadamard matrix H (H = Hᵀ = H⁻¹) of ``x``'s length, a power of
    two: the fast transform's butterflies (a + b, a − b), then 1/√d."""
    n = x.numel()
    y, half = x.reshape(n), 1
    while half < n:
        y = y.view(-1, 2, half)
        y = torch.stack((y[:, 0] + y[:, 1], y[:, 0] - y[:, 1]), 1)
        half *= 2
    return y.reshape(n) / math.sqrt(n)


def public_rotation(seed: int) -> Rotation:
    """The rotation seeds of a run of seed ``seed``: round r's is (seed, ``DISTRIBUTED_ROTATION``, r)."""
    return lambda rnd: derive_seed(seed, DISTRIBUTED_ROTATION, rnd)


def signs(rotation_seed: int, size: int) -> torch.Tensor:
    """A round's random signs ±1 (float64) from its ``rotation_seed``, shared by every client and the server."""
    generator = torch.Generator().manual_seed(rotation_seed)
    return torch.randint(0, 2, (size,), generator=generator, dtype=torch.float64) * 2 - 1


def rounded_bound(scaled_clip: float, size: int, beta: float = BETA) -> float:
    """Δ₂: the L2 bound a conditionally rounded vector of norm ≤ ``scaled_clip`` in ``size``
    coordinates is held to (Kairouz, Liu and Steinke 2021, Theorem 3 / Agarwal et al. 2021)."""
    c, d = scaled_clip, size
    return math.sqrt(min(c * c + d / 4 + math.sqrt(2 * math.log(1 / beta)) * (c + math.sqrt(d) / 2),
                         (c + math.sqrt(d)) ** 2))


def skellam(variance: float, size: int, source: Source) -> torch.Tensor:
    """``size`` draws of the symmetric Skellam distribution of ``variance`` (int64): the difference
    of two Poisson(variance / 2), from ``source`` (a seeded generator or a secret stream)."""
    draws = poisson(variance / 2, 2 * size, source).view(2, size)
    return draws[0] - draws[1]


def layout_of(reference: Tensors, withheld: Collection[str]) -> list[str]:
    """The entries a vector holds, in the reference's order: every floating-point entry that travels."""
    return [k for k, v in reference.items() if k not in withheld and v.is_floating_point()]


class SkellamSpec:
    """The mechanism's settings: clip C, noise multiplier σ (of the sum, central-equivalent), m clients
    a round, b bits; the scale γ follows (see the module's docstring)."""

    def __init__(self, clip_norm: float, noise_multiplier: float, per_round: int, bits: int) -> None:
        if not (math.isfinite(clip_norm) and clip_norm > 0 and noise_multiplier > 0 and 2 ** (bits - 1) > per_round):
            raise ValueError(f"distributed Skellam needs a finite clip norm, σ > 0 and 2^(bits-1) > m; got "
                             f"{clip_norm}, {noise_multiplier}, {bits} bits for {per_round} clients")
        self.clip_norm, self.noise_multiplier, self.per_round = clip_norm, noise_multiplier, per_round
        self.bits = bits
        self.modulus = 1 << bits
        self.scale = HEADROOM * clip_norm * math.sqrt(noise_multiplier ** 2 + per_round) / (2 ** (bits - 1) - per_round)

    @property
    def share_variance(self) -> float:
        """μ_k: each client's noise variance per coordinate, in γ units."""
        return (self.noise_multiplier * self.clip_norm / self.scale) ** 2 / self.per_round


class SkellamShare(EncodeLink):
    """The client's link (stage "noise"): rotate (the round's signs from ``rotation``), scale, round
    conditionally, add its Skellam share (both drawn from ``noise``), reduce modulo 2^b (the module's
    steps 1–4)."""

    stage = "noise"

    def __init__(self, spec: SkellamSpec, rotation: Rotation, noise: NoiseSource) -> None:
        self.spec, self.rotation, self.noise = spec, rotation, noise

    def encode(self, message: Upload, ctx: EncodeContext) -> Upload:
        spec = self.spec
        keys = layout_of(ctx.reference, ctx.withheld)
        flat = torch.cat([(message.state[k].double() - ctx.reference[k].double().to(message.state[k].device))
                          .cpu().flatten() for k in keys])
        norm = float(flat.norm())
        if norm > spec.clip_norm:  # the clip link's float32 arithmetic may leave it a rounding above C
            flat = flat * (spec.clip_norm / norm)
        size = padded(flat.numel())
        x = torch.zeros(size, dtype=torch.float64)
        x[:flat.numel()] = flat
        y = hadamard(signs(self.rotation(ctx.rnd), size) * x) / spec.scale
        source = self.noise(ctx.rnd, message.client_id)
        bound = rounded_bound(spec.clip_norm / spec.scale, size)
        low = torch.floor(y)
        for _ in range(1000):
            rounded = low + (uniform(size, source) < y - low)
            if float(rounded.norm()) <= bound:
                break
        else:
            raise ValueError("distributed DP: the conditional rounding exceeded its bound 1000 times")
        noisy = rounded.to(torch.int64) + skellam(spec.share_variance, size, source)
        vector = torch.remainder(noisy, spec.modulus)
        coded = math.ceil(size * spec.bits / 8)
        return dataclasses.replace(message, state={MESSAGE: vector}, metrics={**message.metrics, CODED_BYTES: float(coded)})


def unweighted(weights: list[float] | None) -> None:
    """Refuse a weighted combine: the distributed DP estimator weights every client alike."""
    if weights is not None:
        raise ValueError("the distributed DP estimator weights every client alike; a weighted combine "
                         "(FedNova's, FedDyn's) breaks its sensitivity bound")


class ModularSum(Combiner):
    """The server's combiner: Σ_k v_k mod 2^b, centred, times γ, rotated back (the round's signs from
    ``rotation``), cut to the entries' size — the float64 sum of the noised updates by entry.
    ``dimension``: the rotation's d, known once a round has been combined (the accountant's)."""

    def __init__(self, spec: SkellamSpec, rotation: Rotation) -> None:
        self.spec, self.rotation = spec, rotation
        self.dimension: int | None = None

    def combine(self, messages: list[Upload], keys: list[str] | None, weights: list[float] | None,
                rc: RoundContext) -> UpdateSum:
        unweighted(weights)
        total = torch.stack([m.state[MESSAGE] for m in messages]).sum(0)
        return self.decode(total, keys, len(messages), sum(m.num_samples for m in messages), rc)

    def decode(self, total: torch.Tensor, keys: list[str] | None, count: int, samples: int,
               rc: RoundContext) -> UpdateSum:
        """The :class:`UpdateSum` of ``count`` clients (``samples`` training samples) whose vectors sum
        to ``total`` modulo 2^b (int64; any representative)."""
        spec = self.spec
        total = torch.remainder(total, spec.modulus)
        total = torch.where(total >= spec.modulus // 2, total - spec.modulus, total)
        size = total.numel()
        self.dimension = size
        flat = signs(self.rotation(rc.rnd), size) * hadamard(total.double() * spec.scale)
        sums, start = {}, 0
        for key in layout_of(rc.reference, rc.withheld):
            ref = rc.reference[key]
            sums[key] = flat[start:start + ref.numel()].view(ref.shape).to(ref.device)
            start += ref.numel()
        order = list(rc.reference if keys is None else keys)
        return UpdateSum(sums, order, count, samples)


def skellam_rdp(order: int, l2: float, l1: float, variance: float) -> float:
    """The RDP of order α of the Skellam mechanism of ``variance`` μ with sensitivities Δ₂ = ``l2``,
    Δ₁ = ``l1`` (Agarwal, Kairouz and Liu 2021, Corollary 3.6)."""
    a, mu = order, variance
    return a * l2 ** 2 / (2 * mu) + min(((2 * a - 1) * l2 ** 2 + 6 * l1) / (4 * mu ** 2), 3 * l1 / (2 * mu))


def rdp_to_epsilon(rdp: list[float], orders: list[int], delta: float) -> float:
    """(ε, δ) from RDP curves (Balle et al. 2020, Theorem 21: dp-accounting's conversion)."""
    return min(r + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1) for r, a in zip(rdp, orders))


class SkellamAccountant:
    """ε after r rounds of the distributed Skellam mechanism, for the worst case the run allows:
    ``survivors`` = t clients' shares in the sum (see the module's docstring); ``dimension`` d."""

    def __init__(self, spec: SkellamSpec, survivors: int, delta: float) -> None:
        self.spec, self.survivors, self.delta = spec, survivors, delta

    def round_rdp(self, dimension: int) -> list[float]:
        spec = self.spec
        l2 = rounded_bound(spec.clip_norm / spec.scale, dimension)
        l1 = min(l2 * l2, math.sqrt(dimension) * l2)
        variance = self.survivors * spec.share_variance
        return [skellam_rdp(a, 2 * l2, 2 * l1, variance) for a in ORDERS]

    def epsilon(self, rounds: int, dimension: int) -> float:
        if rounds == 0:
            return 0.0
        return rdp_to_epsilon([rounds * r for r in self.round_rdp(dimension)], ORDERS, self.delta)
