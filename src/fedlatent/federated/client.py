"""The local update of one client, the same under every backend.

Mini-batch SGD (or Adam / AdamW) for E epochs, or for a budget of steps, on the client's training
split with a fresh optimiser each round (as in the papers) or its state kept in the client's state
across rounds (as the Ditto+MMD release), the method's parts adding loss terms and step hooks. Only what some part asks
for is computed: the frozen global model runs on a batch only for parts with
``needs_global_out``, the previous local model only for ``needs_prev_out``, intermediate
features only when named in a part's ``taps``. With Ditto, each batch also takes one step on the
client's personal model (Algorithm 1 of the Ditto+MMD paper). With partial personalisation
(FedRep, LG-FedAvg) the client's own layers replace the global ones at the start of the round and
are saved back to its state at the end.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from fedlatent.data.augment import Augmentation, augment_batch
from fedlatent.data.compact import Images
from fedlatent.data.types import Split
from fedlatent.methods.parts import (ClientRound, MethodSpec, Part, Personalization, TermContext, Tensors,
                                     Upload, task_loss, trainable_names)
from fedlatent.federated import update
from fedlatent.federated.compiled import forward_of
from fedlatent.federated.update import LocalOptimizer, Rule
from fedlatent.models.base import FedModel, ModelOutput
from fedlatent.models.flops import per_sample_flops

PERSONAL = "personal."   # client-state prefix of the Ditto personal model
PREVIOUS = "previous."   # client-state prefix of the previous local model (MOON)
OPTIM = "optim."         # client-state prefix of the local model's optimiser state (kept across rounds)
PERSONAL_OPTIM = "personal_optim."  # the same for Ditto's personal model
LOCAL = "local."         # client-state prefix of the layers a client keeps to itself (FedRep, LG-FedAvg)


@dataclass
class LocalSettings:
    """The local optimiser and loop settings of one round."""

    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    drop_last: bool
    augment: Augmentation | bool  # truthy when training batches are augmented
    num_classes: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    optimizer: str = "sgd"        # sgd | adam | adamw
    steps: int = 0                # local steps per round; 0 = ``epochs`` epochs
    keep_optimizer: bool = False  # optimiser state kept in the client's state across rounds


@dataclass
class Workspace:
    """Model instances a backend reuses across clients: the model being trained and, when parts
    need them, frozen copies of the global model, the previous local model and the personal model;
    ``forward``: the model's compiled forward (``train.compile``, ``federated.compiled``) or None."""

    model: FedModel
    global_copy: FedModel | None = None
    previous: FedModel | None = None
    personal: FedModel | None = None
    forward: Callable[..., ModelOutput] | None = None


def workspace_for(model: FedModel, spec: MethodSpec, compile_model: bool = False) -> Workspace:
    """The workspace a method needs around ``model``: frozen copies only for the parts that read them,
    the compiled forward when ``compile_model``."""
    parts = spec.all_parts()
    return Workspace(model=model, forward=forward_of(model, compile_model),
                     global_copy=copy.deepcopy(model) if any(p.needs_global_out for p in parts) else None,
                     previous=copy.deepcopy(model) if any(p.needs_prev_out for p in parts) else None,
                     personal=copy.deepcopy(model) if spec.personalization.kind == "ditto" else None)


