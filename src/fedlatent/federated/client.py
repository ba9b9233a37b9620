"""The local update of one client, the same under every backend.

Mini-batch SGD for E epochs on the client's training split with a fresh optimiser each round (as
in the papers), the method's parts adding loss terms and step hooks. Only what some part asks
for is computed: the frozen global model runs on a batch only for parts with
``needs_global_out``, the previous local model only for ``needs_prev_out``, intermediate
features only when named in a part's ``taps``. With Ditto, each batch also takes one step on the
client's personal model (Algorithm 1 of the Ditto+MMD paper).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fedlatent.data.augment import augment_batch
from fedlatent.data.types import Split
from fedlatent.methods.parts import (ClientRound, MethodSpec, Part, TermContext, Tensors, Upload,
                                     task_loss, trainable_names)
from fedlatent.models.base import FedModel

PERSONAL = "personal."   # client-state prefix of the Ditto personal model
PREVIOUS = "previous."   # client-state prefix of the previous local model (MOON)


@dataclass
class LocalSettings:
    """The local optimiser and loop settings of one round."""

    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    drop_last: bool
    augment: bool
    num_classes: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


@dataclass
class Workspace:
    """Model instances a backend reuses across clients: the model being trained and, when parts
    need them, frozen copies of the global model, the previous local model and the personal model."""

    model: FedModel
    global_copy: FedModel | None = None
    previous: FedModel | None = None
    personal: FedModel | None = None


def batches(num_samples: int, batch_size: int, drop_last: bool, generator: torch.Generator) -> list[Tensor]:
    """Index batches of one epoch from a seeded permutation. A trailing batch of one sample is
    dropped too (BatchNorm cannot train on it)."""
    order = torch.randperm(num_samples, generator=generator)
    chunks = list(order.split(batch_size))
    incomplete = drop_last and len(chunks[-1]) < batch_size if chunks else False
    single = len(chunks) > 1 and len(chunks[-1]) == 1
    if incomplete or single:
        chunks.pop()
    return chunks


def state_to_cpu(model: torch.nn.Module) -> Tensors:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def prefixed(state: Tensors, prefix: str) -> Tensors:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def _sgd(model: FedModel, s: LocalSettings, extra_weight_decay: float) -> torch.optim.SGD:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.SGD(params, lr=s.lr, momentum=s.momentum,
                           weight_decay=s.weight_decay + extra_weight_decay)


def _add_terms(loss: Tensor, parts: list[Part], ctx: TermContext, sums: dict[str, Tensor]) -> Tensor:
    """``loss`` plus each part's weighted term (no extra autograd node when no part contributes)."""
    for part in parts:
        value = part.loss(ctx)
        if value is None:
            continue
        sums[part.name] = sums.get(part.name, 0.0) + value.detach()
        loss = loss + part.weight * value
    return loss


