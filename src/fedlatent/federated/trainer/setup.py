"""The round's set-up: its clients in stack order, the parts' ``begin``, a holder of weights per copy
of the client's program built from a table of what each copy starts from and chains into its update
rule, the frozen models the parts read, and the batches — the :class:`Round` every step shares."""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from fedlatent.data.types import Split
from fedlatent.federated import devices, sample_dp
from fedlatent.federated.client import PREVIOUS, LocalSettings, Workspace, prefixed, rule_of
from fedlatent.federated.trainer.batches import Batches
from fedlatent.federated.trainer.forms import Form, form_of
from fedlatent.federated.trainer.forward import Forward
from fedlatent.federated.trainer.frozen import PerClient, Shared, frozen_models
from fedlatent.federated.trainer.schedule import planned_steps
from fedlatent.federated.trainer.weights import Recipe, Training, Weights
from fedlatent.methods.coefficients import RowCoefficients
from fedlatent.methods.parts import ClientRound, MethodSpec, Part, Tensors
from fedlatent.methods.program import GLOBAL, ModelCopy


@dataclass
class Copy:
    """A copy the program trains this round: its declaration, its weights with their update rule,
    its forward on them and on given weights (a program's mixture), and, under sample-level DP-SGD,
    its private gradients. The global copy's objective takes the method's parts, any other copy the
    program's."""

    decl: ModelCopy
    weights: Weights
    forward: Forward
    functional: Forward
    private: sample_dp.PrivateGradients | None = None

    @property
    def personal(self) -> bool:
        return self.decl.name != GLOBAL


@dataclass
class Round:
    """One call of the trainer: its clients in stack order (by training-set size) and what their
    steps share — the program's copies, the frozen models the parts read, the batches, the running
    per-client sums of the losses and terms; each client's own run's method (``owns``) and the
    coefficients a group's terms read (``coefficients``)."""

    ws: Workspace
    spec: MethodSpec
    s: LocalSettings
    rcs: list[ClientRound]
    order: list[int]  # the caller's order of the clients
    owns: list[MethodSpec]
    coefficients: RowCoefficients
    form: Form
    trainable: list[str]
    same_start: bool
    global_params: Tensors  # the round-start weights: no client axis when shared, else stacked
    copies: dict[str, Copy]
    frozen: Shared | PerClient | None
    previous: Shared | PerClient | None
    present: Tensor | None
    draws: Batches
    total: list[int]  # each client's steps
    data: Any  # the program's round-scoped values (ClientProgram.begin)
    started: float
    steps: list[int] = field(default_factory=list)
    sums: dict[str, Tensor] = field(default_factory=dict)
    seen: dict[str, Tensor] = field(default_factory=dict)
    traces: list[list[dict[str, Any]]] | None = None  # (value, present) pairs until the round's end
    flops: list[int] = field(default_factory=list)
    per_sample: tuple[int, int] | None = None  # FLOPs of one sample's step and forward, from the first batch
    had_previous: list[bool] = field(default_factory=list)  # which clients kept a previous model (``present``'s rows)

    @property
    def count(self) -> int:
        return len(self.rcs)

    @property
    def parts(self) -> list[Part]:
        return self.spec.parts + self.spec.personalization.parts


class _Clients(NamedTuple):
    """The round's clients in stack order: sorted by training-set size (so that clients of one size
    draw batches of the same sizes and a step's group is mostly a run of adjacent rows: trained on
    views of the stack, not on copies written back)."""

    order: list[int]
    starts: list[Tensors]
    datas: list[Split]
    rcs: list[ClientRound]
    generators: list[torch.Generator]
    sizes: list[int]
    owns: list[MethodSpec]


def _in_stack_order(starts: list[Tensors], datas: list[Split], rcs: list[ClientRound],
                    generators: list[torch.Generator], spec: MethodSpec, methods: list[MethodSpec] | None) -> _Clients:
    sizes = [len(d) for d in datas]
    order = sorted(range(len(rcs)), key=sizes.__getitem__)
    owns = methods or [spec] * len(rcs)
    return _Clients(order, [starts[c] for c in order], [datas[c] for c in order], [rcs[c] for c in order],
                    [generators[c] for c in order], [sizes[c] for c in order], [owns[c] for c in order])


