"""The update codec at the message boundary, as a chain of links: what a client's upload becomes on
the way to the server (the *encode links*, the client half's last step) and what the server makes
of the messages (the *server links*: one combiner, then links on the combined sum, then one
finisher), with the calibration statistics through the same links.

Every backend goes through one codec at the same two points: each client's upload is encoded after
the client's own non-finite check (``round.encoded``: the embedded backends' ``Setup.train``, the
Flower ClientApp's ``train``), and the server's mean — :meth:`fedlatent.federated.server.Server.aggregate`
and the parts that replace it (FedNova, FedDyn) — is the codec's ``combine``. This is the one
place where client-level differential privacy (clip each update to norm C, Gaussian noise σ·C on
the sum: McMahan et al. 2018, DP-FedAvg), compression (top-k with error feedback,
:mod:`fedlatent.federated.compression`) and secure aggregation (encode masks, combine unmasks: the
server sees only the sum; Bonawitz et al. 2017) plug in.

**The chain.** Encode links run in the declared order of their :data:`STAGES` — clip → compress →
noise share → mask — each one at most once (a mask must come last: nothing can act on a masked
vector; a clip first: the bound is on the client's own update). Each link maps the message so far to
the next one and may keep *per-client state* in the client's own state dict
(:attr:`EncodeContext.client_state`, under ``codec.<link>.``: checkpointed with the client, never
sent), which error feedback needs. On the server the chain is a :class:`Combiner` (the plain
weighted mean of states, the sum of the updates Σ_k Δ_k, or a SecAgg+ unmasking), the
:class:`SumLink`\\ s that act on that sum (Gaussian noise), and a :class:`Finisher` that turns the sum
into the new global state (w̄ + S/m, w̄ + S/Σn). The server links hold *per-round server state*:
what :meth:`UpdateCodec.round_combine` binds for round r (its noise generator, its unmasking
session) and what :class:`ServerStateLink`\\ s keep in ``Server.state`` across rounds (adaptive
clipping's clip norm, sent to the clients in the payload and moved after each aggregation).

Today's codecs are chains: the plain codec is no encode link and the weighted-mean combiner;
:class:`ClipCodec` the clip link (with adaptive clipping's server state); :class:`GaussianCodec` the
clip link, the sum of updates, the Gaussian noise link and the fixed-denominator finisher; SecAgg+'s
client codec its inner codec's links then the mask link, its server codec the unmasking combiner
and the sample-mean finisher (:mod:`fedlatent.backends.flower.secagg_codec`; with distributed DP, the
Skellam share then the integer mask, and the unmasked modular sum with the fixed denominator).

A message stands for a *state*: the plain codec sends the client's weights w_k as they are, and a
link that works on the update Δ_k = w_k − w̄ (w̄ the round's global state the client started from)
sends w̄ + coded(Δ_k). Why states and not Δ: the plain codec must leave every number bit for bit
as it was, and Σ p_k w_k and w̄ + Σ p_k Δ_k differ in the last bits; every reader of an upload
(FedNova's steps, the diagnostics' local models, Flower's records, the traffic count) also reads it
unchanged. With coefficients summing to one, the mean of w̄ + Δ_k is w̄ plus the mean of Δ_k,
masks cancel in a sum of states as in a sum of updates, and noise added to the sum of states is
noise on the sum of updates. A link that sends fewer bytes than the state's tensors hold says so in
the upload's metrics (:data:`CODED_BYTES`), which the round's ``bytes_up`` counts in their place.

Not yet through the codec: the parts' extras (SCAFFOLD's Δc, FedDyn's Δλ), summed by their parts'
server hooks. The calibration statistics go through it: FFC's V and U as they are; CCVR's per-class
moments as they are, pooled by :func:`fedlatent.calibration.ccvr.pool_statistics`, or, when the codec
bounds the statistics (:attr:`UpdateCodec.statistics_bound`) or masks them
(:attr:`UpdateCodec.statistics_as_sums`), as per-class sums (Σ n, Σ z, Σ zzᵀ), which noise can be
added to and secure aggregation can sum.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection

import torch

from fedlatent.config import CompressionConfig, PrivacyConfig
from fedlatent.federated.accounting import Accountant, PoissonAccountant
from fedlatent.federated.adaptive_clipping import CLIP_NORM, CODEC, AdaptiveClipping, unclipped_bit, update_noise_multiplier
from fedlatent.federated.codec_chain import (Chain, Combiner, EncodeContext, EncodeLink, Finisher, RoundContext,
                                             ServerStateLink, SumLink, UpdateSum, coded_keys)
from fedlatent.federated.compression import compression_link
from fedlatent.federated.distributed_dp import (ModularSum, NoiseSource, Rotation, SkellamAccountant, SkellamShare,
                                               SkellamSpec, public_rotation)
from fedlatent.methods.parts import Combine, Tensors, Upload
from fedlatent.federated.randomness import Randomness, privacy_generator, standard_normal
from fedlatent.seeding import DISTRIBUTED_NOISE, PRIVACY_NOISE, PRIVACY_STATISTICS




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


class ClipLink(EncodeLink):
    """Δ = w_k − w̄ clipped to L2 norm C (every floating-point entry that travels, together; integer
    buffers as they are): the message is w̄ + clip(Δ); one within the bound travels as it is. C is
    ``clip_norm``, or the clip norm the round's payload carries (adaptive clipping), and then the
    bit 1[‖Δ‖ ≤ C] travels beside the update (``extras["codec"]``). The statistics are clipped the
    same way to ``statistics_clip_norm`` (∞: as computed)."""

    stage = "clip"

    def __init__(self, clip_norm: float, statistics_clip_norm: float = math.inf) -> None:
        if not (clip_norm > 0 and statistics_clip_norm > 0):
            raise ValueError(f"clip_norm and statistics_clip_norm must be > 0, got {clip_norm}, {statistics_clip_norm}")
        self.clip_norm = clip_norm
        self.statistics_bound = None if math.isinf(statistics_clip_norm) else statistics_clip_norm

    def encode(self, message: Upload, ctx: EncodeContext) -> Upload:
        adaptive = CLIP_NORM in ctx.payload
        bound = float(ctx.payload[CLIP_NORM]) if adaptive else self.clip_norm
        reference = ctx.reference
        delta = {k: message.state[k] - reference[k].to(message.state[k].device) for k in coded_keys(message, ctx.withheld)}
        norm = update_norm(delta)
        clipped = clip(delta, bound, norm)
        out = message
        if clipped is not delta:
            out = dataclasses.replace(message, state={
                k: (reference[k].to(v.device) + clipped[k]).to(v.dtype) if k in clipped else v
                for k, v in message.state.items()})
        if adaptive:
            out = dataclasses.replace(out, extras={**message.extras, CODEC: unclipped_bit(norm, bound)})
        return out

    def encode_statistics(self, statistics: Tensors) -> Tensors:
        """The statistics scaled to L2 norm ``statistics_clip_norm`` (all entries together) where they
        exceed it: a client's FFC solution and CCVR moments unchanged, its weight in the sums bounded."""
        return statistics if self.statistics_bound is None else clip(statistics, self.statistics_bound)


