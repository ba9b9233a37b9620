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
    """One client's round: per-class sums of z (float64) and counts over its training batches."""

    def __init__(self) -> None:
        self.sums: Tensor | None = None
        self.counts: Tensor | None = None

    def add(self, z: Tensor, y: Tensor, num_classes: int) -> None:
        if self.sums is None:
            self.sums = torch.zeros(num_classes, z.shape[1], dtype=torch.float64)
            self.counts = torch.zeros(num_classes, dtype=torch.float64)
        self.sums.index_add_(0, y.cpu(), z.detach().cpu().double())
        self.counts.index_add_(0, y.cpu(), torch.ones(len(y), dtype=torch.float64))

    def extras(self) -> Tensors | None:
        return None if self.sums is None else {"sums": self.sums, "counts": self.counts}


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
        for i, rc in enumerate(ctx.rcs):
            rc.scratch[self.name].add(z[i], y[i], ctx.num_classes)
        payloads = [rc.payload for rc in ctx.rcs]
        if not any(PROTO in p for p in payloads):
            return None
        def distance(zc: Tensor, yc: Tensor, protos: Tensor, present: Tensor) -> Tensor:
            return prototype_distance(zc, yc, protos, present, semantics=self.semantics)
        if all(p.get(PROTO) is payloads[0].get(PROTO) for p in payloads):  # one run: one set of prototypes
            protos, present = payloads[0][PROTO].to(z.device), payloads[0][PRESENT].to(z.device)
            return torch.vmap(distance, in_dims=(0, 0, None, None))(z, y, protos, present)
        # clients of stacked runs: each its own run's prototypes (none yet: no class present, a term of 0)
        sent = next(p for p in payloads if PROTO in p)
        protos = torch.stack([p.get(PROTO, torch.zeros_like(sent[PROTO])) for p in payloads]).to(z.device)
        present = torch.stack([p.get(PRESENT, torch.zeros_like(sent[PRESENT])) for p in payloads]).to(z.device)
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
