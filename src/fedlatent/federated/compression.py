"""Top-k sparsification with error feedback, an encode link of the update codec
(:mod:`fedlatent.federated.codec_chain`, stage "compress"; ``[compression] kind = "topk"``).

Stich, Cordonnier and Jaggi 2018 ("Sparsified SGD with memory", Algorithm 1), applied to each
client's round update as in federated top-k (Sattler et al. 2019): client k keeps a residual e_k
(zero at first) and each round forms a = e_k + Δ_k, Δ_k = w_k − w̄ over every floating-point entry
that travels, all entries together; it sends top_k(a) — the k = ⌈fraction · d⌉ entries of largest
magnitude, the rest zero — and keeps e_k ← a − top_k(a), so that what it leaves out now is sent in
a later round instead of being lost (the residual identity a = top_k(a) + e_k holds exactly: the
two have disjoint supports). Without error feedback the rest is dropped (e_k stays zero).

The message is w̄ + top_k(a) (a state, as every codec sends; the server's mean is the plain one).
On the wire it is k values and k int32 indices (plus the entries the link leaves dense: integer
buffers), which the upload's :data:`~fedlatent.federated.codec_chain.CODED_BYTES` metric states and the
round's ``bytes_up`` counts. The residual lives in the client's state under ``codec.topk.`` — kept
and checkpointed with the client, never sent; a client the failure policy drops keeps its old one.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from fedlatent.config import CompressionConfig
from fedlatent.federated.codec_chain import CODED_BYTES, EncodeContext, EncodeLink, coded_keys
from fedlatent.methods.parts import Tensors, Upload

RESIDUAL = "codec.topk."  # the client-state prefix of the residual e_k, per entry
INDEX_BYTES = 4  # an int32 index per sent value


def compression_link(cfg: CompressionConfig | None) -> EncodeLink | None:
    """The link ``[compression]`` asks for, or None (``kind = "none"``)."""
    if cfg is None or cfg.kind == "none":
        return None
    return TopK(cfg.fraction, cfg.error_feedback)


def top_k(values: torch.Tensor, k: int) -> torch.Tensor:
    """``values`` (flat) with all but its ``k`` entries of largest magnitude set to zero."""
    kept = torch.zeros_like(values)
    if k:
        index = torch.topk(values.abs(), k, sorted=False).indices
        kept[index] = values[index]
    return kept


class TopK(EncodeLink):
    """Top-k of (residual + update) per client, with the residual kept in its state (``error_feedback``)."""

    stage = "compress"

    def __init__(self, fraction: float, error_feedback: bool = True) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"top-k's fraction must be in (0, 1], got {fraction}")
        self.fraction, self.error_feedback = fraction, error_feedback

    def encode(self, message: Upload, ctx: EncodeContext) -> Upload:
        if self.error_feedback and ctx.client_state is None:
            raise ValueError("top-k with error feedback keeps each client's residual in its state, which this "
                             "backend does not pass to the codec")
        keys = coded_keys(message, ctx.withheld)
        accumulated = []
        for key in keys:
            value = message.state[key]
            delta = value - ctx.reference[key].to(value.device)
            if self.error_feedback and RESIDUAL + key in ctx.client_state:  # type: ignore[operator]
                delta = delta + ctx.client_state[RESIDUAL + key].to(value.device, value.dtype)  # type: ignore[index]
            accumulated.append(delta.flatten())
        flat = torch.cat(accumulated) if accumulated else torch.zeros(0)
        k = math.ceil(self.fraction * flat.numel())
        sent = top_k(flat, k)
        state, start = dict(message.state), 0
        for key, part in zip(keys, accumulated):
            value = message.state[key]
            piece = sent[start:start + part.numel()].view(value.shape)
            state[key] = (ctx.reference[key].to(value.device) + piece).to(value.dtype)
            if self.error_feedback:
                ctx.client_state[RESIDUAL + key] = (part.view(value.shape) - piece).detach().cpu()  # type: ignore[index]
            start += part.numel()
        dense = sum(v.nbytes for key, v in message.state.items() if key not in ctx.withheld and key not in keys)
        coded = k * (flat.element_size() + INDEX_BYTES) + dense
        return dataclasses.replace(message, state=state, metrics={**message.metrics, CODED_BYTES: float(coded)})


def residual(state: Tensors) -> Tensors:
    """A client's kept residual e_k by entry (none before its first compressed round)."""
    return {key[len(RESIDUAL):]: value for key, value in state.items() if key.startswith(RESIDUAL)}
