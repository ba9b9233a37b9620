"""FedProto (Tan et al. 2022): class prototypes (mean z per class) exchanged; loss += λ·‖z − p̄_y‖².

Clients accumulate the prototypes from every training batch of the round (as the release does,
rather than an extra pass after training) and upload per-class sums and counts; the server's
global prototype is the count-weighted mean. Difference from the paper: fedlatent still
aggregates the model weights with the base rule (FedAvg), so the prototypes regularise a global
model; the paper's FedProto keeps every client's model local. ``semantics = "official"`` (default)
is the release's MSELoss (mean over the batch and the d dimensions); "paper" sums over d.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedlatent.losses.contrastive import prototype_distance
from fedlatent.methods.parts import ClientRound, LockstepContext, MethodSpec, Part, Tensors, Upload
from fedlatent.methods.registry import register_part, register_preset

PROTO, PRESENT = "fedproto.prototypes", "fedproto.present"


class _Prototypes:
    """One client's round: per-class sums of z (float64) and counts over its training batches, kept
    on the training device (a step adds to them without a copy to the host; the upload reads them
    once, at the round's end), and the global prototypes it received, moved there once."""

    def __init__(self) -> None:
        self.sums: Tensor | None = None
        self.counts: Tensor | None = None
        self.received: tuple[Tensor | None, Tensor, Tensor] | None = None  # (what was sent, on the device)

    def add(self, z: Tensor, y: Tensor, num_classes: int) -> None:
        if self.sums is None or self.counts is None:
            self.sums = torch.zeros(num_classes, z.shape[1], dtype=torch.float64, device=z.device)
            self.counts = torch.zeros(num_classes, dtype=torch.float64, device=z.device)
        self.sums.index_add_(0, y, z.detach().double())
        self.counts.index_add_(0, y, torch.ones(len(y), dtype=torch.float64, device=z.device))

    def prototypes(self, payload: Tensors, like: Tensor, device: torch.device) -> tuple[Tensor, Tensor]:
        """The global prototypes of ``payload`` and which classes have one, on ``device``, moved
        there once (none yet: no class present; ``like``: a received set, for the shapes)."""
        sent = payload.get(PROTO)
        if self.received is None or self.received[0] is not sent:
            if sent is not None:
                self.received = sent, sent.to(device), payload[PRESENT].to(device)
            else:
                self.received = None, torch.zeros(like.shape, dtype=like.dtype, device=device), \
                    torch.zeros(len(like), dtype=torch.bool, device=device)
        return self.received[1], self.received[2]

    def extras(self) -> Tensors | None:
        if self.sums is None or self.counts is None:
            return None
        return {"sums": self.sums.to("cpu"), "counts": self.counts.to("cpu")}


class FedProto(Part):
    name = "fedproto"

    def __init__(self, lam: float, semantics: str) -> None:
        self.weight, self.semantics = lam, semantics

    def begin(self, rc: ClientRound) -> None:
        rc.scratch[self.name] = _Prototypes()

    def lockstep_loss(self, ctx: LockstepContext) -> Tensor | None:
        """Each client's sums from its rows of the group; the distance to its global prototypes per
        client under ``vmap`` — one set for the clients of one run, each run's own for the clients
        of stacked runs (:mod:`fedlatent.backends.stacked`), whose payloads differ."""
        z, y = ctx.out.z, ctx.y
        rounds = [rc.scratch[self.name] for rc in ctx.rcs]
        for i, own in enumerate(rounds):
            own.add(z[i], y[i], ctx.num_classes)
        payloads = [rc.payload for rc in ctx.rcs]
        if not any(PROTO in p for p in payloads):
            return None
        def distance(zc: Tensor, yc: Tensor, protos: Tensor, present: Tensor) -> Tensor:
            return prototype_distance(zc, yc, protos, present, semantics=self.semantics)
        sent = next(p for p in payloads if PROTO in p)[PROTO]
        if all(p.get(PROTO) is sent for p in payloads):  # one run: one set of prototypes
            protos, present = rounds[0].prototypes(payloads[0], sent, z.device)
            return torch.vmap(distance, in_dims=(0, 0, None, None))(z, y, protos, present)
        # clients of stacked runs: each its own run's prototypes (none yet: no class present, a term of 0)
        received = [own.prototypes(p, sent, z.device) for own, p in zip(rounds, payloads)]
        protos = torch.stack([p for p, _ in received])
        present = torch.stack([q for _, q in received])
        return torch.vmap(distance)(z, y, protos, present)

    def finish(self, rc: ClientRound) -> Tensors | None:
        return rc.scratch[self.name].extras()

    def payload(self, server_state: Tensors) -> Tensors:
        return {k: server_state[k] for k in (PROTO, PRESENT) if k in server_state}

    def server_update(self, uploads: list[Upload], server_state: Tensors, num_clients: int) -> None:
        sent = [u.extras[self.name] for u in uploads if self.name in u.extras]
        if not sent:
            return
        sums = sum(e["sums"] for e in sent)
        counts = sum(e["counts"] for e in sent)
        server_state[PROTO] = (sums / counts.clamp_min(1).unsqueeze(1)).float()
        server_state[PRESENT] = counts > 0


@register_part("fedproto", lam=1.0, semantics="official")
def fedproto_part(opts: dict[str, Any]) -> Part:
    """FedProto prototype term (λ) and prototype exchange."""
    return FedProto(opts["lam"], opts["semantics"])


@register_preset("fedproto", lam=1.0, semantics="official")
def fedproto(opts: dict[str, Any]) -> MethodSpec:
    """FedProto: prototype exchange + λ‖z − p̄_y‖² (λ = 1) on top of FedAvg."""
    return MethodSpec("fedproto", parts=[FedProto(opts["lam"], opts["semantics"])])
