"""The update codec at the message boundary: what a client's upload becomes on the way to the
server (:meth:`UpdateCodec.encode`, the client half's last step) and what the server makes of the
messages (:meth:`UpdateCodec.combine`, the weighted sums its aggregation takes; :meth:`UpdateCodec.total`,
the sums of FFC's calibration statistics).

Every backend goes through one codec at the same two points: each client's upload is encoded after
the client's own non-finite check (``round.encoded``: the embedded backends' ``Setup.train``, the
Flower ClientApp's ``train``), and the server's mean — :meth:`fedlatent.federated.server.Server.aggregate`
and the parts that replace it (FedNova, FedDyn) — is the codec's ``combine``. This is the one
place where client-level differential privacy (clip each update to norm C, Gaussian noise σ·C on
the sum: McMahan et al. 2018, DP-FedAvg) and secure aggregation (encode masks, combine unmasks: the
server sees only the sum; Bonawitz et al. 2017) plug in.

A message stands for a *state*: the plain codec sends the client's weights w_k as today, and a
codec that works on the update Δ_k = w_k − w̄ (w̄ the round's global state the client started from)
sends w̄ + coded(Δ_k). Why states and not Δ: the plain codec must leave every number bit for bit
as it was, and Σ p_k w_k and w̄ + Σ p_k Δ_k differ in the last bits; every reader of an upload
(FedNova's steps, the diagnostics' local models, Flower's records, the traffic count) also reads it
unchanged. Nothing is lost for the codecs to come: with coefficients summing to one, the mean of
w̄ + Δ_k is w̄ plus the mean of Δ_k (clipping and quantising act on Δ), masks cancel in a sum of
states as in a sum of updates, and noise added to the sum of states is noise on the sum of updates.

Not yet through the codec: the parts' extras (SCAFFOLD's Δc, FedDyn's Δλ), summed by their parts'
server hooks, and CCVR's per-class moments, pooled by :func:`fedlatent.calibration.ccvr.pool_statistics`
(sums once rewritten as Σ n, Σ n μ, Σ ((n − 1) Σ + n μμᵀ)).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection

import torch

from fedlatent.config import PrivacyConfig
from fedlatent.federated.accounting import Accountant
from fedlatent.methods.aggregation import weighted_mean
from fedlatent.methods.parts import Combine, Tensors, Upload
from fedlatent.seeding import PRIVACY_NOISE, derive_seed


class UpdateCodec:
    """The plain codec: an upload travels as it is, the server takes the weighted mean of the states
    (:func:`~fedlatent.methods.aggregation.weighted_mean`) and the plain sums of the statistics."""

    name = "plain"

    def encode(self, upload: Upload, reference: Tensors, withheld: Collection[str]) -> Upload:
        """The message ``upload`` travels as, from a client that started from ``reference`` (the
        round's global state); ``withheld``: entries that do not travel (a fixed head, the clients'
        own layers), left as they are. The plain codec returns ``upload`` itself."""
        return upload

    def combine(self, messages: list[Upload], keys: list[str] | None = None,
                weights: list[float] | None = None) -> Tensors:
        """Σ_k c_k · m_k of the messages' states over ``keys`` (all: None), c_k the sample shares
        n_k / Σn or the ``weights`` given (FedNova's p_k / a_k, FedDyn's 1/K): the contract of
        :func:`~fedlatent.methods.aggregation.weighted_mean`, which the plain codec is."""
        return weighted_mean(messages, keys, weights)

    def round_combine(self, rnd: int, reference: Tensors, withheld: Collection[str]) -> Combine:
        """The ``combine`` of round ``rnd`` (0-based), whose clients started from ``reference`` and
        kept ``withheld`` to themselves: a codec that draws noise or unmasks per round binds them
        here; the plain codec's is :meth:`combine` itself."""
        return self.combine

    def epsilon(self, rounds: int) -> float | None:
        """The privacy loss ε after ``rounds`` rounds, or None: the codec gives no DP guarantee."""
        return None

    def total(self, statistics: list[Tensors]) -> Tensors:
        """The clients' statistics summed entry by entry (FFC's Σ_k V_k and Σ_k U_k), in the
        order given, as one stacked sum (what :func:`~fedlatent.calibration.ffc.ffc_solve` sums)."""
        return {key: torch.stack([s[key] for s in statistics]).sum(0) for key in statistics[0]}


def update_norm(update: Tensors) -> float:
    """‖Δ‖₂ over all entries of ``update`` together, accumulated in float64."""
    if not update:
        return 0.0
    norms = torch.stack([torch.linalg.vector_norm(v, dtype=torch.float64).cpu() for v in update.values()])
    return float(torch.linalg.vector_norm(norms))


def clip(update: Tensors, bound: float) -> Tensors:
    """``update`` scaled to L2 norm ``bound`` where its norm exceeds it, else ``update`` itself:
    Δ · min(1, C / ‖Δ‖) (DP-FedAvg's per-client clip, McMahan et al. 2018, Algorithm 1, with the
    flat clip over all entries together)."""
    norm = update_norm(update)
    if norm <= bound:
        return update
    scale = bound / norm
    return {key: value * scale for key, value in update.items()}


