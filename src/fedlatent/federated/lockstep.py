"""The local update of many clients at once: the vectorized backend's form of ``client.local_update``.

The selected clients' models are stacked on a leading client axis and trained in lockstep with
``torch.func`` (``functional_call`` under ``vmap``): one forward and one backward per step for all
of them, so per-operator overhead is paid once instead of once per client. The same SGD
(momentum, weight decay, a fresh optimiser each round), the same batches (each client's seeded
permutations, drawn exactly as ``client.batches`` draws them) and the same Ditto step as the
sequential client: the weights agree with the simulation backend up to floating-point rounding.

Clients with fewer batches drop out of the later steps; a step whose active clients hold batches of
different sizes (an epoch's short last batch) runs once per batch size. BatchNorm statistics are
stacked with the weights and updated per client. Supported: models without randomness (dropout),
no augmentation, global-step parts without
client-side hooks (server optimisers, FedNova's aggregation), with a lockstep form of their loss
(:meth:`~fedlatent.methods.parts.Part.lockstep_loss`: FedProx, FedUV, FedDecorr) or of their
after-step move (:meth:`~fedlatent.methods.parts.Part.lockstep_drift`: SCAFFOLD), and Ditto with
its constraints (cosine, MK-MMD, MMD-D). :func:`unsupported` says why a run is not.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Callable

import torch
from torch import Tensor
from torch.func import functional_call, vmap

from fedlatent.data.types import Split
from fedlatent.federated.client import PERSONAL, LocalSettings, Workspace, batches, prefixed
from fedlatent.methods.parts import (ClientRound, LockstepContext, MethodSpec, Part, Tensors, Upload, task_loss,
                                     trainable_names)
from fedlatent.models.base import FedModel, ModelOutput

STEP_HOOKS = ("begin", "after_step", "finish")  # client hooks the lockstep global step does not call


def unsupported(spec: MethodSpec, model: FedModel, augment: bool) -> str | None:
    """Why ``spec`` on ``model`` cannot train in lockstep (one line), or None when it can."""
    if any(isinstance(m, torch.nn.Dropout) for m in model.modules()):
        return "models with dropout are not supported"
    if augment:
        return "data augmentation is not supported"
    for part in spec.parts:
        hooks = [h for h in STEP_HOOKS if getattr(type(part), h) is not getattr(Part, h)]
        has_loss = type(part).loss is not Part.loss
        if (hooks and not part.has_lockstep_steps()) or part.needs_global_out or part.needs_prev_out \
                or (has_loss and not part.has_lockstep_form()):
            return f"part '{part.name}' acts on the client's training step, which has no lockstep form yet"
    if spec.personalization.kind == "partial":
        return "layers kept per client (FedRep, LG-FedAvg) have no lockstep form yet"
    if spec.personalization.kind == "ditto":
        for part in spec.personalization.parts:
            if not part.has_lockstep_form():
                return f"Ditto constraint '{part.name}' has no lockstep form yet"
    return None


class _Stack:
    """C models' parameters on a leading client axis with their SGD momentum buffers."""

    def __init__(self, states: list[Tensors], names: list[str], trainable: list[str], device: torch.device,
                 anchor: Tensors | None = None, pull: float = 0.0, drift: Tensors | None = None) -> None:
        # weights and buffers (BatchNorm statistics: the forward updates them in place, per client)
        self.params = {n: torch.stack([s[n] for s in states]).to(device) for n in names}
        self.trainable = trainable
        self.momentum = {n: torch.zeros_like(self.params[n]) for n in trainable}
        # Ditto's (λ/2)‖w − w̄‖²: its gradient λ(w − w̄) is added to the loss gradient directly
        self.pull = pull
        self.anchor = {n: anchor[n].to(device).expand_as(self.params[n]) for n in trainable} if pull else {}
        # parts' after-step moves (Part.lockstep_drift): p −= lr·d after each SGD step
        self.drift = {n: d.to(device) for n, d in drift.items()} if drift else {}

    def client_state(self, c: int) -> Tensors:
        return {n: p[c].detach().to("cpu", copy=True) for n, p in self.params.items()}

    def step(self, group: Tensor | None, loss_fn: Callable[[dict[str, Tensor]], Tensor],
             s: LocalSettings) -> None:
        """One SGD step of the clients in ``group`` (None: all) on ``loss_fn(params).sum()``.

        The update is torch.optim.SGD's (dampening 0, no Nesterov): d = g + wd·p,
        b = m·b + d (b = d on the first step: the buffers start at zero), p −= lr·b; with a pull,
        g includes λ(p − w̄); with a drift, p −= lr·drift afterwards (outside the momentum)."""
        def pick(t: Tensor) -> Tensor:
            return t if group is None else t.index_select(0, group)

        params = {n: pick(p).detach().requires_grad_(n in self.trainable) for n, p in self.params.items()}
        leaves = [params[n] for n in self.trainable]
        grads = torch.autograd.grad(loss_fn(params), leaves)
        with torch.no_grad():
            bufs = [pick(self.momentum[n]) for n in self.trainable]
            if self.pull:
                grads = torch._foreach_add(grads, torch._foreach_sub(leaves, [pick(self.anchor[n]) for n in self.trainable]),
                                           alpha=self.pull)
            direction = torch._foreach_add(grads, leaves, alpha=s.weight_decay) if s.weight_decay else list(grads)
            if s.momentum:
                torch._foreach_mul_(bufs, s.momentum)
                torch._foreach_add_(bufs, direction)
                direction = bufs
            torch._foreach_add_(leaves, direction, alpha=-s.lr)
            if self.drift:
                torch._foreach_add_(leaves, [pick(self.drift[n]) for n in self.trainable], alpha=-s.lr)
            if group is not None:  # all of the above acted on the group's copies: write them back
                for n in self.params:
                    self.params[n].index_copy_(0, group, params[n])
                for n, buf in zip(self.trainable, bufs):
                    self.momentum[n].index_copy_(0, group, buf)