def _begin(model: Any, clients: _Clients, param_names: list[str], device: torch.device) -> bool:
    """Each client's round-start weights on the device and its parts' ``begin``; whether the clients
    all start from one state (one object). The parts read the model this call trains: ``begin`` its
    shapes, ``finish`` the trained weights; a client of another stacked run came with its own run's
    idle model, and begins with its run's own parts (their coefficients: FedDyn's α_k)."""
    starts = clients.starts
    same_start = all(st is starts[0] for st in starts)
    shared = {n: starts[0][n].to(device) for n in param_names} if same_start else None
    for rc, start, own_spec in zip(clients.rcs, starts, clients.owns):
        rc.model = model
        rc.global_params = dict(shared) if shared is not None else {n: start[n].to(device) for n in param_names}
        for part in own_spec.all_parts():
            part.begin(rc)
    return same_start


def _drift(parts: list[Part], rcs: list[ClientRound], trainable: list[str]) -> Tensors | None:
    """The summed :meth:`~fedlatent.methods.parts.Part.lockstep_drift` of the parts that move the
    weights after each step, or None."""
    drifts = [d for d in (p.lockstep_drift(rcs, trainable) for p in parts) if d]
    if not drifts:
        return None
    return {n: sum(d[n] for d in drifts) for n in trainable}  # type: ignore[misc]


@dataclass
class _Build:
    """What building a copy reads: the round's workspace, method, clients and coefficients."""

    ws: Workspace
    spec: MethodSpec
    s: LocalSettings
    clients: _Clients
    coefficients: RowCoefficients
    trainable: list[str]


def _global_recipe(b: _Build, copy: ModelCopy) -> Recipe:
    """The global copy: from the round's start, with the parts' drift (SCAFFOLD) and decay (FedDyn)."""
    rcs = b.clients.rcs
    return Recipe(b.clients.starts, b.ws.model, drift=_drift(b.spec.parts, rcs, b.trainable),
                  decay=[rc.extra_weight_decay for rc in rcs])


def _own_recipe(b: _Build, copy: ModelCopy) -> Recipe:
    """A copy of the client's own: kept across rounds, the round's start until it has one; pulled
    towards each client's own start (the runs of a stack start from their own global states), by
    each row's own run's pull."""
    starts = b.clients.starts
    own = [(prefixed(rc.state, copy.prefix) if copy.kept else {}) or start for rc, start in zip(b.clients.rcs, starts)]
    return Recipe(own, b.ws.copies[copy.name], anchor=starts, pull=b.coefficients.pull(copy.name))


# what each copy starts from and chains into its rule: the global copy's, else a copy of the client's own
RECIPES: dict[bool, Callable[[_Build, ModelCopy], Recipe]] = {True: _global_recipe, False: _own_recipe}


def _copy(b: _Build, form: Form, copy: ModelCopy, training: Training, taps: tuple[str, ...]) -> Copy:
    """The copy's weights from its recipe, its forwards, and its private gradients under DP-SGD (its
    noise drawn per client; validation leaves only per-sample task losses and parameter-only terms,
    float32, no BatchNorm, and programs whose copies each take one step on their own objective)."""
    recipe = RECIPES[copy.name == GLOBAL](b, copy)
    run = b.ws.forward if copy.name == GLOBAL else None  # the compiled forward is the global model's
    forward, functional = form.forwards(b.ws, recipe.module, run, taps)
    private = None
    if sample_dp.enabled(b.s):
        which = sample_dp.GLOBAL if copy.name == GLOBAL else sample_dp.PERSONAL
        private = sample_dp.PrivateGradients(b.ws.model, b.spec.loss, b.spec.temperature, b.s, b.clients.rcs,
                                             b.clients.sizes, b.trainable, which)
    return Copy(copy, form.holder(recipe, training), forward, functional, private)