def local_update(ws: Workspace, global_state: Tensors, data: Split, spec: MethodSpec, rc: ClientRound,
                 s: LocalSettings, generator: torch.Generator) -> Upload:
    """Train ``ws.model`` from ``global_state`` on ``data``; update ``rc.state`` in place; return the upload."""
    started = time.perf_counter()
    model, parts = ws.model, spec.parts
    model.load_state_dict(global_state)
    model.train()
    personal_parts = spec.personalization.parts if spec.personalization.kind == "ditto" else []
    every = parts + personal_parts
    if any(p.needs_global_params for p in every) or spec.personalization.kind == "ditto":
        rc.global_params = {n: p.detach().clone() for n, p in model.named_parameters()}
    need_global = any(p.needs_global_out for p in every)
    if need_global:
        ws.global_copy.load_state_dict(global_state)
        ws.global_copy.eval()
    has_previous = any(p.needs_prev_out for p in parts) and any(k.startswith(PREVIOUS) for k in rc.state)
    if has_previous:
        ws.previous.load_state_dict(prefixed(rc.state, PREVIOUS))
        ws.previous.eval()
    for part in every:
        part.begin(rc)
    # after begin: a part may resolve its taps from rc.model.tap_names (feature-drift depth)
    taps = frozenset().union(*(p.taps for p in every)) if every else frozenset()
    optimizer = _sgd(model, s, rc.extra_weight_decay)
    personal = _personal_setup(ws, rc, global_state, s) if spec.personalization.kind == "ditto" else None

    loss_sum, personal_sum, count = torch.zeros(()), torch.zeros(()), 0
    term_sums: dict[str, Tensor] = {}
    x_all, y_all = data.x, data.y
    params = dict(model.named_parameters())
    for _ in range(s.epochs):
        for idx in batches(len(data), s.batch_size, s.drop_last, generator):
            x, y = x_all[idx].to(s.device), y_all[idx].to(s.device)
            if s.augment:
                x = augment_batch(x, generator, s.augment)
            global_out = None
            if need_global:
                with torch.no_grad():
                    global_out = ws.global_copy(x, taps)
            prev_out = None
            if has_previous:
                with torch.no_grad():
                    prev_out = ws.previous(x, taps)
            out = model(x, taps)
            task = task_loss(spec.loss, out.logits, y)
            ctx = TermContext(out, y, params, rc.global_params, global_out,
                              prev_out, s.num_classes, rc.state, rc.payload)
            loss = _add_terms(task, parts, ctx, term_sums)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            rc.steps += 1
            for part in parts:
                part.after_step(rc)
            if personal is not None:
                personal_sum += _personal_step(ws.personal, personal, spec, x, y, global_out, rc, s,
                                               taps, term_sums)
            loss_sum += task.detach().cpu()
            count += 1
    extras = {}
    for part in every:
        extra = part.finish(rc)
        if extra:
            extras[part.name] = extra
    if personal is not None:
        rc.state.update({PERSONAL + k: v for k, v in state_to_cpu(ws.personal).items()})
    if any(p.needs_prev_out for p in parts):
        rc.state.update({PREVIOUS + k: v for k, v in state_to_cpu(model).items()})
    metrics = {"train_loss": float(loss_sum) / max(count, 1), "steps": rc.steps,
               **{f"term_{k}": float(v) / max(count, 1) for k, v in term_sums.items()},
               **rc.metrics}
    if personal is not None:
        metrics["personal_loss"] = float(personal_sum) / max(count, 1)
    metrics["train_seconds"] = time.perf_counter() - started
    return Upload(rc.client_id, state_to_cpu(model), rc.num_samples, rc.steps, s.lr, s.momentum,
                  extras, metrics)


def _personal_setup(ws: Workspace, rc: ClientRound, global_state: Tensors, s: LocalSettings):
    """Load the client's personal model (the global one at its first round) and its optimiser."""
    own = prefixed(rc.state, PERSONAL)
    ws.personal.load_state_dict(own if own else global_state)
    ws.personal.train()
    return _sgd(ws.personal, s, 0.0)


def _personal_step(personal: FedModel, optimizer: torch.optim.SGD, spec: MethodSpec, x: Tensor, y: Tensor,
                   global_out, rc: ClientRound, s: LocalSettings, taps: frozenset[str],
                   term_sums: dict[str, Tensor]) -> Tensor:
    """One Ditto step: task loss + (λ/2)‖w_L − w̄‖² + the constraint parts against the frozen global model."""
    out = personal(x, taps)
    task = task_loss(spec.loss, out.logits, y)
    params = dict(personal.named_parameters())
    loss = task
    lam = spec.personalization.lam
    if lam > 0:
        loss = loss + 0.5 * lam * sum(((params[n] - rc.global_params[n]) ** 2).sum()
                                      for n in trainable_names(personal))
    ctx = TermContext(out, y, params, rc.global_params, global_out, None, s.num_classes, rc.state, rc.payload)
    loss = _add_terms(loss, spec.personalization.parts, ctx, term_sums)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return task.detach().cpu()