class SumOfUpdates(Combiner):
    """Σ_k (m_k − w̄) in float64 over every floating-point entry that travels, each client alike (a
    weighted combine is refused: data-size weights would let one client's share exceed C and break
    the sensitivity bound); integer entries and those that never travel stay at w̄'s value."""

    def combine(self, messages: list[Upload], keys: list[str] | None, weights: list[float] | None,
                rc: RoundContext) -> UpdateSum:
        if weights is not None:
            raise ValueError("the DP-FedAvg estimator weights every client alike; a weighted combine "
                             "(FedNova's, FedDyn's) breaks its sensitivity bound")
        order = list(messages[0].state if keys is None else keys)
        sums: Tensors = {}
        for key in order:
            ref = rc.reference[key]
            if key in rc.withheld or not ref.is_floating_point():
                continue
            sums[key] = torch.stack([m.state[key].to(ref.device, torch.float64) for m in messages]).sum(0) \
                - len(messages) * ref.double()
        return UpdateSum(sums, order, len(messages), sum(m.num_samples for m in messages))


class GaussianNoise(SumLink):
    """N(0, σ²C² I) on the sum of the updates, one standard normal draw per entry in the sum's order
    from the round's generator (run seed, PRIVACY_NOISE, round), C the round's clip bound; on the
    statistics' sum N(0, σ_s²B²) per entry, B = ``statistics_bound``, from (run seed,
    PRIVACY_STATISTICS, release); all in float64. With secret randomness (``seed`` a secret
    :class:`~fedlatent.federated.randomness.Randomness`) the same streams of its key, drawn by
    :func:`~fedlatent.federated.randomness.standard_normal`."""

    def __init__(self, noise_multiplier: float, seed: int | Randomness, statistics_bound: float | None = None,
                 statistics_noise_multiplier: float = 0.0) -> None:
        self.noise_multiplier, self.seed = noise_multiplier, seed
        self.statistics_bound, self.statistics_noise_multiplier = statistics_bound, statistics_noise_multiplier

    def apply(self, total: UpdateSum, rc: RoundContext) -> UpdateSum:
        scale = self.noise_multiplier * rc.bound
        generator = privacy_generator(self.seed, PRIVACY_NOISE, rc.rnd)
        sums = {}
        for key, value in total.sums.items():
            noise = standard_normal(value.shape, generator, torch.float64).to(value.device)
            sums[key] = value + scale * noise
        return dataclasses.replace(total, sums=sums)

    def statistics(self, summed: Tensors, release: int) -> Tensors:
        if self.statistics_bound is None or self.statistics_noise_multiplier == 0:
            return summed
        scale = self.statistics_noise_multiplier * self.statistics_bound
        generator = privacy_generator(self.seed, PRIVACY_STATISTICS, release)
        return {key: value.double() + scale * standard_normal(value.shape, generator, torch.float64).to(value.device)
                for key, value in summed.items()}