class ClipCodec(UpdateCodec):
    """Each client's update Δ = w_k − w̄ clipped to L2 norm ``clip_norm`` (every floating-point
    entry that travels, together; integer buffers as they are) before the server weights it: the
    message is w̄ + clip(Δ). An update within the bound travels as it is, so ``clip_norm`` = ∞ is
    the plain codec bit for bit. The server's side is the plain one."""

    name = "clip"

    def __init__(self, clip_norm: float) -> None:
        if not clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
        self.clip_norm = clip_norm

    def encode(self, upload: Upload, reference: Tensors, withheld: Collection[str]) -> Upload:
        coded = [k for k, v in upload.state.items() if k not in withheld and v.is_floating_point()]
        delta = {k: upload.state[k] - reference[k].to(upload.state[k].device) for k in coded}
        clipped = clip(delta, self.clip_norm)
        if clipped is delta:
            return upload
        state = {k: (reference[k].to(v.device) + clipped[k]).to(v.dtype) if k in clipped else v
                 for k, v in upload.state.items()}
        return dataclasses.replace(upload, state=state)


class GaussianCodec(ClipCodec):
    """Client-level DP-FedAvg (McMahan et al. 2018, "Learning differentially private recurrent
    language models", Algorithm 1): each client's update clipped to L2 norm C on the client
    (:class:`ClipCodec`), and on the server the fixed-denominator estimator

        w̄' = w̄ + (Σ_k Δ_k + N(0, σ²C² I)) / m,

    each selected client weighted alike (data-size weights would let one client's share exceed C
    and break the sensitivity bound) and the sum divided by the *expected* number of clients m per
    round (``train.participation``'s count), not by the number that replied, so that a dropped
    client changes no other's weight (the paper's f̃_f with w_k = 1, qW = m). The noise is drawn on
    the server alone, from a generator seeded by (run seed, round), over every floating-point
    entry that travels; integer entries (BatchNorm's batch counts) stay at w̄'s value and the
    entries that never travel at the reference's, as the server keeps them anyway. ε after r
    rounds comes from ``accountant`` (:class:`~fedlatent.federated.accounting.Accountant`; None: no ε
    reported)."""

    name = "gaussian"

    def __init__(self, clip_norm: float, noise_multiplier: float, per_round: int, seed: int,
                 accountant: Accountant | None = None) -> None:
        super().__init__(clip_norm)
        if not (noise_multiplier >= 0 and math.isfinite(clip_norm)):
            raise ValueError(f"GaussianCodec needs noise_multiplier >= 0 and a finite clip_norm, got "
                             f"{noise_multiplier} and {clip_norm}")
        self.noise_multiplier, self.per_round, self.seed = noise_multiplier, per_round, seed
        self.accountant = accountant

    def combine(self, messages: list[Upload], keys: list[str] | None = None,
                weights: list[float] | None = None) -> Tensors:
        """Refused: the estimator needs the round (its noise) and its reference (:meth:`round_combine`)."""
        raise TypeError("GaussianCodec combines a round's messages through round_combine(rnd, reference, withheld)")

    def round_combine(self, rnd: int, reference: Tensors, withheld: Collection[str]) -> Combine:
        def combine(messages: list[Upload], keys: list[str] | None = None,
                    weights: list[float] | None = None) -> Tensors:
            if weights is not None:
                raise ValueError("the DP-FedAvg estimator weights every client alike; a weighted combine "
                                 "(FedNova's, FedDyn's) breaks its sensitivity bound")
            return self.noisy_mean(messages, keys, reference, withheld, self.noise(rnd))
        return combine

    def noise(self, rnd: int) -> torch.Generator:
        """Round ``rnd``'s noise generator: (run seed, PRIVACY_NOISE, round)."""
        return torch.Generator().manual_seed(derive_seed(self.seed, PRIVACY_NOISE, rnd))

    def noisy_mean(self, messages: list[Upload], keys: list[str] | None, reference: Tensors,
                   withheld: Collection[str], generator: torch.Generator) -> Tensors:
        """w̄ + (Σ_k Δ_k + N(0, σ²C²)) / m over ``keys`` (every key of the first message: None),
        the sum and the noise in float64 and the result in each entry's dtype."""
        scale = self.noise_multiplier * self.clip_norm
        out: Tensors = {}
        for key in messages[0].state if keys is None else keys:
            ref = reference[key]
            if key in withheld or not ref.is_floating_point():
                out[key] = ref
                continue
            total = torch.stack([m.state[key].to(ref.device, torch.float64) for m in messages]).sum(0) \
                - len(messages) * ref.double()
            noise = torch.randn(ref.shape, generator=generator, dtype=torch.float64).to(ref.device)
            out[key] = (ref.double() + (total + scale * noise) / self.per_round).to(ref.dtype)
        return out

    def epsilon(self, rounds: int) -> float | None:
        return None if self.accountant is None else self.accountant.epsilon(rounds)


def build_codec(cfg: PrivacyConfig) -> UpdateCodec:
    """The client's side of the codec ``[privacy]`` asks for (what :meth:`~UpdateCodec.encode`
    needs): clipping at ``clip_norm``, or the plain codec (∞). A Flower node builds this one; the
    noise is the server's (:func:`server_codec`)."""
    return UpdateCodec() if math.isinf(cfg.clip_norm) else ClipCodec(cfg.clip_norm)


def server_codec(cfg: PrivacyConfig, seed: int, num_clients: int, per_round: int) -> UpdateCodec:
    """The server's codec: DP-FedAvg's :class:`GaussianCodec` when ``noise_multiplier`` > 0 (its
    accountant for ``per_round`` of ``num_clients`` clients a round), else :func:`build_codec`'s."""
    if cfg.noise_multiplier == 0:
        return build_codec(cfg)
    accountant = Accountant(num_clients, per_round, cfg.noise_multiplier, cfg.delta)
    return GaussianCodec(cfg.clip_norm, cfg.noise_multiplier, per_round, seed, accountant)