def _training(b: _Build, names: list[str], fixed: list[str], copy: ModelCopy) -> Training:
    """The copy's training settings: the clients' kept optimiser states (when kept) and fp16's loss
    scales (kept across rounds, as GradScaler's is)."""
    s, rcs = b.s, b.clients.rcs
    return Training(names, b.trainable, fixed, s.device, rule_of(s),
                    [prefixed(rc.state, copy.optim_prefix) if s.keep_optimizer else {} for rc in rcs],
                    [prefixed(rc.state, copy.amp_prefix) for rc in rcs], s.precision)


def _previous(ws: Workspace, spec: MethodSpec, clients: _Clients, taps: tuple[str, ...],
              device: torch.device) -> tuple[Shared | PerClient | None, Tensor | None]:
    """MOON's previous local models, where a part reads them and a client has one (the round's start
    as a stand-in where a client has none), and which clients have one."""
    rcs = clients.rcs
    if not (any(p.needs_prev_out for p in spec.parts) and any(k.startswith(PREVIOUS) for rc in rcs for k in rc.state)):
        return None, None
    own = [prefixed(rc.state, PREVIOUS) for rc in rcs]
    kept = [o or start for o, start in zip(own, clients.starts)]
    assert ws.previous is not None  # workspace_for makes it where a part reads it
    return frozen_models(ws.previous, kept, taps, device), devices.upload([bool(o) for o in own], device, torch.bool)


def set_up(ws: Workspace, starts: list[Tensors], datas: list[Split], spec: MethodSpec, rcs: list[ClientRound],
           s: LocalSettings, generators: list[torch.Generator], methods: list[MethodSpec] | None) -> Round:
    """The round (``methods``: each client's own run's method where they come from stacked runs)."""
    started = time.perf_counter()
    clients = _in_stack_order(starts, datas, rcs, generators, spec, methods)
    model, device, count, form = ws.model, s.device, len(rcs), form_of(len(rcs))
    coefficients = RowCoefficients(clients.owns, device)
    own_params = list(model.named_parameters())
    trainable = [n for n, q in own_params if q.requires_grad]
    fixed = [n for n, q in own_params if not q.requires_grad]  # frozen weights (a fixed head)
    program = spec.personalization
    parts = spec.parts + program.parts
    names = form.prepare(model, clients.starts[0], parts)
    same_start = _begin(model, clients, [n for n, _ in own_params], device)
    # after begin: a part may resolve its taps from rc.model.tap_names (feature-drift depth)
    taps = tuple(sorted(frozenset().union(*(p.taps for p in parts))))
    b = _Build(ws, spec, s, clients, coefficients, trainable)
    copies = {c.name: _copy(b, form, c, _training(b, names, fixed, c), taps) for c in program.copies}
    frozen = None
    if any(p.needs_global_out for p in parts):
        assert ws.global_copy is not None  # workspace_for makes it where a part reads it
        frozen = frozen_models(ws.global_copy, clients.starts, taps, device)
    previous, present = _previous(ws, spec, clients, taps, device)
    rcs = clients.rcs
    global_params = rcs[0].global_params if same_start else \
        {n: torch.stack([rc.global_params[n] for rc in rcs]) for n in rcs[0].global_params}
    return Round(ws, spec, s, rcs, clients.order, clients.owns, coefficients, form, trainable, same_start,
                 global_params, copies, frozen, previous, present,
                 Batches(ws, clients.datas, clients.sizes, s, clients.generators),
                 [planned_steps(n, s) for n in clients.sizes], program.begin(rcs, device), started,
                 steps=[0] * count, sums=defaultdict(lambda: torch.zeros(count, dtype=torch.float64, device=device)),
                 seen=defaultdict(lambda: torch.zeros(count, dtype=torch.bool, device=device)),
                 traces=[[] for _ in range(count)] if spec.trace else None, flops=[0] * count,
                 had_previous=[any(k.startswith(PREVIOUS) for k in rc.state) for rc in rcs])