class FixedDenominator(Finisher):
    """w̄ + S / m, m the *expected* number of clients per round (``per_round``), not the number that
    replied, so that a dropped client changes no other's weight (McMahan et al. 2018's f̃_f with
    w_k = 1, qW = m); each entry back in its dtype."""

    def __init__(self, per_round: int) -> None:
        self.per_round = per_round

    def finish(self, total: UpdateSum, rc: RoundContext) -> Tensors:
        out: Tensors = {}
        for key in total.order:
            ref = rc.reference[key]
            out[key] = (ref.double() + total.sums[key] / self.per_round).to(ref.dtype) if key in total.sums else ref
        return out


class AdaptiveBound(ServerStateLink):
    """Adaptive clipping's server state (:class:`~fedlatent.federated.adaptive_clipping.AdaptiveClipping`):
    the clip norm, sent in the payload, reported as ``privacy_clip_norm`` and moved by the clients' bits."""

    def __init__(self, adaptive: AdaptiveClipping) -> None:
        self.adaptive = adaptive

    def payload(self, state: Tensors) -> Tensors:
        return self.adaptive.payload(state)

    def round_metrics(self, state: Tensors) -> dict[str, float]:
        return {"privacy_clip_norm": self.adaptive.current(state)}

    def bound(self, state: Tensors) -> float | None:
        return self.adaptive.current(state)

    def server_update(self, rnd: int, uploads: list[Upload], state: Tensors) -> None:
        self.adaptive.update(rnd, uploads, state)


