"""The update codec's chain (:mod:`fedlatent.federated.codec`): the links' contracts — a client's
encode link, the server's combiner, links on the sum, finisher and server-state links — the round's
context they are bound to, the plain weighted mean, and the chain that checks their order."""
from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import torch

from fedlatent.methods.aggregation import weighted_mean
from fedlatent.methods.parts import Tensors, Upload

STAGES = ("clip", "compress", "noise", "mask")  # the encode links' declared order on the client
CODED_BYTES = "codec_bytes_up"  # an upload's metric: the bytes its message takes when a link codes it smaller


@dataclass
class EncodeContext:
    """What an encode link sees beside the message: the round's global state the client started
    from (``reference``), the entries that never travel (``withheld``), the round's ``payload``, and
    the client's own new state (``client_state``: a link's per-client state lives there under
    ``codec.<link>.``; None where the backend keeps none for it) and the round ``rnd`` (0-based)."""

    reference: Tensors
    withheld: Collection[str]
    payload: Tensors
    client_state: Tensors | None = None
    rnd: int = 0


class EncodeLink:
    """One step of the client's encoding, at ``stage`` (one of :data:`STAGES`)."""

    stage: str = ""
    statistics_bound: float | None = None  # the bound this link clips the statistics to (None: none)

    def encode(self, message: Upload, ctx: EncodeContext) -> Upload:
        """The message after this link; ``message`` itself when the link leaves it as it is."""
        return message

    def encode_statistics(self, statistics: Tensors) -> Tensors:
        """The calibration statistics after this link; ``statistics`` itself by default."""
        return statistics


def coded_keys(message: Upload, withheld: Collection[str]) -> list[str]:
    """The entries of ``message`` an update link codes: every floating-point entry that travels."""
    return [k for k, v in message.state.items() if k not in withheld and v.is_floating_point()]


@dataclass
class RoundContext:
    """What round ``rnd``'s server links are bound to: the ``reference`` its clients started from,
    the ``withheld`` entries, the server ``state`` as the round began and the round's clip ``bound``
    (∞ without one)."""

    rnd: int
    reference: Tensors
    withheld: Collection[str]
    state: Tensors
    bound: float = math.inf


@dataclass
class UpdateSum:
    """A combiner's sum over the messages: ``sums`` the float64 Σ of the coded entries' updates (what a
    :class:`SumLink` acts on); ``order`` every key of the result in its order (an entry without a
    sum is the reference's); ``count`` the messages, ``samples`` their Σ n_k."""

    sums: Tensors
    order: list[str]
    count: int
    samples: int


class Combiner:
    """The server chain's first link: the messages combined, into the final states (a terminal
    combiner, the plain mean) or into an :class:`UpdateSum` for the links after it."""

    terminal = False
    reads_sums = False  # whether it reads the statistics' sum alone (secure aggregation): CCVR's clients send sums

    def combine(self, messages: list[Upload], keys: list[str] | None, weights: list[float] | None,
                rc: RoundContext) -> Tensors | UpdateSum:
        raise NotImplementedError

    def total(self, statistics: list[Tensors]) -> Tensors:
        """The clients' statistics summed entry by entry, in the order given, as one stacked sum
        (what :func:`~fedlatent.calibration.ffc.ffc_solve` sums)."""
        return {key: torch.stack([s[key] for s in statistics]).sum(0) for key in statistics[0]}


class WeightedMean(Combiner):
    """Σ_k c_k · m_k of the messages' states over ``keys`` (all: None), c_k the sample shares
    n_k / Σn or the ``weights`` given (FedNova's p_k / a_k, FedDyn's 1/K): the contract of
    :func:`~fedlatent.methods.aggregation.weighted_mean`, which the plain codec is."""

    terminal = True

    def combine(self, messages: list[Upload], keys: list[str] | None, weights: list[float] | None,
                rc: RoundContext) -> Tensors:
        return weighted_mean(messages, keys, weights)


class SumLink:
    """A link on the combined sum: ``apply`` to the round's updates' sum (in its entries' order),
    ``statistics`` to the calibration statistics' (release ``release``)."""

    def apply(self, total: UpdateSum, rc: RoundContext) -> UpdateSum:
        return total

    def statistics(self, summed: Tensors, release: int) -> Tensors:
        return summed


class Finisher:
    """The server chain's last link: the new global state from the (linked) sum."""

    def finish(self, total: UpdateSum, rc: RoundContext) -> Tensors:
        raise NotImplementedError


class ServerStateLink:
    """A server link with state of its own across rounds, in ``Server.state`` (checkpointed with the
    parts'): what it sends the clients with the global model, its fields of the round's metrics
    line, the round's clip bound, and its move after each aggregation."""

    def payload(self, state: Tensors) -> Tensors:
        return {}

    def round_metrics(self, state: Tensors) -> dict[str, float]:
        return {}

    def bound(self, state: Tensors) -> float | None:
        return None

    def server_update(self, rnd: int, uploads: list[Upload], state: Tensors) -> None:
        """After round ``rnd``'s aggregation, from the ``uploads``."""


@dataclass
class Chain:
    """The links of one codec: the client's ``encoders`` (in :data:`STAGES` order), the server's
    ``combiner``, ``sum_links`` and ``finisher`` (None with a terminal combiner), and the
    ``server_state`` links."""

    encoders: Sequence[EncodeLink] = ()
    combiner: Combiner = field(default_factory=WeightedMean)
    sum_links: Sequence[SumLink] = ()
    finisher: Finisher | None = None
    server_state: Sequence[ServerStateLink] = ()

    def __post_init__(self) -> None:
        stages = [link.stage for link in self.encoders]
        if any(s not in STAGES for s in stages) or stages != sorted(stages, key=STAGES.index) \
                or len(set(stages)) != len(stages):
            raise ValueError(f"a codec's encode links run once each in the order {' → '.join(STAGES)}; got {stages}")
        if self.combiner.terminal != (self.finisher is None) or (self.combiner.terminal and self.sum_links):
            raise ValueError("a terminal combiner (the weighted mean) takes no sum links and no finisher; "
                             "any other needs a finisher")