def _drift(parts: list[Part], rcs: list[ClientRound], trainable: list[str]) -> Tensors | None:
    """The summed :meth:`~fedlatent.methods.parts.Part.lockstep_drift` of the parts that move the
    weights after each step, or None."""
    drifts = [d for d in (p.lockstep_drift(rcs, trainable) for p in parts) if d]
    if not drifts:
        return None
    return {n: sum(d[n] for d in drifts) for n in trainable}


def _forward(model: FedModel, taps: tuple[str, ...]) -> Callable:
    """vmap-able forward: (params, x) ↦ (logits, z, taps...) of one client's batch."""
    def one(params: dict[str, Tensor], x: Tensor) -> tuple[Tensor, ...]:
        out = functional_call(model, params, (x, frozenset(taps)))
        return (out.logits, out.z, *(out.features[t] for t in taps))
    return one


def _output(values: tuple[Tensor, ...], taps: tuple[str, ...]) -> ModelOutput:
    return ModelOutput(logits=values[0], z=values[1], features=dict(zip(taps, values[2:])))


def lockstep_update(ws: Workspace, global_state: Tensors, datas: list[Split], spec: MethodSpec,
                    rcs: list[ClientRound], s: LocalSettings, generators: list[torch.Generator]) -> list[Upload]:
    """Train the clients of ``rcs`` from ``global_state`` on ``datas`` at once; update each
    ``rc.state`` in place and return their uploads (as :func:`client.local_update` would, one by one)."""
    started = time.perf_counter()
    model, device, count = ws.model, s.device, len(rcs)
    model.train()  # the template's mode is what functional_call runs (BatchNorm: batch statistics)
    names = list(model.state_dict())
    trainable = trainable_names(model)
    plans = [[idx for _ in range(s.epochs) for idx in batches(len(d), s.batch_size, s.drop_last, g)]
             for d, g in zip(datas, generators)]
    ditto = spec.personalization.kind == "ditto"
    personal_parts = spec.personalization.parts if ditto else []
    for rc in rcs:
        rc.global_params = {n: global_state[n].to(device) for n, _ in model.named_parameters()}
        for part in personal_parts:
            part.begin(rc)
    global_stack = _Stack([global_state] * count, names, trainable, device, drift=_drift(spec.parts, rcs, trainable))
    taps = tuple(sorted(frozenset().union(*(p.taps for p in personal_parts + spec.parts))))
    forward = vmap(_forward(model, taps))
    global_params = rcs[0].global_params
    personal_stack = _Stack([prefixed(rc.state, PERSONAL) or global_state for rc in rcs], names, trainable,
                            device, anchor=global_state, pull=spec.personalization.lam) if ditto else None
    frozen = None
    if any(p.needs_global_out for p in personal_parts):
        frozen = ws.global_copy
        frozen.load_state_dict(global_state)
        frozen.eval()

    sums: dict[str, Tensor] = defaultdict(lambda: torch.zeros(count))
    for t in range(max(len(p) for p in plans)):
        by_size: dict[int, list[int]] = defaultdict(list)
        for c, plan in enumerate(plans):
            if t < len(plan):
                by_size[len(plan[t])].append(c)
        for members in by_size.values():
            group = None if len(members) == count else torch.tensor(members, device=device)
            x = torch.stack([datas[c].x[plans[c][t]] for c in members]).to(device)
            y = torch.stack([datas[c].y[plans[c][t]] for c in members]).to(device)
            record = _recorder(sums, members)

            def global_loss(params: dict[str, Tensor]) -> Tensor:
                out = _output(forward(params, x), taps)
                task = _task_losses(spec.loss, out.logits, y)
                record("train_loss", task)
                return _with_terms(task, spec.parts, LockstepContext(
                    out, y, params, global_params, None, s.num_classes, [rcs[c] for c in members]), record)

            global_stack.step(group, global_loss, s)
            if ditto:
                personal_stack.step(group, _personal_loss(spec, forward, frozen, taps, x, y, s, global_params,
                                                          [rcs[c] for c in members], record), s)
    seconds = time.perf_counter() - started
    uploads = []
    finishing = [p for p in spec.parts if p.has_lockstep_steps()]
    for c, rc in enumerate(rcs):
        rc.steps = len(plans[c])
        extras = {}
        if finishing:  # their finish reads the client's trained weights off rc.model
            model.load_state_dict(global_stack.client_state(c))
        for part in finishing:
            extra = part.finish(rc)
            if extra:
                extras[part.name] = extra
        for part in personal_parts:
            part.finish(rc)
        rc.scratch.clear()
        if ditto:
            rc.state.update({PERSONAL + k: v for k, v in personal_stack.client_state(c).items()})
        steps = max(rc.steps, 1)
        metrics = {"train_loss": float(sums["train_loss"][c]) / steps, "steps": rc.steps,
                   **{f"term_{k}": float(v[c]) / steps for k, v in sums.items()
                      if k not in ("train_loss", "personal_loss")},
                   **rc.metrics, "train_seconds": seconds / count}
        if ditto:
            metrics["personal_loss"] = float(sums["personal_loss"][c]) / steps
        uploads.append(Upload(rc.client_id, global_stack.client_state(c), rc.num_samples, rc.steps, s.lr,
                              s.momentum, extras, metrics))
    return uploads


