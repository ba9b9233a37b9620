"""The update codec at the message boundary: what a client's upload becomes on the way to the
server (:meth:`UpdateCodec.encode`, the client half's last step) and what the server makes of the
messages (:meth:`UpdateCodec.combine`, the weighted sums its aggregation takes; :meth:`UpdateCodec.total`,
the sums of the calibration statistics, each client's encoded by :meth:`UpdateCodec.encode_statistics`).

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

The codec may hold server state of its own (``Server.state``, checkpointed with the parts'):
adaptive clipping's clip norm (``federated.adaptive_clipping``), sent to the clients in the round's
payload (:meth:`UpdateCodec.payload`) and moved after each aggregation (:meth:`UpdateCodec.server_update`).

Not yet through the codec: the parts' extras (SCAFFOLD's Δc, FedDyn's Δλ), summed by their parts'
server hooks. The calibration statistics go through it (:meth:`UpdateCodec.total`): FFC's V and U
as they are; CCVR's per-class moments as they are, pooled by
:func:`fedlatent.calibration.ccvr.pool_statistics`, or, when the codec bounds the statistics
(:attr:`UpdateCodec.statistics_bound`) or masks them (:attr:`UpdateCodec.statistics_as_sums`), as
per-class sums (Σ n, Σ z, Σ zzᵀ), which noise can be added to and secure aggregation can sum.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection

import torch

from fedlatent.config import PrivacyConfig
from fedlatent.federated.accounting import Accountant, PoissonAccountant
from fedlatent.federated.adaptive_clipping import CLIP_NORM, CODEC, AdaptiveClipping, unclipped_bit, update_noise_multiplier
from fedlatent.methods.aggregation import weighted_mean
from fedlatent.methods.parts import Combine, Tensors, Upload
from fedlatent.federated.randomness import Randomness, Source, privacy_generator, standard_normal
from fedlatent.seeding import PRIVACY_NOISE, PRIVACY_STATISTICS


class UpdateCodec:
    """The plain codec: an upload travels as it is, the server takes the weighted mean of the states
    (:func:`~fedlatent.methods.aggregation.weighted_mean`) and the plain sums of the statistics."""

    name = "plain"
    statistics_bound: float | None = None  # the bound each client's statistics are clipped to (None: as computed)

    def payload(self, state: Tensors) -> Tensors:
        """What the codec sends the clients with the round's global model, from the server ``state``
        (adaptive clipping's clip norm); the plain codec sends nothing."""
        return {}

    def encode(self, upload: Upload, reference: Tensors, withheld: Collection[str], payload: Tensors) -> Upload:
        """The message ``upload`` travels as, from a client that started from ``reference`` (the
        round's global state) with the round's ``payload``; ``withheld``: entries that do not travel (a
        fixed head, the clients' own layers), left as they are. The plain codec returns ``upload`` itself."""
        return upload

    def combine(self, messages: list[Upload], keys: list[str] | None = None,
                weights: list[float] | None = None) -> Tensors:
        """Σ_k c_k · m_k of the messages' states over ``keys`` (all: None), c_k the sample shares
        n_k / Σn or the ``weights`` given (FedNova's p_k / a_k, FedDyn's 1/K): the contract of
        :func:`~fedlatent.methods.aggregation.weighted_mean`, which the plain codec is."""
        return weighted_mean(messages, keys, weights)

    def round_combine(self, rnd: int, reference: Tensors, withheld: Collection[str], state: Tensors) -> Combine:
        """The ``combine`` of round ``rnd`` (0-based), whose clients started from ``reference`` and
        kept ``withheld`` to themselves, under the server ``state`` as the round began: a codec that
        draws noise or unmasks per round binds them here; the plain codec's is :meth:`combine` itself."""
        return self.combine

    def server_update(self, rnd: int, uploads: list[Upload], state: Tensors) -> None:
        """After round ``rnd``'s aggregation: the codec's entries of the server ``state`` from the
        ``uploads`` (adaptive clipping's clip norm); the plain codec keeps none."""

    def round_metrics(self, state: Tensors) -> dict[str, float]:
        """The codec's fields of a round's metrics line, from the server ``state`` the round starts
        with (``privacy_clip_norm``: the bound its updates are clipped to, when it adapts)."""
        return {}

    def epsilon(self, rounds: int, releases: int = 0) -> float | None:
        """The privacy loss ε after ``rounds`` rounds and ``releases`` releases of calibration
        statistics, or None: the codec gives no DP guarantee."""
        return None

    @property
    def statistics_as_sums(self) -> bool:
        """Whether CCVR's clients send per-class sums (Σ n, Σ z, Σ zzᵀ) rather than moments: when the
        codec bounds the statistics (noise is added to sums) or masks them (secure aggregation: the
        server reads sums alone)."""
        return self.statistics_bound is not None

    def encode_statistics(self, statistics: Tensors) -> Tensors:
        """A client's calibration statistics as they travel; the plain codec sends them as they are."""
        return statistics

    def total(self, statistics: list[Tensors], release: int) -> Tensors:
        """The clients' statistics summed entry by entry (FFC's Σ_k V_k and Σ_k U_k), in the
        order given, as one stacked sum (what :func:`~fedlatent.calibration.ffc.ffc_solve` sums);
        ``release`` numbers the run's calibrations (a noisy codec's draws)."""
        return {key: torch.stack([s[key] for s in statistics]).sum(0) for key in statistics[0]}


def update_norm(update: Tensors) -> float:
    """‖Δ‖₂ over all entries of ``update`` together, accumulated in float64."""
    if not update:
        return 0.0
    norms = torch.stack([torch.linalg.vector_norm(v, dtype=torch.float64).cpu() for v in update.values()])
    return float(torch.linalg.vector_norm(norms))


def clip(update: Tensors, bound: float, norm: float | None = None) -> Tensors:
    """``update`` scaled to L2 norm ``bound`` where its norm (``norm``, else computed) exceeds it,
    else ``update`` itself: Δ · min(1, C / ‖Δ‖) (DP-FedAvg's per-client clip, McMahan et al. 2018,
    Algorithm 1, with the flat clip over all entries together)."""
    norm = update_norm(update) if norm is None else norm
    if norm <= bound:
        return update
    scale = bound / norm
    return {key: value * scale for key, value in update.items()}


class ClipCodec(UpdateCodec):
    """Each client's update Δ = w_k − w̄ clipped to L2 norm C (every floating-point entry that
    travels, together; integer buffers as they are) before the server weights it: the message is
    w̄ + clip(Δ). An update within the bound travels as it is, so ``clip_norm`` = ∞ is the plain
    codec bit for bit. The server takes the plain weighted mean.

    C is ``clip_norm``, or the clip norm the round's payload carries: the server's ``adaptive``
    clipping (:class:`~fedlatent.federated.adaptive_clipping.AdaptiveClipping`) sends it, and the
    client then sends the bit 1[‖Δ‖ ≤ C] beside its update (``extras["codec"]``), from which the
    server moves C after the round. Each client's calibration statistics are clipped the same way to
    ``statistics_clip_norm`` (∞: sent as computed)."""

    name = "clip"

    def __init__(self, clip_norm: float, *, adaptive: AdaptiveClipping | None = None,
                 statistics_clip_norm: float = math.inf) -> None:
        if not (clip_norm > 0 and statistics_clip_norm > 0):
            raise ValueError(f"clip_norm and statistics_clip_norm must be > 0, got {clip_norm}, {statistics_clip_norm}")
        self.clip_norm, self.adaptive = clip_norm, adaptive
        self.statistics_bound = None if math.isinf(statistics_clip_norm) else statistics_clip_norm

    def payload(self, state: Tensors) -> Tensors:
        return {} if self.adaptive is None else self.adaptive.payload(state)

    def encode(self, upload: Upload, reference: Tensors, withheld: Collection[str], payload: Tensors) -> Upload:
        adaptive = CLIP_NORM in payload
        bound = float(payload[CLIP_NORM]) if adaptive else self.clip_norm
        coded = [k for k, v in upload.state.items() if k not in withheld and v.is_floating_point()]
        delta = {k: upload.state[k] - reference[k].to(upload.state[k].device) for k in coded}
        norm = update_norm(delta)
        clipped = clip(delta, bound, norm)
        message = upload
        if clipped is not delta:
            message = dataclasses.replace(upload, state={
                k: (reference[k].to(v.device) + clipped[k]).to(v.dtype) if k in clipped else v
                for k, v in upload.state.items()})
        if adaptive:
            message = dataclasses.replace(message, extras={**upload.extras, CODEC: unclipped_bit(norm, bound)})
        return message

    def server_update(self, rnd: int, uploads: list[Upload], state: Tensors) -> None:
        if self.adaptive is not None:
            self.adaptive.update(rnd, uploads, state)

    def round_metrics(self, state: Tensors) -> dict[str, float]:
        return {} if self.adaptive is None else {"privacy_clip_norm": self.adaptive.current(state)}

    def clip_norm_of(self, state: Tensors) -> float:
        """The clip norm of the round that starts with the server ``state``."""
        return self.clip_norm if self.adaptive is None else self.adaptive.current(state)

    def encode_statistics(self, statistics: Tensors) -> Tensors:
        """The statistics scaled to L2 norm ``statistics_clip_norm`` (all entries together) where they
        exceed it: a client's FFC solution and CCVR moments unchanged, its weight in the sums bounded."""
        return statistics if self.statistics_bound is None else clip(statistics, self.statistics_bound)


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
    reported). With ``adaptive`` clipping C is the round's clip norm and σ is the updates' share of
    the noise (σ_Δ, :func:`~fedlatent.federated.adaptive_clipping.update_noise_multiplier`).

    The calibration statistics, each client's clipped to ``statistics_clip_norm`` = B, are summed
    with Gaussian noise N(0, σ_s²B²) on every entry (σ_s = ``statistics_noise_multiplier``), drawn
    from (run seed, release) (:meth:`total`)."""

    name = "gaussian"

    def __init__(self, clip_norm: float, noise_multiplier: float, per_round: int, seed: int | Randomness,
                 accountant: Accountant | PoissonAccountant | None = None, *, adaptive: AdaptiveClipping | None = None,
                 statistics_clip_norm: float = math.inf, statistics_noise_multiplier: float = 0.0) -> None:
        super().__init__(clip_norm, adaptive=adaptive, statistics_clip_norm=statistics_clip_norm)
        if not (noise_multiplier >= 0 and math.isfinite(clip_norm)):
            raise ValueError(f"GaussianCodec needs noise_multiplier >= 0 and a finite clip_norm, got "
                             f"{noise_multiplier} and {clip_norm}")
        if statistics_noise_multiplier > 0 and self.statistics_bound is None:
            raise ValueError("noise on the statistics needs a finite statistics_clip_norm to scale it")
        self.noise_multiplier, self.per_round, self.seed = noise_multiplier, per_round, seed
        self.statistics_noise_multiplier = statistics_noise_multiplier
        self.accountant = accountant

    def combine(self, messages: list[Upload], keys: list[str] | None = None,
                weights: list[float] | None = None) -> Tensors:
        """Refused: the estimator needs the round (its noise) and its reference (:meth:`round_combine`)."""
        raise TypeError("GaussianCodec combines a round's messages through round_combine(rnd, reference, withheld, "
                        "state)")

    def round_combine(self, rnd: int, reference: Tensors, withheld: Collection[str], state: Tensors) -> Combine:
        bound = self.clip_norm_of(state)

        def combine(messages: list[Upload], keys: list[str] | None = None,
                    weights: list[float] | None = None) -> Tensors:
            if weights is not None:
                raise ValueError("the DP-FedAvg estimator weights every client alike; a weighted combine "
                                 "(FedNova's, FedDyn's) breaks its sensitivity bound")
            return self.noisy_mean(messages, keys, reference, withheld, self.noise(rnd), bound)
        return combine

    def noise(self, rnd: int) -> Source:
        """Round ``rnd``'s noise generator: (run seed, PRIVACY_NOISE, round), or privacy.randomness's secret stream."""
        return privacy_generator(self.seed, PRIVACY_NOISE, rnd)

    def noisy_mean(self, messages: list[Upload], keys: list[str] | None, reference: Tensors,
                   withheld: Collection[str], generator: Source, bound: float) -> Tensors:
        """w̄ + (Σ_k Δ_k + N(0, σ²C²)) / m over ``keys`` (every key of the first message: None), C =
        ``bound``, the sum and the noise in float64 and the result in each entry's dtype."""
        scale = self.noise_multiplier * bound
        out: Tensors = {}
        for key in messages[0].state if keys is None else keys:
            ref = reference[key]
            if key in withheld or not ref.is_floating_point():
                out[key] = ref
                continue
            total = torch.stack([m.state[key].to(ref.device, torch.float64) for m in messages]).sum(0) \
                - len(messages) * ref.double()
            noise = standard_normal(ref.shape, generator, torch.float64).to(ref.device)
            out[key] = (ref.double() + (total + scale * noise) / self.per_round).to(ref.dtype)
        return out

    def epsilon(self, rounds: int, releases: int = 0) -> float | None:
        return None if self.accountant is None else self.accountant.epsilon(rounds, releases)

    def total(self, statistics: list[Tensors], release: int) -> Tensors:
        """The clients' (clipped) statistics summed, with N(0, σ_s²B²) on every entry, in float64,
        drawn from (run seed, PRIVACY_STATISTICS, ``release``) in the entries' order."""
        summed = super().total(statistics, release)
        if self.statistics_bound is None or self.statistics_noise_multiplier == 0:
            return summed
        scale = self.statistics_noise_multiplier * self.statistics_bound
        generator = privacy_generator(self.seed, PRIVACY_STATISTICS, release)
        return {key: value.double() + scale * standard_normal(value.shape, generator, torch.float64).to(value.device)
                for key, value in summed.items()}


