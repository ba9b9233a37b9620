"""The update codec under SecAgg+: what a client's upload and calibration statistics become (one
masked vector of Z_{2^64}) and how the server reads their sum, on either side of Flower's messages.

FedAvg's mean is Σ_k n_k w_k / Σ_k n_k. Under secure aggregation the server sees only a sum, so
each client pre-weights its update with a coefficient it can compute itself, n_k / T, T the
clients' total training samples (every task carries it, from the census): client k sends
x_k = (n_k / T) · Δ_k, Δ_k = w_k − w̄ over every entry that travels (sorted by key, flattened,
integer buffers too), quantised and masked. The server unmasks Σ_k x_k over the clients whose
vectors arrived and returns w̄ + T · Σ_k x_k / Σ_k n_k — the weighted mean over those clients, the
plain mean's numerator over the same denominator, off by the quantisation alone: at most one grid
step 2R / levels per entry and client (stochastic rounding), times T / Σ_k n_k. The n_k are the
census's, known to the server anyway. The calibration statistics travel the same way
(:meth:`MaskingCodec.encode_statistics`), as sums divided by T: FFC's V_k, U_k (Σ_k V_k / T is the
mean of z zᵀ over every training sample: entries within [−1, 1] for normalised features) and
CCVR's per-class sums (N_kc, Σ z, Σ zzᵀ over client k's samples of class c: each entry over T within
n_k / T · max(1, ‖z‖²), the same range), and come back as their sums over the clients.

Under distributed DP (``privacy.distributed = "skellam"``, :mod:`fedlatent.federated.distributed_dp`)
the message before the mask is already one integer vector v_k of Z_{2^b}: the client's clipped,
rotated, conditionally rounded update plus its Skellam share. It is masked as it is, in Z_{2^b}
(:class:`IntegerMaskLink`: no pre-weighting, no second quantisation) — the SecAgg+ masks of Z_{2^64}
reduced modulo 2^b, which divides 2^64: a uniform mask of Z_{2^64} is uniform in Z_{2^b} too, and
every identity the protocol rests on (pairwise masks cancel, the server takes off the rest) holds
after the reduction, a ring homomorphism. The server's unmasked sum reduced modulo 2^b is then
Σ_k v_k mod 2^b, the very sum the embedded backends' modular combiner takes, and the distributed
DP decoding and the fixed denominator m follow (:class:`UnmaskedModularSum`,
:class:`~fedlatent.federated.codec.FixedDenominator`): clients weighted alike, as distributed DP's
sensitivity bound needs, so that a seeded run's weights are the embedded run's. The fewest vectors
such a sum may hold is the accountant's worst case (``survivors``): a sum of fewer stops the run.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np
import torch

from fedlatent.backends.flower.secagg import Party, dequantize, quantize
from fedlatent.errors import RunStopped
from fedlatent.federated.codec import DistributedCodec, FixedDenominator, UpdateCodec
from fedlatent.federated.codec_chain import Chain, Combiner, EncodeContext, EncodeLink, Finisher, RoundContext, UpdateSum
from fedlatent.federated.distributed_dp import MESSAGE, ModularSum, SkellamAccountant, SkellamShare, unweighted
from fedlatent.methods.parts import Tensors, Upload
from fedlatent.seeding import SECAGG_STATISTICS, SECAGG_UPDATES, derive_seed

VECTOR = "secagg"  # the one entry of a masked message
Layout = list[tuple[str, tuple[int, ...]]]  # the entries of a masked vector, in order, with their shapes


def layout(template: Tensors, withheld: Collection[str] = ()) -> Layout:
    """The entries of ``template`` a masked vector holds, sorted by key (the same on either side of
    the messages, whatever order a state's keys come in), without the ``withheld`` ones."""
    return [(key, tuple(template[key].shape)) for key in sorted(template) if key not in withheld]


def flatten(values: Tensors, entries: Layout) -> np.ndarray:
    """The ``entries`` of ``values`` as one float64 vector."""
    if not entries:
        return np.zeros(0)
    return np.concatenate([values[key].detach().cpu().double().numpy().ravel() for key, _ in entries])


def unflatten(vector: np.ndarray, entries: Layout) -> Tensors:
    out, start = {}, 0
    for key, shape in entries:
        size = int(np.prod(shape, dtype=np.int64))
        out[key] = torch.from_numpy(vector[start:start + size].reshape(shape).copy())
        start += size
    return out


STREAMS = {"update": SECAGG_UPDATES, "statistics": SECAGG_STATISTICS}  # the rounding's seed streams


def rounding(seed: int, kind: str, index: int, client: int) -> np.random.Generator:
    """A client's stochastic rounding in a session of ``kind`` ("update": ``index`` the round;
    "statistics"): its own stream (seed, SECAGG_*, index, client), so that secure aggregation
    changes no other draw of the run."""
    return np.random.default_rng(derive_seed(seed, STREAMS[kind], index, client))


@dataclass
class Masking:
    """A client's stage 2: its party, the session, the shares its neighbours sent, the quantisation
    of its ``kind`` of values ("update", "statistics": range ``bound``, ``levels``, the rounding's ``rng``)."""

    kind: str
    party: Party
    session: str
    ciphertexts: dict[int, bytes]
    bound: float
    levels: int
    rng: np.random.Generator

    def vector(self, values: np.ndarray) -> torch.Tensor:
        """``values`` quantised and masked, as the int64 tensor that travels; one outside the range
        fails the client, naming the setting."""
        try:
            quantized = quantize(values, self.bound, self.levels, self.rng)
        except ValueError as exc:
            raise ValueError(f"SecAgg+: {exc} (privacy.secagg_{self.kind}_range)") from None
        return torch.from_numpy(self.masked(quantized).view(np.int64))

    def masked(self, integers: np.ndarray) -> np.ndarray:
        """``integers`` (uint64) with the party's masks added, in Z_{2^64}."""
        return self.party.mask(self.session, self.ciphertexts, integers)


class MaskLink(EncodeLink):
    """The chain's last client link under SecAgg+: the pre-weighted update x = (n_k / ``total_samples``)
    · (m_k − w̄) of the message so far, as one masked vector; the calibration statistics, every entry
    (sorted by key, flattened) divided by ``total_samples`` and masked likewise."""

    stage = "mask"

    def __init__(self, masking: Masking, total_samples: int) -> None:
        self.masking, self.total_samples = masking, total_samples

    def encode(self, message: Upload, ctx: EncodeContext) -> Upload:
        entries = layout(ctx.reference, ctx.withheld)
        delta = flatten(message.state, entries) - flatten(ctx.reference, entries)
        vector = self.masking.vector(delta * (message.num_samples / self.total_samples))
        return dataclasses.replace(message, state={VECTOR: vector})

    def encode_statistics(self, statistics: Tensors) -> Tensors:
        return {VECTOR: self.masking.vector(flatten(statistics, layout(statistics)) / self.total_samples)}


class IntegerMaskLink(MaskLink):
    """Under distributed DP, the chain's last client link: the Skellam share's vector of Z_{2^b}
    (``modulus`` 2^b) masked as it is and reduced modulo 2^b (the module's docstring)."""

    def __init__(self, masking: Masking, total_samples: int, modulus: int) -> None:
        super().__init__(masking, total_samples)
        self.modulus = modulus

    def encode(self, message: Upload, ctx: EncodeContext) -> Upload:
        vector = message.state[MESSAGE].numpy().astype(np.uint64)
        masked = self.masking.masked(vector) & np.uint64(self.modulus - 1)
        return dataclasses.replace(message, state={VECTOR: torch.from_numpy(masked.view(np.int64))})


class MaskingCodec(UpdateCodec):
    """A client's side under SecAgg+: its ``inner`` codec's links (the clip where ``clip_norm`` asks),
    then the mask (:class:`MaskLink`); its calibration statistics as sums (CCVR's per-class sums,
    not moments), clipped by the inner links where ``statistics_clip_norm`` asks, then masked. Under
    distributed DP the inner links, the client's Skellam ``share``, then the mask of its integer
    vector (:class:`IntegerMaskLink`)."""

    name = "secaggplus"

    def __init__(self, inner: UpdateCodec, masking: Masking, total_samples: int,
                 share: SkellamShare | None = None) -> None:
        self.inner, self.masking, self.total_samples = inner, masking, total_samples
        last: list[EncodeLink] = [MaskLink(masking, total_samples)] if share is None else \
            [share, IntegerMaskLink(masking, total_samples, share.spec.modulus)]
        super().__init__(Chain([*inner.chain.encoders, *last]))


@dataclass
class Unmasking:
    """What the server needs to read one session's sum: the clients whose vectors it adds (in id
    order), the masks left in that sum (:func:`~.secagg.mask_total`), the entries and their range,
    and T, the divisor each client applied."""

    clients: list[int]
    mask: np.ndarray
    entries: Layout
    bound: float
    scale: float


Unmask = Callable[[list[int] | None], Unmasking]  # stage 3 for these clients' vectors (None: all that arrived)


class UnmaskedSum(Combiner):
    """The server chain's combiner under SecAgg+: the sum of a session's masked vectors, unmasked by
    the protocol's last stage (``pending``: the unmasking of the next "update" or "statistics"
    session, its per-round server state), read as T · Σ_k x_k by entry."""

    reads_sums = True
    def __init__(self, levels: int) -> None:
        self.levels = levels
        self.pending: dict[str, Unmask] = {}

    def summed(self, kind: str, clients: list[int] | None, vectors: list[torch.Tensor]) -> Tensors:
        """T · Σ_k x_k, by entry (float64), from the masked ``vectors`` of ``clients`` (None: of every
        client whose vector arrived, in id order)."""
        total, u = self.unmasked(kind, clients, vectors)
        return unflatten(dequantize(total, u.bound, self.levels) * u.scale, u.entries)

    def unmasked(self, kind: str, clients: list[int] | None, vectors: list[torch.Tensor]) -> tuple[np.ndarray, Unmasking]:
        """The sum of the masked ``vectors`` of ``clients`` with the masks taken off (uint64: the sum of
        what they masked, in Z_{2^64}), and the session's :class:`Unmasking`."""
        unmask = self.pending.pop(kind, None)
        if unmask is None:
            raise ValueError(f"SecAgg+: asked to combine {kind}s that no session of the protocol can unmask")
        u = unmask(clients)
        if len(u.clients) != len(vectors):
            raise ValueError(f"SecAgg+: asked to combine {len(vectors)} {kind}s, but the protocol unmasks the sum of "
                             f"clients {u.clients}")
        return np.sum([v.numpy().view(np.uint64) for v in vectors], axis=0, dtype=np.uint64) - u.mask, u

    def combine(self, messages: list[Upload], keys: list[str] | None, weights: list[float] | None,
                rc: RoundContext) -> UpdateSum:
        if weights is not None:
            raise ValueError("SecAgg+ sums updates the clients weighted themselves; a combine with weights of "
                             "its own (FedNova's, FedDyn's) cannot be taken")
        sums = self.summed("update", [m.client_id for m in messages], [m.state[VECTOR] for m in messages])
        order = list(rc.reference if keys is None else keys)
        return UpdateSum(sums, order, len(messages), sum(m.num_samples for m in messages))

    def total(self, statistics: list[Tensors]) -> Tensors:
        """Σ_k of the clients' statistics, from their masked vectors (in client-id order, as the
        protocol's clients are)."""
        return self.summed("statistics", None, [s[VECTOR] for s in statistics])


class UnmaskedModularSum(UnmaskedSum):
    """The server chain's combiner under SecAgg+ and distributed DP: the unmasked sum modulo 2^b, read
    by the distributed DP decoding (``modular``'s: centred, times γ, rotated back); a sum of fewer
    than ``survivors`` vectors (the accountant's worst case) stops the run."""

    def __init__(self, levels: int, modular: ModularSum, survivors: int) -> None:
        super().__init__(levels)
        self.modular, self.survivors = modular, survivors

    def combine(self, messages: list[Upload], keys: list[str] | None, weights: list[float] | None,
                rc: RoundContext) -> UpdateSum:
        unweighted(weights)
        if len(messages) < self.survivors:
            raise RunStopped(f"round {rc.rnd + 1}: distributed DP: {len(messages)} client(s) in the sum, fewer than the "
                             f"{self.survivors} whose noise shares the reported epsilon counts on (max of "
                             "train.min_clients and privacy.secagg_threshold)", rc.rnd)
        total, _ = self.unmasked("update", [m.client_id for m in messages], [m.state[VECTOR] for m in messages])
        modulus = np.uint64(self.modular.spec.modulus - 1)
        return self.modular.decode(torch.from_numpy((total & modulus).view(np.int64)), keys, len(messages),
                                   sum(m.num_samples for m in messages), rc)


class SampleMean(Finisher):
    """w̄ + S / Σ_k n_k over the clients summed (integer entries rounded), each entry back in its dtype;
    an entry without a sum is the reference's."""

    def finish(self, total: UpdateSum, rc: RoundContext) -> Tensors:
        out: Tensors = {}
        for key in total.order:
            ref = rc.reference[key]
            if key not in total.sums:
                out[key] = ref
                continue
            value = ref.double() + (total.sums[key] / total.samples).to(ref.device)
            out[key] = (value if ref.is_floating_point() else value.round()).to(ref.dtype)
        return out


class UnmaskingCodec(UpdateCodec):
    """The server's side under SecAgg+: the unmasking combiner (:class:`UnmaskedSum`: run for the clients
    whose vectors the server combines, those the failure policy kept) and the sample-mean finisher —
    the weighted mean of the updates (:meth:`round_combine`) or the sums of FFC's statistics and
    CCVR's per-class sums (:meth:`total`) are all it reads."""

    name = "secaggplus"

    def __init__(self, levels: int, unmask: UnmaskedSum | None = None, finisher: Finisher | None = None) -> None:
        self.unmask = unmask or UnmaskedSum(levels)
        self.levels, self.pending = levels, self.unmask.pending
        super().__init__(Chain(combiner=self.unmask, finisher=finisher or SampleMean()))

    def expect(self, kind: str, unmask: Unmask) -> None:
        """The next ``kind`` ("update" or "statistics") of messages to combine is read with what
        ``unmask`` returns for their clients."""
        self.pending[kind] = unmask


class DistributedUnmaskingCodec(UnmaskingCodec):
    """The server's side under SecAgg+ and distributed DP: the unmasked modular sum
    (:class:`UnmaskedModularSum`) and ``codec``'s fixed denominator w̄ + S/m; ε from the Skellam
    accountant at ``survivors`` clients a round (the fewest the run lets a sum hold)."""

    name = "secaggplus-distributed-skellam"

    def __init__(self, levels: int, codec: DistributedCodec, survivors: int) -> None:
        self.distributed, self.survivors = codec, survivors
        self.accountant = SkellamAccountant(codec.spec, survivors, codec.accountant.delta)
        super().__init__(levels, UnmaskedModularSum(levels, codec.modular, survivors),
                         FixedDenominator(codec.spec.per_round))

    def epsilon(self, rounds: int, releases: int = 0) -> float | None:
        dimension = self.distributed.modular.dimension
        return 0.0 if dimension is None else self.accountant.epsilon(rounds, dimension)