class UpdateCodec:
    """A codec: a :class:`Chain` of links, at the two points every backend calls. Without links it is
    the plain codec: an upload travels as it is, the server takes the weighted mean of the states
    (:func:`~fedlatent.methods.aggregation.weighted_mean`) and the plain sums of the statistics."""

    name = "plain"
    statistics_bound: float | None = None  # the bound each client's statistics are clipped to (None: as computed)
    chain = Chain()  # the plain chain, for a subclass that builds none of its own

    def __init__(self, chain: Chain | None = None) -> None:
        self.chain = chain or Chain()
        bounds = [link.statistics_bound for link in self.chain.encoders if link.statistics_bound is not None]
        self.statistics_bound = bounds[0] if bounds else None

    @property
    def statistics_as_sums(self) -> bool:
        """Whether CCVR's clients send per-class sums (Σ n, Σ z, Σ zzᵀ) rather than moments: when the
        codec bounds the statistics (noise is added to sums) or masks them (secure aggregation: the
        server reads sums alone)."""
        return self.statistics_bound is not None or self.chain.combiner.reads_sums \
            or any(link.stage == "mask" for link in self.chain.encoders)

    def payload(self, state: Tensors) -> Tensors:
        """What the codec sends the clients with the round's global model, from the server ``state``
        (adaptive clipping's clip norm); the plain codec sends nothing."""
        return {k: v for link in self.chain.server_state for k, v in link.payload(state).items()}

    def encode(self, upload: Upload, reference: Tensors, withheld: Collection[str], payload: Tensors,
               client_state: Tensors | None = None, rnd: int = 0) -> Upload:
        """The message ``upload`` travels as, from a client that started from ``reference`` (the
        round's global state) with the round's ``payload``; ``withheld``: entries that do not travel (a
        fixed head, the clients' own layers), left as they are; ``client_state``: the client's new
        state, where a link keeps its per-client state; ``rnd``: the round (0-based). The plain codec
        returns ``upload`` itself."""
        ctx = EncodeContext(reference, withheld, payload, client_state, rnd)
        for link in self.chain.encoders:
            upload = link.encode(upload, ctx)
        return upload

    def encode_statistics(self, statistics: Tensors) -> Tensors:
        """A client's calibration statistics as they travel; the plain codec sends them as they are."""
        for link in self.chain.encoders:
            statistics = link.encode_statistics(statistics)
        return statistics

    def combine(self, messages: list[Upload], keys: list[str] | None = None,
                weights: list[float] | None = None) -> Tensors:
        """The plain weighted mean (a terminal combiner); refused where the combine needs the round
        (its noise, its unmasking) and its reference: :meth:`round_combine`."""
        if not self.chain.combiner.terminal:
            raise TypeError(f"{type(self).__name__} combines a round's messages through round_combine(rnd, reference, "
                            "withheld, state)")
        combined = self.chain.combiner.combine(messages, keys, weights, RoundContext(-1, {}, (), {}))
        assert not isinstance(combined, UpdateSum)
        return combined

    def round_bound(self, state: Tensors) -> float:
        """The clip bound of the round that starts with the server ``state`` (∞: none)."""
        for link in self.chain.server_state:
            bound = link.bound(state)
            if bound is not None:
                return bound
        clips = [link for link in self.chain.encoders if isinstance(link, ClipLink)]
        return clips[0].clip_norm if clips else math.inf

    def round_combine(self, rnd: int, reference: Tensors, withheld: Collection[str], state: Tensors) -> Combine:
        """The ``combine`` of round ``rnd`` (0-based), whose clients started from ``reference`` and
        kept ``withheld`` to themselves, under the server ``state`` as the round began: the server
        links bound to the round (:class:`RoundContext`); the plain codec's is :meth:`combine` itself."""
        if self.chain.combiner.terminal:
            return self.combine
        rc = RoundContext(rnd, reference, withheld, state, self.round_bound(state))
        chain, finisher = self.chain, self.chain.finisher
        assert finisher is not None

        def combine(messages: list[Upload], keys: list[str] | None = None,
                    weights: list[float] | None = None) -> Tensors:
            total = chain.combiner.combine(messages, keys, weights, rc)
            assert isinstance(total, UpdateSum)
            for link in chain.sum_links:
                total = link.apply(total, rc)
            return finisher.finish(total, rc)
        return combine

    def server_update(self, rnd: int, uploads: list[Upload], state: Tensors) -> None:
        """After round ``rnd``'s aggregation: the server-state links' entries of ``state`` from the
        ``uploads`` (adaptive clipping's clip norm); the plain codec keeps none."""
        for link in self.chain.server_state:
            link.server_update(rnd, uploads, state)

    def round_metrics(self, state: Tensors) -> dict[str, float]:
        """The codec's fields of a round's metrics line, from the server ``state`` the round starts
        with (``privacy_clip_norm``: the bound its updates are clipped to, when it adapts)."""
        return {k: v for link in self.chain.server_state for k, v in link.round_metrics(state).items()}

    def epsilon(self, rounds: int, releases: int = 0) -> float | None:
        """The privacy loss ε after ``rounds`` rounds and ``releases`` releases of calibration
        statistics, or None: the codec gives no DP guarantee."""
        return None

    def total(self, statistics: list[Tensors], release: int) -> Tensors:
        """The clients' statistics combined by the combiner, then through the sum links (noise),
        in the order given; ``release`` numbers the run's calibrations (a noisy codec's draws)."""
        summed = self.chain.combiner.total(statistics)
        for link in self.chain.sum_links:
            summed = link.statistics(summed, release)
        return summed