def build_codec(cfg: PrivacyConfig) -> UpdateCodec:
    """The client's side of the codec ``[privacy]`` asks for (what :meth:`~UpdateCodec.encode` and
    :meth:`~UpdateCodec.encode_statistics` need): clipping at ``clip_norm`` (or at the clip norm an
    adaptive server sends) and of the statistics at ``statistics_clip_norm``, or the plain codec
    (both ∞). A Flower node builds this one; the noise is the server's (:func:`server_codec`)."""
    if math.isinf(cfg.clip_norm) and math.isinf(cfg.statistics_clip_norm):
        return UpdateCodec()
    return ClipCodec(cfg.clip_norm, statistics_clip_norm=cfg.statistics_clip_norm)


def server_codec(cfg: PrivacyConfig, seed: int | Randomness, num_clients: int, per_round: int,
                 poisson_rate: float | None = None) -> UpdateCodec:
    """The server's codec: DP-FedAvg's :class:`GaussianCodec` when ``noise_multiplier`` > 0 (its
    accountant for ``per_round`` of ``num_clients`` clients a round, given σ itself: with adaptive
    clipping the updates' noise is σ_Δ, so that with the count's it spends σ's privacy; under Poisson
    client sampling of rate ``poisson_rate``, the :class:`PoissonAccountant` of ``privacy.accountant``),
    else :func:`build_codec`'s with the server's side of adaptive clipping when ``target_quantile`` > 0."""
    adaptive = AdaptiveClipping(cfg.clip_norm, cfg.target_quantile, cfg.clip_learning_rate, cfg.clip_count_noise,
                                per_round, seed) if cfg.adaptive else None
    if cfg.noise_multiplier == 0:
        if adaptive is None:
            return build_codec(cfg)
        return ClipCodec(cfg.clip_norm, adaptive=adaptive, statistics_clip_norm=cfg.statistics_clip_norm)
    statistics_sigma = cfg.statistics_sigma if math.isfinite(cfg.statistics_clip_norm) else 0.0
    randomness = seed if isinstance(seed, Randomness) else Randomness("seeded", seed)  # the selection the server knows
    accountant: Accountant | PoissonAccountant = \
        Accountant(num_clients, per_round, cfg.noise_multiplier, cfg.delta, statistics_sigma,
                   lambda rnd: randomness.select(rnd, num_clients, per_round)) if poisson_rate is None else \
        PoissonAccountant(poisson_rate, cfg.noise_multiplier, cfg.delta, statistics_sigma, cfg.accountant)
    update_sigma = cfg.noise_multiplier if adaptive is None else \
        update_noise_multiplier(cfg.noise_multiplier, cfg.clip_count_noise)
    return GaussianCodec(cfg.clip_norm, update_sigma, per_round, seed, accountant, adaptive=adaptive,
                         statistics_clip_norm=cfg.statistics_clip_norm, statistics_noise_multiplier=statistics_sigma)