def batch_count(num_samples: int, batch_size: int, drop_last: bool) -> int:
    """How many batches :func:`batches` keeps of an epoch (known before drawing): the ⌈n / b⌉
    chunks of the permutation (one, empty, when n = 0) but an incomplete last one under
    ``drop_last`` and a trailing one of a single sample (BatchNorm cannot train on it)."""
    chunks = max(1, -(-num_samples // batch_size))
    last = num_samples - (chunks - 1) * batch_size
    return chunks - ((drop_last and last < batch_size) or (chunks > 1 and last == 1))


def planned_steps(num_samples: int, s: LocalSettings) -> int:
    """How many local steps :func:`_epochs` yields for a training set of ``num_samples`` (known
    before drawing): ``s.steps`` when set (none without data), else ``s.epochs`` epochs of batches."""
    per_epoch = batch_count(num_samples, s.batch_size, s.drop_last)
    if s.steps:
        return s.steps if per_epoch else 0
    return s.epochs * per_epoch


def batches(num_samples: int, batch_size: int, drop_last: bool, generator: torch.Generator) -> list[Tensor]:
    """Index batches of one epoch from a seeded permutation, the first :func:`batch_count` of its
    chunks of ``batch_size``."""
    order = torch.randperm(num_samples, generator=generator)
    chunks = [order] if num_samples <= batch_size else list(order.split(batch_size))
    return chunks[:batch_count(num_samples, batch_size, drop_last)]


def state_to_cpu(model: torch.nn.Module) -> Tensors:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def prefixed(state: Tensors, prefix: str) -> Tensors:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def rule_of(s: LocalSettings, extra_weight_decay: float = 0.0) -> Rule:
    """The update rule of ``s`` (torch's defaults besides lr, SGD's momentum and the weight decay)."""
    return Rule(s.optimizer, s.lr, s.momentum if s.optimizer == "sgd" else 0.0, s.weight_decay + extra_weight_decay)


def local_optimizer(model: FedModel, s: LocalSettings, extra_weight_decay: float, state: Tensors,
                    prefix: str) -> tuple[LocalOptimizer, list[str], list[Tensor]]:
    """The client's optimiser of ``model``'s trainable weights (names and tensors returned with it),
    from the state kept under ``prefix`` in the client's state when it is kept across rounds."""
    names = trainable_names(model)
    params = dict(model.named_parameters())
    leaves = [params[n] for n in names]
    saved = prefixed(state, prefix) if s.keep_optimizer else {}
    return update.restore(rule_of(s, extra_weight_decay), leaves, names, [saved], stacked=False), names, leaves


def save_optimizer(optimizer: LocalOptimizer, names: list[str], state: Tensors, prefix: str,
                   client: int | None = None) -> None:
    """Replace the optimiser state kept under ``prefix`` in the client's state."""
    update.clear(state, prefix)
    state.update(optimizer.save(names, prefix, client))


def _epochs(num_samples: int, s: LocalSettings, generator: torch.Generator) -> Iterator[list[Tensor]]:
    """The round's index batches epoch by epoch, each drawn when it starts: ``s.epochs`` epochs, or
    as many as ``s.steps`` batches take (the last one cut short)."""
    if not s.steps:
        for _ in range(s.epochs):
            yield batches(num_samples, s.batch_size, s.drop_last, generator)
        return
    left = s.steps
    while left > 0:
        epoch = batches(num_samples, s.batch_size, s.drop_last, generator)[:left]
        if not epoch:
            return
        yield epoch
        left -= len(epoch)


def add_terms(loss: Tensor, parts: list[Part], term: Callable[[Part], Tensor | None],
              record: Callable[[Part, Tensor], None]) -> Tensor:
    """``loss`` plus each part's weighted term ``term(part)`` (one client's, or the clients' with
    a leading axis), each unweighted value handed to ``record``; a part without a term, or whose
    term is None this step, adds nothing (no autograd node either)."""
    for part in parts:
        if not part.has_term():  # a part acting only on the server or on the step
            continue
        value = term(part)
        if value is None:
            continue
        record(part, value)
        loss = loss + part.weight * value
    return loss


def _add_terms(loss: Tensor, parts: list[Part], ctx: TermContext, sums: dict[str, Tensor],
               step: dict[str, Tensor] | None = None, prefix: str = "") -> Tensor:
    """:func:`add_terms` for one client: each unweighted term summed in ``sums`` and, when
    tracing, kept in ``step`` under ``prefix + name``."""
    def record(part: Part, value: Tensor) -> None:
        sums[part.name] = sums.get(part.name, 0.0) + value.detach()
        if step is not None:
            step[prefix + part.name] = value.detach()
    return add_terms(loss, parts, lambda part: part.loss(ctx), record)


def local_update(ws: Workspace, global_state: Tensors, data: Split, spec: MethodSpec, rc: ClientRound,
                 s: LocalSettings, generator: torch.Generator) -> Upload:
    """Train ``ws.model`` from ``global_state`` on ``data``; update ``rc.state`` in place; return the upload."""
    if spec.personalization.kind == "partial":
        def train(starts: list[Tensors], spec_: MethodSpec, rcs: list[ClientRound], s_: LocalSettings) -> list[Upload]:
            return [local_update(ws, starts[0], data, spec_, rcs[0], s_, generator)]
        return partial_round(ws.model, global_state, spec, [rc], s, train)[0]
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
    optimizer, names, leaves = local_optimizer(model, s, rc.extra_weight_decay, rc.state, OPTIM)
    personal = _personal_setup(ws, rc, global_state, s) if spec.personalization.kind == "ditto" else None

    loss_sum, personal_sum, count = torch.zeros(()), torch.zeros(()), 0
    term_sums: dict[str, Tensor] = {}
    trace: list[dict[str, Tensor]] | None = [] if spec.trace else None
    flops = 0
    x_all, y_all = data.x, data.y
    params = dict(model.named_parameters())
    forward = model if ws.forward is None else ws.forward
    for epoch in _epochs(len(data), s, generator):
        for idx in epoch:
            y = y_all[idx].to(s.device)
            if s.augment:  # the whole stored images: a training transform may crop them to the input size
                x = x_all.full(idx) if isinstance(x_all, Images) else x_all[idx]
                x = augment_batch(x.to(s.device), generator, s.augment)
            else:
                x = x_all[idx].to(s.device)
            global_out = None
            if need_global:
                with torch.no_grad():
                    global_out = ws.global_copy(x, taps)
            prev_out = None
            if has_previous:
                with torch.no_grad():
                    prev_out = ws.previous(x, taps)
            out = forward(x, taps)
            task = task_loss(spec.loss, out.logits, y, temperature=spec.temperature)
            ctx = TermContext(out, y, params, rc.global_params, global_out,
                              prev_out, s.num_classes, rc.state, rc.payload, rc.scratch, rc)
            step = {"task": task.detach()} if trace is not None else None
            loss = _add_terms(task, parts, ctx, term_sums, step)
            optimizer.step(leaves, list(torch.autograd.grad(loss, leaves, allow_unused=True)))
            rc.steps += 1
            for part in parts:
                part.after_step(rc)
            if personal is not None:
                personal_sum += _personal_step(ws.personal, personal, spec, x, y, global_out, rc, s,
                                               taps, term_sums, step)
            if step is not None:
                trace.append(step)
            if spec.count_flops:
                flops += _step_flops(ws, x, need_global + has_previous, personal is not None)
            loss_sum += task.detach().cpu()
            count += 1
    extras = finish_parts(rc, every)
    trained = state_to_cpu(model)
    keep_models(rc, spec, trained, state_to_cpu(ws.personal) if personal is not None else None)
    if s.keep_optimizer:
        save_optimizer(optimizer, names, rc.state, OPTIM)
        if personal is not None:
            save_optimizer(personal[0], personal[1], rc.state, PERSONAL_OPTIM)
    sums = {"train_loss": float(loss_sum), **{k: float(v) for k, v in term_sums.items()}}
    if personal is not None:
        sums["personal_loss"] = float(personal_sum)
    steps = [{k: float(v) for k, v in step.items()} for step in trace] if trace is not None else []
    return client_upload(rc, trained, s, extras, sums, count, time.perf_counter() - started,
                         flops if spec.count_flops else None, steps)


def finish_parts(rc: ClientRound, parts: list[Part]) -> dict[str, Tensors]:
    """The parts' :meth:`~fedlatent.methods.parts.Part.finish` after local training: the extras
    they upload, by part name; then the round's scratch is discarded."""
    extras = {}
    for part in parts:
        extra = part.finish(rc)
        if extra:
            extras[part.name] = extra
    rc.scratch.clear()
    return extras


def keep_models(rc: ClientRound, spec: MethodSpec, trained: Tensors, personal: Tensors | None) -> None:
    """What the client keeps of the round's models for its next round: Ditto's personal model,
    and a copy of the trained model as MOON's previous local model."""
    if personal is not None:
        rc.state.update({PERSONAL + k: v for k, v in personal.items()})
    if any(p.needs_prev_out for p in spec.parts):
        rc.state.update({PREVIOUS + k: v.clone() for k, v in trained.items()})


def client_upload(rc: ClientRound, state: Tensors, s: LocalSettings, extras: dict[str, Tensors],
                  sums: dict[str, float], steps: int, seconds: float, flops: int | None = None,
                  trace: list[dict[str, float]] | None = None) -> Upload:
    """The client's reply: its trained ``state``, sample count and steps, the parts' extras and the
    round's metrics: the means over its ``steps`` of ``sums`` (``train_loss``, ``personal_loss``
    for Ditto, each part's unweighted term as ``term_<part>``), the parts' own metrics, the FLOPs
    when counted and the seconds of local training."""
    done = max(steps, 1)
    metrics = {"train_loss": sums["train_loss"] / done, "steps": rc.steps,
               **{f"term_{k}": v / done for k, v in sums.items() if k not in ("train_loss", "personal_loss")},
               **rc.metrics}
    if "personal_loss" in sums:
        metrics["personal_loss"] = sums["personal_loss"] / done
    if flops is not None:
        metrics["flops"] = flops
    metrics["train_seconds"] = seconds
    return Upload(rc.client_id, state, rc.num_samples, rc.steps, s.lr, s.momentum, extras, metrics, trace or [])


def _step_flops(ws: Workspace, x: Tensor, frozen_passes: int, personal: bool) -> int:
    """FLOPs of one local step on batch ``x``: the model's forward and backward, a forward of each
    frozen model run on the batch (the round's global model, the previous local model) and Ditto's
    personal step (:func:`fedlatent.models.flops.per_sample_flops`; a part's own computations,
    e.g. kernel training, are not counted)."""
    shape = tuple(x.shape[1:])
    forward, backward = per_sample_flops(ws.model, shape)
    total = forward + backward + frozen_passes * forward
    if personal:
        total += sum(per_sample_flops(ws.personal, shape))
    return len(x) * total


def _personal_setup(ws: Workspace, rc: ClientRound, global_state: Tensors,
                    s: LocalSettings) -> tuple[LocalOptimizer, list[str], list[Tensor]]:
    """Load the client's personal model (the global one at its first round) and its optimiser."""
    own = prefixed(rc.state, PERSONAL)
    ws.personal.load_state_dict(own if own else global_state)
    ws.personal.train()
    return local_optimizer(ws.personal, s, 0.0, rc.state, PERSONAL_OPTIM)


def _personal_step(personal: FedModel, optimizer: tuple[LocalOptimizer, list[str], list[Tensor]], spec: MethodSpec,
                   x: Tensor, y: Tensor,
                   global_out, rc: ClientRound, s: LocalSettings, taps: frozenset[str],
                   term_sums: dict[str, Tensor], step: dict[str, Tensor] | None = None) -> Tensor:
    """One Ditto step: task loss + (λ/2)‖w_L − w̄‖² + the constraint parts against the frozen global model."""
    out = personal(x, taps)
    task = task_loss(spec.loss, out.logits, y, temperature=spec.temperature)
    params = dict(personal.named_parameters())
    loss = task
    lam = spec.personalization.lam
    if lam > 0:
        loss = loss + 0.5 * lam * sum(((params[n] - rc.global_params[n]) ** 2).sum()
                                      for n in trainable_names(personal))
    ctx = TermContext(out, y, params, rc.global_params, global_out, None, s.num_classes, rc.state, rc.payload,
                      rc.scratch, rc)
    if step is not None:
        step["personal_task"] = task.detach()
    loss = _add_terms(loss, spec.personalization.parts, ctx, term_sums, step, prefix="personal_")
    own, _, leaves = optimizer
    own.step(leaves, list(torch.autograd.grad(loss, leaves, allow_unused=True)))
    return task.detach().cpu()


def own_state(model: FedModel, personalization: Personalization, client_state: Tensors,
              global_state: Tensors) -> Tensors:
    """The global state with the client's own layers (kept under ``LOCAL``) in place of the shared
    ones; the global values where the client has none yet (its first round)."""
    keys = personalization.local_keys([n for n, _ in model.named_parameters()], list(global_state))
    own = prefixed(client_state, LOCAL)
    return {**global_state, **{k: own[k] for k in keys if k in own}}


@contextmanager
def _training_only(model: FedModel, names: set[str]) -> Iterator[None]:
    """Train only the parameters in ``names`` (those already trainable) for the block's duration."""
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.requires_grad_(flags[n] and n in names)
    try:
        yield
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(flags[n])


Train = Callable[[list[Tensors], MethodSpec, list[ClientRound], LocalSettings], list[Upload]]


def partial_round(model: FedModel, global_state: Tensors, spec: MethodSpec, rcs: list[ClientRound],
                  s: LocalSettings, train: Train) -> list[Upload]:
    """A round of partial personalisation for the clients of ``rcs``, whatever trains them
    (``train(starts, spec, rcs, settings)``: one client after another, or all at once): start from
    the global state with each client's own layers, train those alone for ``local_epochs``
    (FedRep's head phase, the task loss only), then the shared layers (``freeze_local``) or all
    layers with the method's parts; keep the own layers in the clients' states. An upload carries
    every entry; the server averages only the shared ones."""
    p = spec.personalization
    names = [n for n, _ in model.named_parameters()]
    local = set(p.local_keys(names, list(global_state)))
    starts = [own_state(model, p, rc.state, global_state) for rc in rcs]
    first: list[Upload] | None = None
    if p.local_epochs and any(q.requires_grad for n, q in model.named_parameters() if n in local):
        alone = [replace(rc, state={}, payload={}, steps=0, metrics={}, scratch={}) for rc in rcs]
        settings = replace(s, epochs=p.local_epochs, steps=0, keep_optimizer=False)
        local_spec = MethodSpec("local", loss=spec.loss, temperature=spec.temperature, trace=spec.trace,
                                count_flops=spec.count_flops)
        with _training_only(model, local):
            first = train(starts, local_spec, alone, settings)
        starts = [u.state for u in first]
    shared = {n for n in names if n not in local} if p.freeze_local else set(names)
    with _training_only(model, shared):
        uploads = train(starts, replace(spec, personalization=Personalization()), rcs,
                        replace(s, epochs=p.shared_epochs or s.epochs))
    for c, (rc, upload) in enumerate(zip(rcs, uploads)):
        rc.state.update({LOCAL + k: upload.state[k].clone() for k in local})
        if first is not None:
            upload.metrics["local_layers_loss"] = first[c].metrics["train_loss"]
            upload.trace = first[c].trace + upload.trace  # the own layers' steps first, as they ran
            if spec.count_flops:
                upload.metrics["flops"] += first[c].metrics["flops"]
    return uploads