class ClipCodec(UpdateCodec):
    """The clip link alone (:class:`ClipLink`), with the plain weighted mean on the server; with
    ``adaptive`` clipping, its server state (:class:`AdaptiveBound`). ``clip_norm`` = ∞ is the plain
    codec bit for bit."""

    name = "clip"

    def __init__(self, clip_norm: float, *, adaptive: AdaptiveClipping | None = None,
                 statistics_clip_norm: float = math.inf) -> None:
        self.clip_norm, self.adaptive = clip_norm, adaptive
        super().__init__(self._chain(ClipLink(clip_norm, statistics_clip_norm)))

    def _chain(self, clipping: ClipLink) -> Chain:
        return Chain([clipping], server_state=[AdaptiveBound(self.adaptive)] if self.adaptive else [])

    def clip_norm_of(self, state: Tensors) -> float:
        """The clip norm of the round that starts with the server ``state``."""
        return self.round_bound(state)


class GaussianCodec(ClipCodec):
    """Client-level DP-FedAvg (McMahan et al. 2018, "Learning differentially private recurrent
    language models", Algorithm 1): the clip link on the client, and on the server the sum of the
    updates, Gaussian noise on it and the fixed denominator:

        w̄' = w̄ + (Σ_k Δ_k + N(0, σ²C² I)) / m

    (:class:`SumOfUpdates`, :class:`GaussianNoise`, :class:`FixedDenominator`). ε after r rounds
    comes from ``accountant`` (:class:`~fedlatent.federated.accounting.Accountant`; None: no ε
    reported). With ``adaptive`` clipping C is the round's clip norm and σ is the updates' share of
    the noise (σ_Δ, :func:`~fedlatent.federated.adaptive_clipping.update_noise_multiplier`). The
    calibration statistics, each client's clipped to ``statistics_clip_norm`` = B, are summed with
    N(0, σ_s²B²) on every entry (σ_s = ``statistics_noise_multiplier``)."""

    name = "gaussian"

    def __init__(self, clip_norm: float, noise_multiplier: float, per_round: int, seed: int | Randomness,
                 accountant: Accountant | PoissonAccountant | None = None, *, adaptive: AdaptiveClipping | None = None,
                 statistics_clip_norm: float = math.inf, statistics_noise_multiplier: float = 0.0) -> None:
        if not (noise_multiplier >= 0 and math.isfinite(clip_norm)):
            raise ValueError(f"GaussianCodec needs noise_multiplier >= 0 and a finite clip_norm, got "
                             f"{noise_multiplier} and {clip_norm}")
        self.noise_multiplier, self.per_round, self.seed = noise_multiplier, per_round, seed
        self.statistics_noise_multiplier = statistics_noise_multiplier
        self.accountant = accountant
        super().__init__(clip_norm, adaptive=adaptive, statistics_clip_norm=statistics_clip_norm)
        if statistics_noise_multiplier > 0 and self.statistics_bound is None:
            raise ValueError("noise on the statistics needs a finite statistics_clip_norm to scale it")

    def _chain(self, clipping: ClipLink) -> Chain:
        noise = GaussianNoise(self.noise_multiplier, self.seed, clipping.statistics_bound,
                              self.statistics_noise_multiplier)
        return Chain([clipping], SumOfUpdates(), [noise], FixedDenominator(self.per_round),
                     [AdaptiveBound(self.adaptive)] if self.adaptive else [])

    def epsilon(self, rounds: int, releases: int = 0) -> float | None:
        return None if self.accountant is None else self.accountant.epsilon(rounds, releases)


