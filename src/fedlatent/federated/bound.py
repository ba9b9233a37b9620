"""The server's check of the clip bound: what it sums has the sensitivity the accountant assumes.

Client-level DP-FedAvg's guarantee rests on each summed update having L2 norm at most C (McMahan
et al. 2018): the clip is the client's (:meth:`fedlatent.federated.codec.ClipCodec.encode`), so a
client that skips it — or adds 10⁴ to every weight — would move the sum as far as it likes and
void both the model and ε. The server therefore measures every message's update Δ = m − w̄ over the
entries the codec codes (floating-point, not withheld) before it aggregates, and one over C beyond
rounding is clipped again (``privacy.over_bound = "clip"``, Flower's server-side clipping) or left
out of the round (``"drop"``: a :class:`~fedlatent.federated.failures.ClientFailure` of kind
``"over_bound"``); the round's metrics line counts them (``privacy_over_bound``).

Rounding: the message is stored in its entries' dtype, so w̄ + clip(Δ) rounded moves each entry by
at most half an ulp, and ‖fl(x) − x‖ ≤ (ε_mach / 2)·‖x‖ over all entries; the slack allowed beyond C
is ε_mach·‖m‖ (twice that), below any change an attacker could make use of.

Under SecAgg+ the server sees only sums and cannot measure an individual update (its codec is not
a clipping one, so nothing is checked here): the clients' quantisation range bounds each entry, and
no range proof is made (see docs/privacy.md).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Collection

import torch

from fedlatent.federated.codec import clip, update_norm
from fedlatent.federated.failures import ClientFailure
from fedlatent.methods.parts import Tensors, Upload

CLIP, DROP = "clip", "drop"


def coded_delta(upload: Upload, reference: Tensors, withheld: Collection[str]) -> Tensors:
    """Δ = m − w̄ over the message's floating-point entries that travel, in float64."""
    return {k: v.double() - reference[k].to(v.device).double() for k, v in upload.state.items()
            if k not in withheld and v.is_floating_point()}


def slack(upload: Upload, withheld: Collection[str]) -> float:
    """The rounding the message's storage allows beyond C: ε_mach of its widest dtype times ‖m‖."""
    values = {k: v for k, v in upload.state.items() if k not in withheld and v.is_floating_point()}
    if not values:
        return 0.0
    eps = max(torch.finfo(v.dtype).eps for v in values.values())
    return eps * update_norm(values)


def enforce_bound(uploads: list[Upload], reference: Tensors, withheld: Collection[str], bound: float,
                  policy: str) -> tuple[list[Upload], list[ClientFailure], int]:
    """The ``uploads`` the server sums, each message's update within ``bound`` (C) beyond rounding:
    an update over it clipped to C (``policy`` "clip": the message w̄ + clip(Δ) in its dtype) or
    dropped ("drop"); returns the uploads kept, the drops and how many were over."""
    kept: list[Upload] = []
    dropped: list[ClientFailure] = []
    over = 0
    for upload in uploads:
        delta = coded_delta(upload, reference, withheld)
        norm = update_norm(delta)
        if norm <= bound + slack(upload, withheld):
            kept.append(upload)
            continue
        over += 1
        if policy == DROP:
            dropped.append(ClientFailure(upload.client_id, "over_bound",
                                         f"update norm {norm:.4g} over the clip norm {bound:g}"))
            continue
        clipped = clip(delta, bound, norm)
        kept.append(dataclasses.replace(upload, state={
            k: (reference[k].to(v.device).double() + clipped[k]).to(v.dtype) if k in clipped else v
            for k, v in upload.state.items()}))
    return kept, dropped, over
