"""The pieces a method is composed of (ARCHITECTURE.md, "How a method is composed").

A method is a :class:`MethodSpec`: a task loss, a list of :class:`Part` objects, a head policy,
an optional personalisation and an optional after-training calibration. A ``Part`` declares what
it needs (taps, the frozen global model's output, the previous local model's output, the round's
global weights) and implements only the hooks it uses; the client and server in
``federated/`` call the hooks, so methods never own a loop. Parts keep no per-client state on
themselves: state lives in flat ``dict[str, Tensor]`` stores the backend owns and checkpoints.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from fedlatent.models.base import FedModel, ModelOutput

Tensors = dict[str, Tensor]


@dataclass
class TermContext:
    """What a loss term may read for one mini-batch (tensors only, nothing to mutate)."""

    out: ModelOutput
    y: Tensor
    params: dict[str, Tensor]
    global_params: dict[str, Tensor]
    global_out: ModelOutput | None
    prev_out: ModelOutput | None
    num_classes: int
    state: Tensors
    payload: Tensors


@dataclass
class LockstepContext:
    """What a loss term may read for a group of clients trained at once (the vectorized backend):
    outputs and labels with a leading client axis, the stacked weights being trained, the round's
    global weights (no client axis) and the clients' rounds in the same order."""

    out: ModelOutput
    y: Tensor
    params: dict[str, Tensor]
    global_params: dict[str, Tensor]
    global_out: ModelOutput | None
    num_classes: int
    rcs: list["ClientRound"]


@dataclass
class ClientRound:
    """One client's round as the hooks see it: the model being trained, its stores and settings."""

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
    seed: int = 0  # the run's seed, for parts that draw (derive_seed(seed, PURPOSE, client, …))


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


class Part:
    """One composable piece of a method; every hook is optional.

    ``weight`` scales the value returned by :meth:`loss`. ``needs_global_out`` /
    ``needs_prev_out`` make the client run the frozen global / previous local model on the
    batch (MOON, feature-drift constraints); ``taps`` names intermediate features to return;
    ``needs_global_params`` keeps a snapshot of the round's global weights (FedProx, SCAFFOLD).
    ``output_only`` declares that :meth:`loss` reads nothing but ``ctx.out``, ``ctx.y``,
    ``ctx.global_out`` and ``ctx.num_classes`` and has no side effects, so that the vectorized
    backend can evaluate it for many clients at once with ``torch.vmap``.
    """

    name: str = "part"
    weight: float = 1.0
    taps: frozenset[str] = frozenset()
    needs_global_out: bool = False
    needs_prev_out: bool = False
    needs_global_params: bool = False
    owns_aggregation: bool = False
    output_only: bool = False

    def configure(self, spec: "MethodSpec") -> None:
        """Adjust the method's head, task loss or calibration (SphereFed's part does); called once
        when the method is resolved."""

    # client side -------------------------------------------------------------------------------
    def begin(self, rc: ClientRound) -> None:
        """Before local training (read state/payload, set ``rc.extra_weight_decay``; a part may
        still set its ``taps`` here from ``rc.model.tap_names``: the client reads them afterwards)."""

    def loss(self, ctx: TermContext) -> Tensor | None:
        """This part's loss term for one batch (unweighted), or None."""
        return None

    def lockstep_loss(self, ctx: LockstepContext) -> Tensor:
        """:meth:`loss` for a group of clients trained at once (the vectorized backend): the
        (clients,) unweighted terms. By default :meth:`loss` under ``torch.vmap`` for an
        ``output_only`` part; a part with state or weights in its term overrides this."""
        if not self.output_only:
            raise NotImplementedError(f"part '{self.name}' has no lockstep form")
        return vmap_loss(self.loss, ctx)

    def has_lockstep_form(self) -> bool:
        return self.output_only or type(self).lockstep_loss is not Part.lockstep_loss

    def after_step(self, rc: ClientRound) -> None:
        """After each optimiser step (e.g. SCAFFOLD's control-variate correction)."""

    def lockstep_drift(self, rcs: list[ClientRound], trainable: list[str]) -> Tensors | None:
        """The vectorized backend's form of ``begin`` + ``after_step`` for a part whose step hook
        moves each client's weights by a fixed −lr·d after every optimiser step: d per trainable
        weight with a leading client axis (SCAFFOLD's c − c_i), or None. There :meth:`finish` is
        called per client with ``rc.model`` holding that client's trained weights, without ``begin``."""
        return None

    def has_lockstep_steps(self) -> bool:
        return type(self).lockstep_drift is not Part.lockstep_drift

    def finish(self, rc: ClientRound) -> Tensors | None:
        """After local training: update ``rc.state`` and return extras to upload, or None."""
        return None

    # server side -------------------------------------------------------------------------------
    def payload(self, server_state: Tensors) -> Tensors:
        """What the server sends every client for this part (e.g. SCAFFOLD's c)."""
        return {}

    def aggregate(self, global_state: Tensors, uploads: list[Upload], server_state: Tensors,
                  trainable: set[str], num_clients: int) -> Tensors:
        """Replace the weighted mean (only for a part with ``owns_aggregation``)."""
        raise NotImplementedError

    def server_update(self, uploads: list[Upload], server_state: Tensors, num_clients: int) -> None:
        """Update this part's entries of ``server_state`` from the uploads' extras."""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "weight": self.weight}


