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
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np
import torch

from fedlatent.backends.flower.secagg import Party, dequantize, quantize
from fedlatent.federated.codec import UpdateCodec
from fedlatent.methods.parts import Combine, Tensors, Upload
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
        return torch.from_numpy(self.party.mask(self.session, self.ciphertexts, quantized).view(np.int64))


class MaskingCodec(UpdateCodec):
    """A client's side under SecAgg+: its ``inner`` codec's message (clipped where ``clip_norm`` asks),
    then the pre-weighted update x = (n_k / ``total_samples``) · (w_k − w̄) as one masked vector; its
    calibration statistics, as sums (CCVR's per-class sums, not moments), divided by ``total_samples``
    and masked likewise."""

    name = "secaggplus"
    statistics_as_sums = True  # the server reads their sum alone

    def __init__(self, inner: UpdateCodec, masking: Masking, total_samples: int) -> None:
        self.inner, self.masking, self.total_samples = inner, masking, total_samples

    def encode(self, upload: Upload, reference: Tensors, withheld: Collection[str], payload: Tensors) -> Upload:
        upload = self.inner.encode(upload, reference, withheld, payload)
        entries = layout(reference, withheld)
        delta = flatten(upload.state, entries) - flatten(reference, entries)
        vector = self.masking.vector(delta * (upload.num_samples / self.total_samples))
        return dataclasses.replace(upload, state={VECTOR: vector})

    def encode_statistics(self, statistics: Tensors) -> Tensors:
        """The ``inner`` codec's statistics (clipped where ``statistics_clip_norm`` asks), every entry
        (sorted by key, flattened) divided by T and masked: one vector."""
        statistics = self.inner.encode_statistics(statistics)
        return {VECTOR: self.masking.vector(flatten(statistics, layout(statistics)) / self.total_samples)}


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


class UnmaskingCodec(UpdateCodec):
    """The server's side under SecAgg+: the sum of a session's masked vectors, unmasked by the
    protocol's last stage (:meth:`expect`: run for the clients whose vectors the server combines, those
    the failure policy kept), is all it reads — the weighted mean of the updates
    (:meth:`round_combine`) or the sums of FFC's statistics and CCVR's per-class sums (:meth:`total`)."""

    name = "secaggplus"
    statistics_as_sums = True

    def __init__(self, levels: int) -> None:
        self.levels = levels
        self.pending: dict[str, Unmask] = {}

    def expect(self, kind: str, unmask: Unmask) -> None:
        """The next ``kind`` ("update" or "statistics") of messages to combine is read with what
        ``unmask`` returns for their clients."""
        self.pending[kind] = unmask

    def _sum(self, kind: str, clients: list[int] | None, vectors: list[torch.Tensor]) -> Tensors:
        """T · Σ_k x_k, by entry (float64), from the masked ``vectors`` of ``clients`` (None: of every
        client whose vector arrived, in id order)."""
        unmask = self.pending.pop(kind, None)
        if unmask is None:
            raise ValueError(f"SecAgg+: asked to combine {kind}s that no session of the protocol can unmask")
        u = unmask(clients)
        if len(u.clients) != len(vectors):
            raise ValueError(f"SecAgg+: asked to combine {len(vectors)} {kind}s, but the protocol unmasks the sum of "
                             f"clients {u.clients}")
        total = np.sum([v.numpy().view(np.uint64) for v in vectors], axis=0, dtype=np.uint64) - u.mask
        return unflatten(dequantize(total, u.bound, self.levels) * u.scale, u.entries)

    def combine(self, messages: list[Upload], keys: list[str] | None = None,
                weights: list[float] | None = None) -> Tensors:
        """Refused: the mean needs the round's reference (:meth:`round_combine`)."""
        raise TypeError("UnmaskingCodec combines a round's messages through round_combine(rnd, reference, withheld)")

    def round_combine(self, rnd: int, reference: Tensors, withheld: Collection[str], state: Tensors) -> Combine:
        def combine(messages: list[Upload], keys: list[str] | None = None,
                    weights: list[float] | None = None) -> Tensors:
            if weights is not None:
                raise ValueError("SecAgg+ sums updates the clients weighted themselves; a combine with weights of "
                                 "its own (FedNova's, FedDyn's) cannot be taken")
            summed = self._sum("update", [m.client_id for m in messages], [m.state[VECTOR] for m in messages])
            samples = sum(m.num_samples for m in messages)
            out: Tensors = {}
            for key in reference if keys is None else keys:
                ref = reference[key]
                if key not in summed:
                    out[key] = ref
                    continue
                value = ref.double() + (summed[key] / samples).to(ref.device)
                out[key] = (value if ref.is_floating_point() else value.round()).to(ref.dtype)
            return out
        return combine

    def total(self, statistics: list[Tensors], release: int) -> Tensors:
        """Σ_k of the clients' statistics, from their masked vectors (in client-id order, as the
        protocol's clients are)."""
        return self._sum("statistics", None, [s[VECTOR] for s in statistics])
