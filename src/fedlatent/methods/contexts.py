"""What the hooks of a method's parts and programs read and return: a loss term's context (one
client's batch, :class:`TermContext`, or a group's with a leading client axis, :class:`LockstepContext`,
one derived from the other by :func:`one_client` and :func:`vmap_loss`), a client's round
(:class:`ClientRound`) and what it sends back (:class:`Upload`). Below :mod:`fedlatent.methods.spec`,
whose types take them; it imports nothing of ``methods/``."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from fedlatent.models.base import FedModel, ModelOutput

Tensors = dict[str, Tensor]
# the server's weighted sum of the uploads' states over some keys, with some coefficients (None: all
# keys, the sample shares): the update codec's ``combine`` (federated.codec), by default the plain
# ``methods.aggregation.weighted_mean``
Combine = Callable[[list["Upload"], "list[str] | None", "list[float] | None"], Tensors]


@dataclass
class TermContext:
    """What a loss term may read for one mini-batch: tensors, and the client's round-scoped
    ``scratch`` (:attr:`ClientRound.scratch`), the one thing a term may mutate."""

    out: ModelOutput
    y: Tensor
    params: dict[str, Tensor]
    global_params: dict[str, Tensor]
    global_out: ModelOutput | None
    prev_out: ModelOutput | None
    num_classes: int
    state: Tensors
    payload: Tensors
    scratch: dict[str, Any] = field(default_factory=dict)
    rc: "ClientRound | None" = None  # the client's round (its stores are the three above)


@dataclass
class LockstepContext:
    """What a loss term may read for a group of clients trained at once (the vectorized backend):
    outputs and labels with a leading client axis, the stacked weights being trained, the round's
    global weights (no client axis) and the clients' rounds in the same order (their ``scratch``);
    the previous local models' outputs where some client has one, ``prev_present`` marking which
    (None: every client has one)."""

    out: ModelOutput
    y: Tensor
    params: Mapping[str, Tensor]
    global_params: dict[str, Tensor]
    global_out: ModelOutput | None
    num_classes: int
    rcs: list["ClientRound"]
    prev_out: ModelOutput | None = None
    prev_present: Tensor | None = None


@dataclass
class ClientRound:
    """One client's round as the hooks see it: the model being trained, its stores and settings.

    ``scratch`` holds round-scoped working data keyed by part name (SCAFFOLD's corrections,
    FedProto's running sums, the MMD windows and kernels): filled from :meth:`Part.begin`,
    discarded after :meth:`Part.finish`, never checkpointed, so that a part object holds only
    its configuration and one client's round never sees another's."""

    client_id: int
    model: FedModel
    global_params: dict[str, Tensor]
    state: Tensors
    payload: Tensors
    lr: float
    num_samples: int
    num_clients: int
    total_samples: int  # Σ training samples over all clients, from the census the task carries
    momentum: float
    steps: int = 0
    extra_weight_decay: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    seed: int = 0  # the client's stream seed (the run seed when seeded): derive_seed(seed, PURPOSE, client, …)
    scratch: dict[str, Any] = field(default_factory=dict)
    round: int = 0  # the round (0-based), for draws seeded by it (sample-level DP-SGD's noise)


@dataclass
class Upload:
    """What one client sends back: its weights, sample count, local steps and each part's extras."""

    client_id: int
    state: Tensors
    num_samples: int
    steps: int
    lr: float
    momentum: float
    extras: dict[str, Tensors] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    trace: list[dict[str, float]] = field(default_factory=list)  # per local step, when the spec asks


def _with_client_axis(out: ModelOutput | None) -> ModelOutput | None:
    if out is None:
        return None
    return ModelOutput(out.logits.unsqueeze(0), out.z.unsqueeze(0),
                       {k: v.unsqueeze(0) for k, v in out.features.items()})


class WithClientAxis(Mapping[str, Tensor]):
    """One client's weights as a group of one: each a view with a leading axis of 1, made when a
    term reads it (most terms read none)."""

    def __init__(self, params: dict[str, Tensor]) -> None:
        self.params = params

    def __getitem__(self, name: str) -> Tensor:
        return self.params[name].unsqueeze(0)

    def __iter__(self) -> Iterator[str]:
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)


def one_client(ctx: TermContext) -> LockstepContext:
    """``ctx`` as a group of one client: outputs, labels and the weights being trained with a
    leading client axis of 1 (views: gradients flow to the client's weights), the round's global
    weights as they are (a lockstep term broadcasts them), and the client's round: ``ctx.rc``, or
    where a context carries none, a round holding just the context's stores (``state``,
    ``payload``, ``scratch``: all a term reads of it); a previous local model's output, where
    there is one, as the client's (``prev_present`` None)."""
    rc = ctx.rc or ClientRound(-1, None, ctx.global_params, ctx.state, ctx.payload, 0.0, len(ctx.y), 1, len(ctx.y),
                               0.0, scratch=ctx.scratch)
    return LockstepContext(_with_client_axis(ctx.out), ctx.y.unsqueeze(0),
                           WithClientAxis(ctx.params), ctx.global_params,
                           _with_client_axis(ctx.global_out), ctx.num_classes, [rc],
                           _with_client_axis(ctx.prev_out))


def vmap_loss(loss, ctx: LockstepContext) -> Tensor:
    """``loss(TermContext)`` per client of ``ctx`` with ``torch.vmap``; the TermContext carries the
    client's outputs, labels and ``num_classes`` only (weights, state and payload are empty)."""
    taps = tuple(ctx.out.features)
    g = ctx.global_out
    global_taps = tuple(g.features) if g is not None else ()

    def one(out_values: tuple, global_values: tuple, y: Tensor) -> Tensor:
        out = ModelOutput(out_values[0], out_values[1], dict(zip(taps, out_values[2:])))
        global_out = ModelOutput(global_values[0], global_values[1], dict(zip(global_taps, global_values[2:]))) \
            if global_values else None
        return loss(TermContext(out, y, {}, {}, global_out, None, ctx.num_classes, {}, {}))

    out_values = (ctx.out.logits, ctx.out.z, *ctx.out.features.values())
    global_values = (g.logits, g.z, *g.features.values()) if g is not None else ()
    return torch.vmap(one)(out_values, global_values, ctx.y)