@dataclass
class HeadPolicy:
    """The classifier: learned, or fixed at init (random or orthonormal rows, no bias);
    ``normalize_z`` L2-normalises features before it (SphereFed's switches, separable)."""

    fixed: bool = False
    init: str = "default"  # default | orthogonal (rows orthonormal, SphereFed / Freeze option)
    bias: bool = True
    normalize_z: bool = False


@dataclass
class Personalization:
    """``ditto``: a personal model per client trained beside the global copy with
    (λ/2)‖w_L − w̄‖² and the constraint parts; ``finetune``: the global model fine-tuned locally
    for ``epochs`` at evaluation time; ``partial``: the state entries ``local`` picks stay with
    each client (never averaged), the others are shared (FedRep, LG-FedAvg).

    For ``partial``, ``local(parameter names, state keys)`` returns the client's own keys (both in
    the model's order); a round first trains those layers alone for ``local_epochs``, then
    trains only the shared layers (``freeze_local``) or all of them, for ``shared_epochs``
    (0 = ``train.local_epochs``)."""

    kind: str = "none"  # none | ditto | finetune | partial
    lam: float = 0.0
    parts: list[Part] = field(default_factory=list)
    epochs: int = 1
    local: Callable[[list[str], list[str]], list[str]] | None = None
    local_epochs: int = 0
    freeze_local: bool = False
    shared_epochs: int = 0

    def local_keys(self, parameters: list[str], keys: list[str]) -> list[str]:
        """The state keys each client keeps to itself (none unless ``partial``)."""
        return list(self.local(parameters, keys)) if self.kind == "partial" and self.local else []


@dataclass
class Calibration:
    """After-training classifier calibration: ``ffc`` (SphereFed) or ``ccvr``."""

    kind: str = "none"  # none | ffc | ccvr
    ridge: float = 0.0
    every: int = 0  # FFC every R rounds (0 = only after training)
    personal: bool = False
    virtual_per_class: int = 100
    epochs: int = 5
    lr: float = 0.01


@dataclass
class MethodSpec:
    """A resolved method: everything the client and server need to run it."""

    name: str
    loss: str = "ce"  # ce | mse
    server_optimizer: str = "sgd"  # the preset's choice when [server] optimizer = "auto"
    parts: list[Part] = field(default_factory=list)
    head: HeadPolicy = field(default_factory=HeadPolicy)
    personalization: Personalization = field(default_factory=Personalization)
    calibration: Calibration = field(default_factory=Calibration)

    @property
    def aggregator(self) -> Part | None:
        owners = [p for p in self.parts if p.owns_aggregation]
        return owners[0] if owners else None

    def all_parts(self) -> list[Part]:
        return self.parts + self.personalization.parts


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


@functools.cache
def _identity(num_classes: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The C×C identity whose rows are the one-hot targets (built once, not once per step)."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.eye(num_classes, dtype=dtype, device=device)


def task_loss(kind: str, logits: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy, or SphereFed's MSE (1/C)‖logits − onehot(y)‖² averaged over the batch
    (``reduction="none"``: per sample for cross-entropy, per sample and class for MSE, so that
    their mean is the default value)."""
    if kind == "mse":  # rows of a cached identity: F.one_hot validates the labels with two host syncs per call
        target = _identity(logits.shape[1], logits.dtype, logits.device)[y]
        return F.mse_loss(logits, target, reduction=reduction)
    return F.cross_entropy(logits, y, reduction=reduction)


def trainable_names(model: torch.nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]