class DistributedCodec(UpdateCodec):
    """Distributed DP (:mod:`fedlatent.federated.distributed_dp`): the clip link and each client's
    Skellam share on the client (the round's signs from ``rotation``, its rounding and share from
    ``noise``); the modular sum and the fixed denominator w̄ + S/m on the server; ε from ``accountant``
    for the worst case of survivors it was built for."""

    name = "distributed-skellam"

    def __init__(self, spec: SkellamSpec, accountant: SkellamAccountant, rotation: Rotation,
                 noise: NoiseSource) -> None:
        self.spec, self.accountant, self.rotation = spec, accountant, rotation
        self.modular = ModularSum(spec, rotation)
        super().__init__(Chain([ClipLink(spec.clip_norm), SkellamShare(spec, rotation, noise)], self.modular, [],
                               FixedDenominator(spec.per_round)))

    def epsilon(self, rounds: int, releases: int = 0) -> float | None:
        dimension = self.modular.dimension
        return 0.0 if dimension is None else self.accountant.epsilon(rounds, dimension)


def client_links(cfg: PrivacyConfig, compression: CompressionConfig | None = None) -> list[EncodeLink]:
    """The client's encode links ``[privacy]`` and ``[compression]`` ask for: the clip (at
    ``clip_norm``, or at the clip norm an adaptive server sends, and of the statistics at
    ``statistics_clip_norm``; none when both are ∞), then the compression link."""
    links: list[EncodeLink] = []
    if not (math.isinf(cfg.clip_norm) and math.isinf(cfg.statistics_clip_norm)):
        links.append(ClipLink(cfg.clip_norm, cfg.statistics_clip_norm))
    squeeze = compression_link(compression)
    return links if squeeze is None else [*links, squeeze]


def build_codec(cfg: PrivacyConfig, compression: CompressionConfig | None = None) -> UpdateCodec:
    """The client's side of the codec (what :meth:`~UpdateCodec.encode` and
    :meth:`~UpdateCodec.encode_statistics` need): :func:`client_links`' chain with the plain mean,
    :class:`ClipCodec` when the clip is its one link, the plain codec when it has none. A Flower node
    builds this one; the noise is the server's (:func:`server_codec`)."""
    links = client_links(cfg, compression)
    if not links:
        return UpdateCodec()
    if len(links) == 1 and isinstance(links[0], ClipLink):
        return ClipCodec(cfg.clip_norm, statistics_clip_norm=cfg.statistics_clip_norm)
    return UpdateCodec(Chain(links))


def server_codec(cfg: PrivacyConfig, seed: int | Randomness, num_clients: int, per_round: int,
                 compression: CompressionConfig | None = None, survivors: int = 1,
                 poisson_rate: float | None = None) -> UpdateCodec:
    """The server's codec: DP-FedAvg's :class:`GaussianCodec` when ``noise_multiplier`` > 0 (its
    accountant for ``per_round`` of ``num_clients`` clients a round, given σ itself: with adaptive
    clipping the updates' noise is σ_Δ, so that with the count's it spends σ's privacy; under Poisson
    client sampling of rate ``poisson_rate``, the :class:`PoissonAccountant` of ``privacy.accountant``),
    else :func:`build_codec`'s with the server's side of adaptive clipping when ``target_quantile`` > 0;
    distributed DP's :class:`DistributedCodec` when ``distributed`` asks for it, its ε for the worst
    case of ``survivors`` clients in a round's sum, its public rotation from the run's seed and each
    client's rounding and share from ``seed``'s stream ``DISTRIBUTED_NOISE`` (round, client): seeded,
    or the server's secret key (the embedded backends' clients live in the server's process; a
    Flower node draws its own, :mod:`fedlatent.backends.flower.distributed`)."""
    adaptive = AdaptiveClipping(cfg.clip_norm, cfg.target_quantile, cfg.clip_learning_rate, cfg.clip_count_noise,
                                per_round, seed) if cfg.adaptive else None
    if cfg.noise_multiplier == 0:
        if adaptive is None:
            return build_codec(cfg, compression)
        return ClipCodec(cfg.clip_norm, adaptive=adaptive, statistics_clip_norm=cfg.statistics_clip_norm)
    if cfg.distributed == "skellam":
        randomness = seed if isinstance(seed, Randomness) else Randomness("seeded", seed)
        spec = SkellamSpec(cfg.clip_norm, cfg.noise_multiplier, per_round, cfg.distributed_bits)
        return DistributedCodec(spec, SkellamAccountant(spec, max(1, survivors), cfg.delta),
                                public_rotation(randomness.seed),
                                lambda rnd, client: randomness.generator(DISTRIBUTED_NOISE, rnd, client))
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
