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
from fedlatent.methods.aggregation import weighted_mean
from fedlatent.methods.parts import Tensors, Upload


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


def build_codec(cfg: PrivacyConfig) -> UpdateCodec:
    """The codec ``[privacy]`` asks for: clipping at ``clip_norm``, or the plain codec (∞)."""
    return UpdateCodec() if math.isinf(cfg.clip_norm) else ClipCodec(cfg.clip_norm)