def _task_losses(kind: str, logits: Tensor, y: Tensor) -> Tensor:
    """Per-client :func:`~fedlatent.methods.parts.task_loss` of (clients, batch, classes) logits:
    the same means, from one flat call outside vmap (cross-entropy's batching rule is a slow
    decomposition)."""
    flat = task_loss(kind, logits.flatten(0, 1), y.flatten(), reduction="none")
    return flat.reshape(logits.shape[0], -1).mean(1)


def _recorder(sums: dict[str, Tensor], members: list[int]) -> Callable[[str, Tensor], None]:
    """Adds a (group,) tensor of per-client values to the running per-client sums under ``key``."""
    index = torch.tensor(members)

    def record(key: str, values: Tensor) -> None:
        sums[key].index_add_(0, index, values.detach().to("cpu", torch.float32))
    return record


def _with_terms(task: Tensor, parts: list[Part], ctx: LockstepContext,
                record: Callable[[str, Tensor], None]) -> Tensor:
    """Σ over clients of task + Σ weight·term, each part's (clients,) term recorded."""
    total = task
    for part in parts:
        if type(part).loss is Part.loss:  # a part without a loss term (server-side only)
            continue
        value = part.lockstep_loss(ctx)
        record(part.name, value)
        total = total + part.weight * value
    return total.sum()


def _personal_loss(spec: MethodSpec, forward: Callable, frozen: FedModel | None, taps: tuple[str, ...],
                   x: Tensor, y: Tensor, s: LocalSettings, global_params: dict[str, Tensor],
                   rcs: list[ClientRound], record: Callable[[str, Tensor], None]) -> Callable[[dict[str, Tensor]], Tensor]:
    """The Ditto personal objective of a group but its (λ/2)‖w_L − w̄‖² (``_Stack``'s pull):
    task + Σ μ·constraint, summed over clients."""
    global_out = None
    if frozen is not None:
        with torch.no_grad():  # one round-start global model for every client: one plain forward
            flat = frozen(x.flatten(0, 1), frozenset(taps))
        global_out = ModelOutput(*(v.unflatten(0, x.shape[:2]) for v in (flat.logits, flat.z)),
                                 features={k: v.unflatten(0, x.shape[:2]) for k, v in flat.features.items()})

    def loss(params: dict[str, Tensor]) -> Tensor:
        out = _output(forward(params, x), taps)
        task = _task_losses(spec.loss, out.logits, y)
        record("personal_loss", task)
        return _with_terms(task, spec.personalization.parts, LockstepContext(
            out, y, params, global_params, global_out, s.num_classes, rcs), record)
    return loss
