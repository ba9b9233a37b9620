"""The client trainer, for one client (:func:`local_update`) or many at once (:func:`lockstep_update`).

One client trains on its model's own weights with the model's own (or compiled) forward — a stack
of one without the stack (:class:`_Own`: no copy of the weights, no vmap). Several clients'
models are stacked on a leading client axis and trained in lockstep: one
forward and one backward per step for all of them, so per-operator overhead is paid once instead of
once per client. The forward is the model's own stacked form where it has one
(:meth:`~fedlatent.models.base.FedModel.stacked_forward`: the MLP's layers as batched matrix
products, no per-step cost of ``vmap`` and ``functional_call``), else ``torch.func``'s
``functional_call`` under ``vmap`` (convolutions, projectors, dropout). The same update rule
(:mod:`fedlatent.losses.update`: SGD, Adam or AdamW, fresh each round or kept in the client's
state in the same entries), the same batches (each client's seeded permutations, drawn exactly as
one client alone draws them, for epochs or a budget of local steps), the same Ditto step, step
trace and FLOPs as for one client: the weights agree with the simulation backend (clients trained
one after another) up to floating-point rounding (``tests/test_vectorized.py``: every preset ×
optimiser).

Clients with fewer batches drop out of the later steps; a step whose active clients hold batches of
different sizes (an epoch's short last batch) runs once per batch size. BatchNorm statistics are
stacked with the weights and updated per client. Each client's batches and augmentation (crops,
flips, policies) are drawn from its own seeded generator in the order of a client trained alone,
so augmented runs agree too: a client's whole round is drawn at its start, and a step's batches of
all clients are one gather from their training sets held on the training device (images as uint8),
crop + flip one indexing op over the stack (:class:`_Batches`); a data set's own transform
(FLamby's) is drawn and applied client by client, batch by batch.

Parts take part per client: :meth:`~fedlatent.methods.parts.Part.begin` and
:meth:`~fedlatent.methods.parts.Part.finish` per client (round-scoped data in ``rc.scratch``,
per-client weight decay from ``rc.extra_weight_decay``), loss terms through their lockstep form
(:meth:`~fedlatent.methods.parts.Part.lockstep_loss`: FedProx, FedUV, FedDecorr, FedDyn, FedProto,
MOON, the feature-drift constraints), after-step moves through
:meth:`~fedlatent.methods.parts.Part.lockstep_drift` (SCAFFOLD: a link of the update rule's
chain, as Ditto's pull and FedDyn's decay are); the frozen global model runs once
per step for the group, MOON's previous local models stacked under ``vmap``; Ditto with its
constraints, MMD-D's deep kernels trained together. The client's program
(:mod:`fedlatent.methods.program`) decides the rest: the copies trained (one stack each: the global
copy, Ditto's or APFL's personal model), the weights a round starts from (layers kept per client:
stacked, the round-start models and the weights a term pulls towards get a client axis), the round
around the trainer (both phases of FedRep's) and each step (:class:`_GroupStep`). A term without a
lockstep form, or a copy declared not stacked, is not supported; :func:`unsupported` says why a run is not.

Dropout: ``vmap(randomness="different")`` draws an independent mask per client, from the global
generator as one client's own forward does, but not the same draws (those come client after client
there; reproducing them would serialise the step). Runs with dropout are therefore equivalent in
distribution, not in numbers: every client's masks are Bernoulli(1 − p) scaled by 1/(1 − p), drawn
afresh each step, and a run is still determined by its seed.
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Callable, NamedTuple, cast

import torch
from torch import Tensor
from torch.func import functional_call, vmap

from fedlatent.data import augment
from fedlatent.data.compact import Images
from fedlatent.data.types import Split
from fedlatent.losses import update
from fedlatent.losses.amp import LossScale
from fedlatent.federated import devices, precision, sample_dp
from fedlatent.federated.client import (PREVIOUS, LocalSettings, Workspace, _epochs, add_terms, client_upload,
                                       finish_parts, keep_models, planned_steps, prefixed, rule_of, save_optimizer,
                                       state_to_cpu)
from fedlatent.losses.update import Rule
from fedlatent.models.flops import per_sample_flops
from fedlatent.methods.coefficients import RowCoefficients
from fedlatent.methods.parts import (ClientRound, LockstepContext, MethodSpec, Part, Tensors, Upload,
                                     WithClientAxis, task_loss)
from fedlatent.methods.program import GLOBAL, ModelCopy
from fedlatent.models.base import FedModel, ModelOutput, has_dropout, mixes_batch_rows

Group = Tensor | slice | None  # a step's clients: all, a run of stack rows, or stack indices
# a step's gradients from the weights it trains (each with a leading client axis) and their leaves:
# sample-level DP-SGD's (federated.sample_dp), in place of a loss's
Gradients = Callable[[Mapping[str, Tensor], list[Tensor]], list[Tensor]]


def unsupported(spec: MethodSpec) -> str | None:
    """Why ``spec`` cannot train in lockstep (one line), or None when it can: a term without a
    lockstep form, a copy of the client's program declared not ``stacked``."""
    for part in spec.parts:
        if part.has_term() and not part.has_lockstep_form():
            return f"part '{part.name}' acts on the client's training step, which has no lockstep form yet"
    program = spec.personalization
    for copy in program.copies:
        if not copy.stacked:
            return f"the {program.kind} program's copy '{copy.name}' trains one client at a time"
    for part in program.parts:
        if not part.has_lockstep_form() or part.needs_prev_out:
            return f"the {program.kind} program's constraint '{part.name}' has no lockstep form yet"
    return None


class _Stack:
    """C models' weights on a leading client axis with their optimiser (:mod:`fedlatent.losses.update`:
    the rule every trainer uses, a chain with the method's links — FedDyn's per-row ``extra_decay``,
    Ditto's ``pull`` towards ``anchor``, SCAFFOLD's ``drift``, the ``frozen`` weights' mask; its
    state per client row, from the clients' kept states ``saved``), trained in ``arithmetic`` (``train.precision``; fp16: a loss scale per client row, from their
    kept ``scales``)."""

    def __init__(self, states: list[Tensors], names: list[str], trainable: list[str], device: torch.device,
                 rule: Rule, saved: list[Tensors], anchor: Tensors | None = None, pull: Tensor | float = 0.0,
                 drift: Tensors | None = None, extra_decay: Tensor | None = None, arithmetic: str = "fp32",
                 scales: list[Tensors] | None = None, frozen: list[str] | None = None) -> None:
        # weights and buffers (BatchNorm statistics: the forward updates them in place, per client);
        # clients that all start from one state: that state broadcast, one copy per tensor
        if all(st is states[0] for st in states):
            self.params = {n: states[0][n].to(device).expand(len(states), *states[0][n].shape).contiguous()
                           for n in names}
        else:
            self.params = {n: torch.stack([s[n] for s in states]).to(device) for n in names}
        self.trainable = trainable
        # the frozen weights: the chain's mask drops them before anything reads them (passed whole)
        self.frozen = [self.params[n] for n in frozen or []]
        self.optimizer = update.restore(rule, [self.params[n] for n in trainable] + self.frozen, trainable, saved,
                                        stacked=True, links=update.Links(
            # FedDyn's α_k (rc.extra_weight_decay) on top of train.weight_decay
            extra_decay=extra_decay if extra_decay is not None else 0.0,
            # Ditto's (λ/2)‖w − w̄‖²: λ(w − w̄) joins the loss gradient (``anchor``: one state for
            # every client, or already stacked, one row per client; λ: one, or one per row)
            pull=pull, anchor=[anchor[n].to(device).expand_as(self.params[n]) for n in trainable]
            if isinstance(pull, Tensor) or pull else None,
            # parts' after-step moves (Part.lockstep_drift, SCAFFOLD's c − c_i): p −= lr·d after each step
            correction=[drift[n].to(device) for n in trainable] if drift else None,
            mask=[True] * len(trainable) + [False] * len(self.frozen)))
        self.arithmetic, self.device = arithmetic, device
        self.scale = LossScale.restore(scales or [{}] * len(states), True, device) \
            if precision.scales_loss(arithmetic) else None

    def client_state(self, c: int) -> Tensors:
        return {n: p[c].detach().to("cpu", copy=True) for n, p in self.params.items()}

    def client_rows(self) -> list[Tensors]:
        """Every client's state, in stack order, as rows (views) of one CPU copy of the stack (on
        the CPU: of the stack itself): the server averages rows of one stack in one product
        (``methods.aggregation.weighted_mean``)."""
        rows = {n: p.detach().to("cpu").unbind(0) for n, p in self.params.items()}
        return [dict(zip(rows, values)) for values in zip(*rows.values())]

    def step(self, group: Group, loss_fn: Callable[[dict[str, Tensor]], Tensor] | None, again: bool,
             extras: Sequence[Tensor] = (), gradients: Gradients | None = None) -> list[Tensor | None]:
        """One optimiser step of the clients in ``group`` (None: all) on ``loss_fn(params).sum()``,
        or on ``gradients(params, leaves)`` (sample-level DP-SGD's, in float32), through the update
        rule's chain (the round's rate, Ditto's pull and SCAFFOLD's correction among its links);
        ``again``: some of them step again after it. Returns the gradients of ``extras`` (tensors
        the loss reads besides the weights; None with ``gradients``, or where every row skipped: fp16)."""
        def pick(t: Tensor) -> Tensor:
            return _rows(t, group)

        params = {n: pick(p).detach().requires_grad_(n in self.trainable) for n, p in self.params.items()}
        leaves = [params[n] for n in self.trainable]
        kept = None
        if gradients is not None:
            grads: list[Tensor] | tuple[Tensor, ...] = [*gradients(params, leaves), *[None] * len(extras)]
        else:
            assert loss_fn is not None
            with precision.autocast(self.arithmetic, self.device):
                loss = loss_fn(params)
            if self.scale is None:
                grads = torch.autograd.grad(loss.sum() if loss.dim() else loss, [*leaves, *extras])
            else:  # fp16: each client's loss scaled by its own scale; a row not finite skips its step
                scaled = torch.autograd.grad(self.scale.scaled(loss, group), [*leaves, *extras])
                grads, finite = self.scale.unscale(list(scaled), group)
                self.scale.update(finite, group)
                if not bool(finite.any()):
                    return [None] * len(extras)
                kept = None if bool(finite.all()) else self._snapshot()
        self.optimizer.step(leaves + self.frozen, [*grads[:len(leaves)], *[None] * len(self.frozen)], rows=group,
                            again=again)
        with torch.no_grad():
            if isinstance(group, Tensor):  # all of the above acted on the group's copies: write them back
                for n in self.params:
                    self.params[n].index_copy_(0, group, params[n])
            if kept is not None:
                self._restore(kept, _stack_rows(group, ~finite))
        return list(grads[len(leaves):])

    def _snapshot(self) -> tuple[Tensors, Any]:
        """The weights and optimiser state as they are (a copy), for :meth:`_restore`."""
        return {n: p.detach().clone() for n, p in self.params.items()}, self.optimizer.snapshot()

    def _restore(self, kept: tuple[Tensors, Any], rows: Tensor) -> None:
        """Put the stack rows ``rows`` back as :meth:`_snapshot` saw them: their step skipped (fp16's
        non-finite gradients); an optimiser slot the step created is zero there, as it was."""
        params, state = kept
        with torch.no_grad():
            for n, p in self.params.items():
                p.index_copy_(0, rows, params[n].index_select(0, rows))
        self.optimizer.restore_rows(state, rows)


class _Own:
    """One client trained on its model's own weights: a stack of one without the stack. The update
    rule moves the module's parameters in place, its own (or compiled) forward runs the batch (no
    copy of the weights, no vmap); the loss terms read the weights as views with a client axis of
    1, as they read a stack."""

    def __init__(self, module: FedModel, start: Tensors, trainable: list[str], device: torch.device, rule: Rule,
                 saved: Tensors, anchor: Tensors | None = None, pull: float = 0.0, drift: Tensors | None = None,
                 extra_decay: float = 0.0, arithmetic: str = "fp32", scale: Tensors | None = None) -> None:
        module.load_state_dict(start)
        module.train()
        self.module = module
        # the module's tensors, listed once (load_state_dict copies into them: the same objects all round)
        own = dict(module.named_parameters())
        self.views = WithClientAxis({**own, **dict(module.named_buffers())})
        self.leaves = [own[n] for n in trainable]
        self.frozen = [p for n, p in own.items() if n not in set(trainable)]  # the chain's mask drops them
        self.optimizer = update.restore(rule, self.leaves + self.frozen, trainable, [saved], stacked=False,
                                        links=update.Links(
            extra_decay=extra_decay, pull=pull, anchor=[anchor[n].to(device) for n in trainable] if pull else None,
            fused=False, correction=[drift[n][0].to(device) for n in trainable] if drift else None,
            mask=[True] * len(self.leaves) + [False] * len(self.frozen)))
        self.arithmetic, self.device = arithmetic, device
        self.scale = LossScale.restore([scale or {}], False, device) if precision.scales_loss(arithmetic) else None

    def client_state(self, c: int) -> Tensors:
        return state_to_cpu(self.module)

    def client_rows(self) -> list[Tensors]:
        return [state_to_cpu(self.module)]

    def step(self, group: Group, loss_fn: Callable[[dict[str, Tensor]], Tensor] | None, again: bool,
             extras: Sequence[Tensor] = (), gradients: Gradients | None = None) -> list[Tensor | None]:
        """One optimiser step on ``loss_fn`` of the module's weights (with a client axis of 1), or on
        ``gradients(weights, leaves)`` (sample-level DP-SGD's), through the update rule's chain;
        fp16: skipped when the unscaled gradients are not finite. Returns the gradients of
        ``extras`` (None: skipped, or with ``gradients``)."""
        if gradients is not None:
            grads = [g.reshape(p.shape) for g, p in zip(gradients(self.views, self.leaves), self.leaves)]
            self.optimizer.step(self.leaves + self.frozen, [*grads, *[None] * len(self.frozen)])
            return [None] * len(extras)
        assert loss_fn is not None
        with precision.autocast(self.arithmetic, self.device):
            loss = loss_fn(self.views)
        leaves = [*self.leaves, *extras]
        if self.scale is None:
            grads = list(torch.autograd.grad(loss.sum() if loss.dim() else loss, leaves, allow_unused=True))
        else:
            scaled = list(torch.autograd.grad(self.scale.scaled(loss), leaves, allow_unused=True))
            grads, finite = self.scale.unscale(scaled)
            self.scale.update(finite)
            if not bool(finite):
                return [None] * len(extras)
        count = len(self.leaves)
        self.optimizer.step(self.leaves + self.frozen, [*grads[:count], *[None] * len(self.frozen)])
        return grads[count:]


def _own_forward(run: Callable[..., ModelOutput], taps: tuple[str, ...]) -> Callable[[dict[str, Tensor], Tensor], ModelOutput]:
    """(params, x) ↦ the output of one client's (1, batch, …) input by the module's own forward
    ``run`` (its weights are the ones trained: ``params`` are their views)."""
    asked = frozenset(taps)

    def output(params: dict[str, Tensor], x: Tensor) -> ModelOutput:
        return _OneClientOutput(run(x[0], asked))
    return output


def _functional_own(module: FedModel, taps: tuple[str, ...]) -> Callable[[Any, Tensor], ModelOutput]:
    """(params, x) ↦ the output of one client's (1, batch, …) input by ``module`` run on the given
    weights (with a client axis of 1; those not given: the module's own), not on its own: a
    program's mixture of copies (APFL's)."""
    asked = frozenset(taps)

    def output(params: Any, x: Tensor) -> ModelOutput:
        return _OneClientOutput(functional_call(module, {n: p[0] for n, p in params.items()}, (x[0], asked)))
    return output


class _OneClientOutput(ModelOutput):
    """One client's output read as a group of one: logits, z and features get their leading client
    axis of 1 when a term reads them (a view, and an autograd node in every backward, only for what
    is read); the task loss reads ``plain`` (:func:`_logits`)."""

    def __init__(self, plain: ModelOutput) -> None:  # not the dataclass __init__: no fields of its own
        self.plain = plain

    @property  # type: ignore[override]
    def logits(self) -> Tensor:
        return self.plain.logits.unsqueeze(0)

    @property  # type: ignore[override]
    def z(self) -> Tensor:
        return self.plain.z.unsqueeze(0)

    @property  # type: ignore[override]
    def features(self) -> dict[str, Tensor]:
        return {k: v.unsqueeze(0) for k, v in self.plain.features.items()}


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


def _stacked(model: FedModel, taps: tuple[str, ...]) -> Callable[[dict[str, Tensor], Tensor], ModelOutput]:
    """(params, x) ↦ the output of stacked clients' (clients, batch, …) input: the model's
    :meth:`~fedlatent.models.base.FedModel.stacked_forward` where it has one (no vmap or
    functional_call to pay for on each step), else its forward under ``vmap``, with an
    independent dropout mask per client (see the module's docstring)."""
    if model.has_stacked_forward:
        asked = frozenset(taps)
        return lambda params, x: model.stacked_forward(params, x, asked)
    vmapped = vmap(_forward(model, taps), randomness="different" if has_dropout(model) else "error")

    def output(params: dict[str, Tensor], x: Tensor) -> ModelOutput:
        values = vmapped(params, x)
        return ModelOutput(logits=values[0], z=values[1], features=dict(zip(taps, values[2:])))
    return output


def _stream(data: Split, s: LocalSettings, generator: torch.Generator) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """One client's (indices, x, y) batches of the round, drawn from its generator in the order the
    client trained alone draws them: each epoch's permutation when the epoch starts, each batch's
    augmentation when it is taken (a data set's transform, whose draws depend on the batch). An
    empty (Poisson) batch comes with the client's first sample as its stand-in (see :func:`_planned`)."""
    for epoch in _epochs(len(data), s, generator):
        for idx in epoch:
            rows = idx if len(idx) else _STAND_IN
            # the whole stored images: a training transform may crop them to the input size
            x = data.x.full(rows) if isinstance(data.x, Images) else data.x[rows]
            yield idx, augment.augment_batch(x.to(s.device), generator, s.augment), data.y[rows].to(s.device)


class _Span(NamedTuple):
    """A client's batch in the round's plan: its rows ``start``, ``start + 1``, … (``length``)."""

    start: int
    length: int


Taken = _Span | tuple[Tensor, Tensor, Tensor]  # a batch: its span of the plan, or streamed (indices, x, y)


_STAND_IN = torch.zeros(1, dtype=torch.long)  # an empty batch's row: the client's first sample, weighted 0


def _planned(num_samples: int, s: LocalSettings, generator: torch.Generator, offset: int,
             images: bool) -> tuple[list[Tensor], list[dict[str, Tensor]], list[int]]:
    """One client's round drawn at its start, in the order a client streaming its batches draws
    it: each epoch's permutation when the epoch starts, then each of its batches' augmentation
    draws (:func:`fedlatent.data.augment.draw`: crop offsets, flips, the policy's; none without
    augmentation or for inputs that are not ``images``); the batches as rows of the pool (its
    ``offset`` added to each permutation), and their sizes. An empty batch (Poisson sampling's)
    holds one stand-in row, the client's first sample, so that a step's forward has an input: its
    size 0 weights it 0."""
    rows, drawn, sizes = [], [], []
    for epoch in _epochs(num_samples, s, generator, offset):
        for idx in epoch:
            sizes.append(len(idx))
            if not len(idx):
                idx = _STAND_IN + offset
            rows.append(idx)
            if s.augment and images:
                drawn.append(augment.draw(len(idx), generator, s.augment))
    return rows, drawn, sizes


class _Batches:
    """The round's batches of the clients of one stack, drawn from each client's generator in the
    order of a client trained alone.

    Planned (no augmentation, crop + flip, AutoAugment): at the start of the round, each client's
    whole round is drawn on the host (:func:`_planned`: its permutations and every batch's
    augmentation draws, in the order a client streaming its batches draws them: a few small draws
    per batch, nothing per sample), and held with the rows on the training device; a step's batches
    of a group are then one gather of the members' rows from the pool (the clients' training sets
    concatenated and moved to the device once, images as uint8, standardised when gathered), and
    crop + flip as one indexing op over the (clients × batch) images, the policy once for them all.
    Streamed (a data set's transform, which decides per batch how to resample): client by client
    (:func:`_stream`), the batches stacked. One client on a device that trains channels_last
    (:mod:`fedlatent.federated.devices`) gets its 4-D batch in that layout; stacked clients run
    under ``vmap`` on 5-D inputs, where it does not apply."""

    def __init__(self, ws: Workspace, datas: list[Split], sizes: list[int], s: LocalSettings,
                 generators: list[torch.Generator]) -> None:
        self.device = s.device
        self.layout = len(datas) == 1 and ws.model is not None and devices.channels_last(s.device) \
            and devices.convolutional(ws.model)
        self.streams: list[Iterator[Taken]]
        if s.augment and not augment.pooled(s.augment):
            self.streams = [_stream(d, s, g) for d, g in zip(datas, generators)]
            return
        self.pool = _pool(ws, datas, s.device)
        self.augment = s.augment if len(self.pool.x.shape) == 4 else False  # inputs that are not images pass
        plans = [_planned(n, s, g, offset, bool(self.augment))
                 for n, g, offset in zip(sizes, generators, [0, *accumulate(sizes)][:-1])]
        rows = [idx for plan_rows, _, _ in plans for idx in plan_rows]
        lengths = [len(idx) for idx in rows]
        starts = iter([0, *accumulate(lengths)])
        self.streams = [iter([_Span(next(starts), size) for size in plan_sizes]) for _, _, plan_sizes in plans]
        self.rows = (torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)).to(s.device)
        drawn = [d for _, plan_drawn, _ in plans for d in plan_drawn]
        whole = {k: torch.cat([d[k] for d in drawn]) for k in (drawn[0] if drawn else {})}
        # the draws the augmentation reads on the host (AutoAugment's: which images each operation takes) stay there
        self.host_drawn = {k: v for k, v in whole.items() if k in augment.READ_ON_HOST}
        self.drawn = {k: v.to(s.device) for k, v in whole.items() if k not in augment.READ_ON_HOST}

    def take(self, active: list[int]) -> dict[int, Taken]:
        """The next batch of each client of ``active``."""
        return {c: next(self.streams[c]) for c in active}

    @staticmethod
    def size(batch: Taken) -> int:
        return batch.length if isinstance(batch, _Span) else len(batch[0])

    def stacked(self, taken: dict[int, Taken], members: list[int], size: int) -> tuple[Tensor, Tensor]:
        """The (clients, size, …) inputs and (clients, size) labels of ``members``' batches, a
        shorter batch padded with copies of its last sample (:func:`_padded`; planned: its last
        row and that row's draws again; an empty batch: its stand-in row)."""
        first = taken[members[0]]
        if not isinstance(first, _Span):
            streamed = cast(list[tuple[Tensor, Tensor, Tensor]], [taken[c] for c in members])
            x = torch.stack([_padded(b[1], size) for b in streamed])
            y = torch.stack([_padded(b[2], size) for b in streamed])
            return self._laid(x.flatten(0, 1)).unflatten(0, x.shape[:2]), y
        spans = cast(list[_Span], [taken[c] for c in members])
        pos: Tensor | slice
        at: Tensor | slice  # the positions on the host, for the draws kept there
        if len(spans) == 1 and first.length == size:  # one client's whole batch: views of the plan
            pos = at = slice(first.start, first.start + size)
        else:  # each batch's positions in the plan, a shorter one's last repeated (one copy to the device)
            starts, lengths = torch.tensor([[sp.start, sp.length] for sp in spans]).unbind(1)
            last = (lengths[:, None] - 1).clamp(min=0)
            at = (starts[:, None] + torch.minimum(torch.arange(size), last)).flatten()
            pos = devices.upload(at, self.device)
        rows = self.rows[pos]
        if self.augment:  # the whole stored images, as a streamed batch takes them
            x = self.pool.x.full(rows) if isinstance(self.pool.x, Images) else self.pool.x.index_select(0, rows)
            x = augment.apply(x, {**{k: v[pos] for k, v in self.drawn.items()},
                                  **{k: v[at] for k, v in self.host_drawn.items()}}, self.augment)
        else:
            x = _take(self.pool.x, rows)
        shape = (len(members), size)
        return self._laid(x).unflatten(0, shape), _take(self.pool.y, rows).unflatten(0, shape)

    def _laid(self, x: Tensor) -> Tensor:
        """The (clients × batch, …) inputs in the device's layout (:func:`devices.batch_layout`);
        unflattening the client axis keeps each client's view in it."""
        return devices.batch_layout(x, self.layout)


def _take(values: Tensor | Images, rows: Tensor) -> Tensor:
    """The ``rows`` of ``values``: ``index_select`` for a tensor (~3× faster than indexing with
    a tensor of rows), the images' own indexing for compact images."""
    return values.index_select(0, rows) if isinstance(values, Tensor) else values[rows]


def _pool(ws: Workspace, datas: list[Split], device: torch.device) -> Split:
    """The clients' training sets one after another, on ``device`` (images as compact uint8): the
    workspace's last pool when it holds the same sets (a round of the same clients), else a new
    one, kept there in its place (the old one let go first: one pool in memory at a time, as when
    each round made its own). One client on the CPU: its own set, nothing to copy."""
    kept = ws.pool
    if kept is not None and len(kept[0]) == len(datas) and all(a is b for a, b in zip(kept[0], datas)):
        return kept[1]
    if len(datas) == 1 and torch.device(device).type == "cpu":
        return datas[0]
    ws.pool = kept = None
    joined = datas[0] if len(datas) == 1 else Split.concat(datas)
    ws.pool = (tuple(datas), joined.to(device))
    return ws.pool[1]


def _padded(rows: Tensor, size: int) -> Tensor:
    """``rows`` with copies of its last row appended up to ``size`` rows (the padding of a shorter
    batch: real data, so that the forward stays finite; weighted zero in the loss)."""
    return rows if len(rows) == size else torch.cat([rows, rows[-1:].expand(size - len(rows), *rows.shape[1:])])


def _step_groups(active: list[int], sizes: dict[int, int], pad: bool) -> list[list[int]]:
    """The groups of ``active`` clients that take this step together: all of them when shorter
    batches may be padded (``pad``), else one group per batch size."""
    if pad:
        return [active]
    by_size: dict[int, list[int]] = defaultdict(list)
    for c in active:
        by_size[sizes[c]].append(c)
    return list(by_size.values())


def _row_weights(sizes: list[int], size: int, device: torch.device) -> Tensor | None:
    """(clients, size) 1 for a real row and 0 for padding, or None when no batch is padded."""
    if min(sizes) == size:
        return None
    return (torch.arange(size, device=device) < devices.upload(sizes, device)[:, None]).to(torch.get_default_dtype())


class _Shared:
    """A frozen model the group's clients share, run on a (clients, batch, …) input as one plain
    forward (eval mode: no batch statistics, so flattening the clients together changes nothing):
    the round-start model every client starts from, or one client's previous local model."""

    def __init__(self, module: FedModel, state: Tensors, taps: tuple[str, ...]) -> None:
        module.load_state_dict(state)
        module.eval()
        self.module, self.taps = module, frozenset(taps)

    def out(self, group: Group, x: Tensor) -> ModelOutput:
        with torch.no_grad():
            flat = self.module(x.flatten(0, 1), self.taps)
        return ModelOutput(*(v.unflatten(0, x.shape[:2]) for v in (flat.logits, flat.z)),
                           features={k: v.unflatten(0, x.shape[:2]) for k, v in flat.features.items()})


class _Frozen:
    """Frozen models, one per client, stacked and run under ``vmap`` in eval mode (BatchNorm reads
    its running statistics): MOON's previous local models, or the round-start models when the
    clients start from different weights (layers kept per client)."""

    def __init__(self, module: FedModel, states: list[Tensors], taps: tuple[str, ...], device: torch.device) -> None:
        self.params = {n: torch.stack([st[n] for st in states]).to(device) for n in states[0]}
        module.eval()  # functional_call runs the module's mode
        self.forward = _stacked(module, taps)

    def out(self, group: Group, x: Tensor) -> ModelOutput:
        with torch.no_grad():
            return self.forward(_pick(self.params, group), x)


def _rows(t: Tensor | None, group: Group) -> Tensor | None:
    """The rows of ``group`` (None: all; a slice: a view, so in-place updates reach the stack) of
    a stacked tensor."""
    if t is None or group is None:
        return t
    return t[group] if isinstance(group, slice) else t.index_select(0, group)


def _group(members: list[int], count: int, device: torch.device) -> Group:
    """The stack rows of a step's ``members`` (increasing): None for all, a slice for a run of
    adjacent rows (no copies), else their indices."""
    if len(members) == count:
        return None
    if members[-1] - members[0] + 1 == len(members):
        return slice(members[0], members[-1] + 1)
    return devices.upload(members, device)


def _pick(values: dict[str, Tensor], group: Group) -> dict[str, Tensor]:
    return {n: _rows(v, group) for n, v in values.items()}


def local_update(ws: Workspace, global_state: Tensors, data: Split, spec: MethodSpec, rc: ClientRound,
                 s: LocalSettings, generator: torch.Generator) -> Upload:
    """Train one client from ``global_state`` on ``data`` (the trainer with a stack of one: the
    model's own weights and forward); update ``rc.state`` in place; return the upload."""
    return lockstep_update(ws, global_state, [data], spec, [rc], s, [generator])[0]


def lockstep_update(ws: Workspace, global_state: Tensors, datas: list[Split], spec: MethodSpec,
                    rcs: list[ClientRound], s: LocalSettings, generators: list[torch.Generator]) -> list[Upload]:
    """Train the clients of ``rcs`` from ``global_state`` on ``datas`` at once, as their program
    has it (its start weights, its round around the trainer); update each ``rc.state`` in place and
    return their uploads (as :func:`local_update` would, one by one)."""
    return _program_round(ws, [global_state] * len(rcs), datas, spec, rcs, s, generators)


def lockstep_runs(ws: Workspace, global_states: list[Tensors], datas: list[Split], specs: list[MethodSpec],
                  rcs: list[ClientRound], s: LocalSettings, generators: list[torch.Generator]) -> list[Upload]:
    """Train clients of several runs at once, client c from ``global_states[c]`` (its run's global
    state: one object for the clients of one run) with ``specs[c]``, its run's method — the cells of
    a study stacked (:mod:`fedlatent.backends.stacked`). The runs share ``s`` and their methods'
    shape (:func:`fedlatent.methods.coefficients.method_shape`): they may differ in coefficients,
    each client's terms then reading its own. A client's numbers are those of its run trained
    alone, up to floating-point rounding. A program that trains in phases around the trainer
    (partial personalisation) is not stacked across runs."""
    program = specs[0].personalization
    if not program.stacks_runs:
        raise ValueError(f"the {program.kind} program is not trained across runs")
    return _program_round(ws, global_states, datas, specs[0], rcs, s, generators, methods=specs)


def _program_round(ws: Workspace, starts: list[Tensors], datas: list[Split], spec: MethodSpec,
                   rcs: list[ClientRound], s: LocalSettings, generators: list[torch.Generator],
                   methods: list[MethodSpec] | None = None) -> list[Upload]:
    """The program's round: its start weights from the round's ``starts``, its round around the
    trainer (``methods``: the clients' own runs' methods, where they come from stacked runs)."""
    program = spec.personalization

    def train(starts_: list[Tensors], spec_: MethodSpec, rcs_: list[ClientRound], s_: LocalSettings) -> list[Upload]:
        return _train_together(ws, starts_, datas, spec_, rcs_, s_, generators, methods)
    return program.round(ws.model, program.start(ws.model, starts, spec, rcs, datas, s), spec, rcs, s, train)


def _train_together(ws: Workspace, starts: list[Tensors], datas: list[Split], spec: MethodSpec,
                    rcs: list[ClientRound], s: LocalSettings, generators: list[torch.Generator],
                    methods: list[MethodSpec] | None = None) -> list[Upload]:
    """Train client c of ``rcs`` from ``starts[c]`` (one object for all when they start from the
    global state) on ``datas[c]``, all at once (``methods[c]``: its run's method where the clients
    come from stacked runs: ``spec``'s shape, their own coefficients, :class:`RowCoefficients`): set
    up the round (:func:`_set_up`), take its steps (:func:`_take_steps`), finish it (:func:`_finish`)."""
    r = _set_up(ws, starts, datas, spec, rcs, s, generators, methods)
    _take_steps(r)
    return _finish(r)


@dataclass
class _Copy:
    """A copy the program trains this round: its declaration, its weights with their update rule
    (stacked, or the module's own for one client), its forward on them and on given weights (a
    program's mixture), and, under sample-level DP-SGD, its private gradients. The global copy's
    objective takes the method's parts, any other copy the program's."""

    decl: ModelCopy
    stack: _Stack | _Own
    forward: Callable[[Any, Tensor], ModelOutput]
    functional: Callable[[Any, Tensor], ModelOutput]
    private: sample_dp.PrivateGradients | None = None

    @property
    def personal(self) -> bool:
        return self.decl.name != GLOBAL


@dataclass
class _Round:
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
    one: bool
    trainable: list[str]
    same_start: bool
    global_params: Tensors  # the round-start weights: no client axis when shared, else stacked
    copies: dict[str, _Copy]
    frozen: _Shared | _Frozen | None
    previous: _Frozen | _Shared | None
    present: Tensor | None
    draws: _Batches
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


def _set_up(ws: Workspace, starts: list[Tensors], datas: list[Split], spec: MethodSpec, rcs: list[ClientRound],
            s: LocalSettings, generators: list[torch.Generator], methods: list[MethodSpec] | None) -> _Round:
    """The round's clients sorted by training-set size (so that clients of one size draw batches of
    the same sizes and a step's group is mostly a run of adjacent rows: trained on views of the
    stack, not on copies written back), the parts' ``begin``, a stack (or the module's own weights)
    per copy of the program, the frozen models the parts read, the batches."""
    started = time.perf_counter()
    sizes = [len(d) for d in datas]
    order = sorted(range(len(rcs)), key=sizes.__getitem__)
    starts, datas, rcs, generators, sizes = ([xs[c] for c in order] for xs in (starts, datas, rcs, generators, sizes))
    owns = [methods[c] for c in order] if methods else [spec] * len(rcs)
    coefficients = RowCoefficients(owns, s.device)
    model, device, count = ws.model, s.device, len(rcs)
    one = count == 1  # one client: its own modules, no stack
    if not one:
        model.train()  # the template's mode is what functional_call runs (BatchNorm: batch statistics)
    names = [] if one else list(model.state_dict())
    own_params = list(model.named_parameters())
    param_names = [n for n, _ in own_params]
    trainable = [n for n, q in own_params if q.requires_grad]
    fixed = [n for n, q in own_params if not q.requires_grad]  # frozen weights (a fixed head)
    program = spec.personalization
    parts = spec.parts + program.parts
    same_start = all(st is starts[0] for st in starts)
    if not one and any(type(p).begin is not Part.begin for p in parts):
        model.load_state_dict(starts[0])  # what begin may read off rc.model (shapes, devices)
    shared = {n: starts[0][n].to(device) for n in param_names} if same_start else None
    for rc, start, own_spec in zip(rcs, starts, owns):
        # the parts read the model this call trains: begin its shapes, finish the trained weights
        # (loaded below); a client of another stacked run came with its own run's idle model, and
        # begins with its run's own parts (their coefficients: FedDyn's α_k)
        rc.model = model
        rc.global_params = dict(shared) if shared is not None else {n: start[n].to(device) for n in param_names}
        for part in own_spec.all_parts():
            part.begin(rc)
    # after begin: a part may resolve its taps from rc.model.tap_names (feature-drift depth)
    taps = tuple(sorted(frozenset().union(*(p.taps for p in parts))))
    stacked_forward = None if one else _stacked(model, taps)
    rule = rule_of(s)

    def kept(prefix: str) -> list[Tensors]:
        return [prefixed(rc.state, prefix) if s.keep_optimizer else {} for rc in rcs]

    def scales(prefix: str) -> list[Tensors]:  # fp16's loss scales: kept across rounds, as GradScaler's is
        return [prefixed(rc.state, prefix) for rc in rcs]

    # sample-level DP-SGD: each copy's private gradients, its noise drawn per client (validation
    # leaves only per-sample task losses and parameter-only terms, float32, no BatchNorm, and
    # programs whose copies each take one step on their own objective)
    private = sample_dp.enabled(s)

    def gradients(copy: ModelCopy) -> sample_dp.PrivateGradients | None:
        which = sample_dp.GLOBAL if copy.name == GLOBAL else sample_dp.PERSONAL
        return sample_dp.PrivateGradients(model, spec.loss, spec.temperature, s, rcs, sizes, trainable, which) \
            if private else None

    def trained(copy: ModelCopy) -> _Copy:
        if copy.name == GLOBAL:  # the parts' drift (SCAFFOLD) and decay (FedDyn) act on the global copy
            drift = _drift(spec.parts, rcs, trainable)
            decay = [rc.extra_weight_decay for rc in rcs]
            if one:
                stack: _Stack | _Own = _Own(model, starts[0], trainable, device, rule, kept(copy.optim_prefix)[0],
                                           drift=drift, extra_decay=decay[0], arithmetic=s.precision,
                                           scale=scales(copy.amp_prefix)[0])
                own = _own_forward(model if ws.forward is None else ws.forward, taps)
                return _Copy(copy, stack, own, _functional_own(model, taps), gradients(copy))
            stack = _Stack(starts, names, trainable, device, rule, kept(copy.optim_prefix), drift=drift,
                           extra_decay=torch.tensor(decay, device=device) if any(decay) else None,
                           arithmetic=s.precision, scales=scales(copy.amp_prefix), frozen=fixed)
            return _Copy(copy, stack, stacked_forward, stacked_forward, gradients(copy))
        # a copy of the client's own: kept across rounds, the round's start until it has one
        own_starts = [(prefixed(rc.state, copy.prefix) if copy.kept else {}) or start for rc, start in zip(rcs, starts)]
        module = ws.copies[copy.name]
        if one:
            stack = _Own(module, own_starts[0], trainable, device, rule, kept(copy.optim_prefix)[0], anchor=starts[0],
                         pull=copy.pull, arithmetic=s.precision, scale=scales(copy.amp_prefix)[0])
            return _Copy(copy, stack, _own_forward(module, taps), _functional_own(module, taps), gradients(copy))
        # pulled towards each client's own start (the runs of a stack start from their own global states),
        # by each row's own run's pull
        anchor = starts[0] if same_start else {n: torch.stack([st[n] for st in starts]) for n in trainable}
        stack = _Stack(own_starts, names, trainable, device, rule, kept(copy.optim_prefix), anchor=anchor,
                       pull=coefficients.pull(copy.name), arithmetic=s.precision, scales=scales(copy.amp_prefix),
                       frozen=fixed)
        return _Copy(copy, stack, stacked_forward, stacked_forward, gradients(copy))

    copies = {copy.name: trained(copy) for copy in program.copies}
    frozen: _Shared | _Frozen | None = None
    if any(p.needs_global_out for p in parts):
        frozen = _Shared(ws.global_copy, starts[0], taps) if same_start else _Frozen(ws.global_copy, starts, taps, device)
    previous: _Frozen | _Shared | None = None
    present = None
    if any(p.needs_prev_out for p in spec.parts) and any(k.startswith(PREVIOUS) for rc in rcs for k in rc.state):
        own = [prefixed(rc.state, PREVIOUS) for rc in rcs]  # the start as a stand-in where a client has none
        kept_models = [o or start for o, start in zip(own, starts)]
        previous = _Shared(ws.previous, kept_models[0], taps) if one else \
            _Frozen(ws.previous, kept_models, taps, device)
        present = devices.upload([bool(o) for o in own], device, torch.bool)
    global_params = rcs[0].global_params if same_start else \
        {n: torch.stack([rc.global_params[n] for rc in rcs]) for n in rcs[0].global_params}
    return _Round(ws, spec, s, rcs, order, owns, coefficients, one, trainable, same_start, global_params, copies,
                  frozen, previous, present, _Batches(ws, datas, sizes, s, generators), [planned_steps(n, s) for n in sizes],
                  program.begin(rcs, device), started, steps=[0] * count,
                  sums=defaultdict(lambda: torch.zeros(count, dtype=torch.float64, device=device)),
                  seen=defaultdict(lambda: torch.zeros(count, dtype=torch.bool, device=device)),
                  traces=[[] for _ in range(count)] if spec.trace else None, flops=[0] * count,
                  had_previous=[any(k.startswith(PREVIOUS) for k in rc.state) for rc in rcs])


def _take_steps(r: _Round) -> None:
    """The round's steps: each step, the clients that still have a batch, each group's step taken by
    the program (:meth:`~fedlatent.methods.program.ClientProgram.step`).

    Where no row's loss reads another row of its batch (no BatchNorm, no term that reads the
    batch), every client takes each step together, a batch shorter than the others (a client's
    last, or a smaller client's) padded and weighted zero in the task loss. Otherwise a step
    groups the clients by batch size."""
    spec, s, device = r.spec, r.s, r.s.device
    indices: dict[tuple[int, ...], Tensor] = {}  # a step's members as the sums' row index, made once per group
    groups: dict[tuple[int, ...], Group] = {}  # their stack rows, made once per group
    padding: dict[tuple[tuple[int, ...], int], Tensor | None] = {}  # row weights, made once per batch sizes
    active = [c for c in range(r.count) if r.total[c]]
    # batches of different sizes share a step, padded, where no row's loss reads another row
    pad = not r.one and not mixes_batch_rows(r.ws.model) and not any(p.has_term() and p.term_reads_batch
                                                                     for p in r.parts)
    while active:
        taken = r.draws.take(active)
        batch_sizes = {c: r.draws.size(taken[c]) for c in active}
        for c in active:
            r.steps[c] += 1
        for members in _step_groups(active, batch_sizes, pad):
            if tuple(members) not in groups:
                groups[tuple(members)] = _group(members, r.count, device)
            group = groups[tuple(members)]
            member_sizes = [batch_sizes[c] for c in members]
            size = max(*member_sizes, 1)  # a step of empty Poisson batches runs on their stand-in rows
            if (tuple(member_sizes), size) not in padding:
                padding[tuple(member_sizes), size] = _row_weights(member_sizes, size, device)
            x, y = r.draws.stacked(taken, members, size)
            rows = None
            if r.traces is not None:
                rows = [{} for _ in members]
                for c, row in zip(members, rows):
                    r.traces[c].append(row)
            index = indices.get(tuple(members))
            if index is None:
                index = indices[tuple(members)] = devices.upload(members, device)
            with precision.autocast(s.precision, device):  # frozen models' forwards: as the trained one's
                global_out = r.frozen.out(group, x) if r.frozen is not None else None
                prev_out = r.previous.out(group, x) if r.previous is not None else None
            # a buffer is needed again when a client steps again, or keeps its optimiser state for the next round
            again = s.keep_optimizer or any(r.steps[c] < r.total[c] for c in members)
            spec.personalization.step(_GroupStep(
                r, group, members, member_sizes, x, y, padding[tuple(member_sizes), size], global_out, prev_out,
                _rows(r.present, group), r.global_params if r.same_start else _pick(r.global_params, group),
                index, rows, again))
            if spec.count_flops:
                if r.per_sample is None:
                    r.per_sample = _sample_flops(r.ws, tuple(x.shape[2:]), r.frozen is not None,
                                                 spec.personalization.passes)
                step_flops, forward_flops = r.per_sample
                for c in members:  # the previous local model runs for the clients that have one
                    r.flops[c] += batch_sizes[c] * (step_flops + (r.previous is not None and r.had_previous[c])
                                                    * forward_flops)
        active = [c for c in active if r.steps[c] < r.total[c]]


class _GroupStep:
    """A step of a group of clients as their program sees it (:class:`fedlatent.methods.program.Step`):
    the batch, the frozen models' outputs on it, the group's rows of the round's stacks, the
    coefficients its members' terms read."""

    def __init__(self, r: _Round, group: Group, members: list[int], sizes: list[int], x: Tensor, y: Tensor,
                 weights: Tensor | None, global_out: ModelOutput | None, prev_out: ModelOutput | None,
                 present: Tensor | None, global_params: Tensors, index: Tensor,
                 trace: list[dict[str, Any]] | None, again: bool) -> None:
        self.r, self.group, self.members, self.sizes = r, group, members, sizes
        self.x, self.y, self.row_weights = x, y, weights
        self.global_out, self.prev_out, self.present = global_out, prev_out, present
        self.global_params, self.index, self.trace, self.again = global_params, index, trace, again
        self.rcs = [r.rcs[c] for c in members]
        self.data, self.lr = r.data, r.s.lr

    def _recorder(self, trained: _Copy) -> Callable[[str, Tensor, Tensor | None], None]:
        """Records the copy's losses and terms (a copy of the client's own under its name's prefix)."""
        return _recorder(self.r.sums, self.r.seen, self.index, self.trace,
                         f"{trained.decl.name}_" if trained.personal else "", trained.decl.loss_key)

    def objective(self, copy: str, weights: Callable[[Mapping[str, Tensor]], Mapping[str, Tensor]] | None = None,
                  recorded: bool = True) -> Callable[[Mapping[str, Tensor]], Tensor]:
        r, trained = self.r, self.r.copies[copy]
        spec, decl = r.spec, trained.decl
        forward = trained.forward if weights is None else trained.functional
        record = self._recorder(trained) if recorded else _unrecorded
        parts = r.coefficients.parts(self.members, personal=trained.personal)

        def loss(params: Mapping[str, Tensor]) -> Tensor:
            used = params if weights is None else weights(params)
            out = forward(used, self.x)
            task = _task_losses(spec.loss, _logits(out), self.y, spec.temperature, self.row_weights)
            record(decl.loss_key, task)
            # the previous local model's output is the global copy's term's (MOON)
            return _with_terms(task, parts, LockstepContext(
                out, self.y, used, self.global_params, self.global_out, r.s.num_classes, self.rcs,
                None if trained.personal else self.prev_out, None if trained.personal else self.present), record)
        return loss

    def train(self, copy: str, objective: Callable[[Mapping[str, Tensor]], Tensor] | None = None,
              extras: Sequence[Tensor] = (), again: bool | None = None) -> list[Tensor | None]:
        trained = self.r.copies[copy]
        again = self.again if again is None else again
        if trained.private is not None:  # validation leaves DP-SGD only the copies' own objectives
            return trained.stack.step(self.group, None, again, extras, self._private(trained))
        return trained.stack.step(self.group, objective or self.objective(copy), again, extras)

    def _private(self, trained: _Copy) -> Gradients:
        """The copy's gradients under sample-level DP-SGD: the members' private gradients of the task
        loss (:class:`~fedlatent.federated.sample_dp.PrivateGradients`), then the gradients of the
        parameter-only terms of its parts (FedProx's, FedDyn's: no data, added after the noise); the
        task loss and each term recorded as its objective records them."""
        assert trained.private is not None
        private, record, r = trained.private, self._recorder(trained), self.r
        parts = r.coefficients.parts(self.members, personal=trained.personal)

        def gradients(params: Mapping[str, Tensor], leaves: list[Tensor]) -> list[Tensor]:
            grads, task = private(params, self.members, self.x, self.y, self.row_weights, self.sizes)
            record(trained.decl.loss_key, task, None)
            context = LockstepContext(cast(ModelOutput, None), self.y, params, self.global_params, None,
                                      r.s.num_classes, self.rcs)
            terms = _with_terms(task.new_zeros(len(self.members)), parts, context, record)
            if not terms.requires_grad:
                return grads
            extra = torch.autograd.grad(terms.sum(), leaves, allow_unused=True)
            return [g if e is None else g + e.reshape(g.shape) for g, e in zip(grads, extra)]
        return gradients

    def part(self, index: int, parts: int) -> _GroupStep:
        """The step on part ``index`` of ``parts`` of each member's batch: its rows sliced where the
        members' batches are whole (one size), else the padded batch with row weights picking each
        member's part of its real rows (rows independent: a padded step has no BatchNorm and no term
        reading the batch, so the two agree)."""
        if parts == 1:
            return self
        size = self.x.shape[1]
        if self.row_weights is None:
            if size < 2 * parts:
                return self
            lo, hi = index * size // parts, (index + 1) * size // parts
            return _GroupStep(self.r, self.group, self.members, [hi - lo] * len(self.members), self.x[:, lo:hi],
                              self.y[:, lo:hi], None, _batch_rows(self.global_out, lo, hi),
                              _batch_rows(self.prev_out, lo, hi), self.present, self.global_params, self.index,
                              self.trace, self.again)
        bounds = [(0, n) if n < 2 * parts else (index * n // parts, (index + 1) * n // parts) for n in self.sizes]
        first, end = devices.upload(bounds, self.row_weights.device).unbind(1)
        rows = torch.arange(size, device=self.row_weights.device)
        weights = ((rows >= first[:, None]) & (rows < end[:, None])).to(self.row_weights)
        return _GroupStep(self.r, self.group, self.members, [hi - lo for lo, hi in bounds], self.x, self.y, weights,
                          self.global_out, self.prev_out, self.present, self.global_params, self.index, self.trace,
                          self.again)

    def weights(self, copy: str) -> dict[str, Tensor]:
        stack = self.r.copies[copy].stack
        if isinstance(stack, _Own):
            return {n: stack.views[n].detach() for n in stack.views}
        return {n: _rows(p, self.group).detach() for n, p in stack.params.items()}

    def rows(self, values: Tensor) -> Tensor:
        return _rows(values, self.group)

    def put(self, values: Tensor, rows: Tensor) -> None:
        with torch.no_grad():
            if self.group is None:
                values.copy_(rows)
            elif isinstance(self.group, slice):
                values[self.group] = rows
            else:
                values.index_copy_(0, self.group, rows)


def _finish(r: _Round) -> list[Upload]:
    """The end of the round per client: the parts' ``finish`` on its trained weights, what it keeps
    (the program's kept copies and values, MOON's previous model, the kept optimiser states and
    loss scales), its upload; in the caller's order."""
    spec, s = r.spec, r.s
    program = spec.personalization
    seconds = time.perf_counter() - r.started
    uploads = []
    finishing = any(type(p).finish is not Part.finish for p in spec.parts)
    rows = r.copies[GLOBAL].stack.client_rows()  # views: keep_models copies what a client keeps (MOON)
    # the round's one read of its recorded values off the device: per client, as Python floats
    sums_of, seen_by = _host_rows(r.sums), _host_rows(r.seen)
    if r.traces is not None:
        _read_traces(r.traces)
    losses = [c.loss_key for c in program.copies]
    for c, (rc, trained, own_spec) in enumerate(zip(r.rcs, rows, r.owns)):
        rc.steps = r.steps[c]
        if finishing and not r.one:
            r.ws.model.load_state_dict(trained)  # finish reads the trained weights off rc.model
        extras = finish_parts(rc, own_spec.all_parts())  # each client's own run's parts (stacked runs)
        client = None if r.one else c
        keep_models(rc, own_spec, trained, {name: t.stack.client_state(c) for name, t in r.copies.items()
                                            if t.decl.kept})
        if s.keep_optimizer:
            for t in r.copies.values():
                save_optimizer(t.stack.optimizer, r.trainable, rc.state, t.decl.optim_prefix, client=client)
        for t in r.copies.values():
            if t.stack.scale is not None:
                rc.state.update(t.stack.scale.save(t.decl.amp_prefix, client))
        program.finish(rc, c, r.data)
        own = {k: v[c] for k, v in sums_of.items() if k in losses or seen_by[k][c]}
        uploads.append(client_upload(rc, trained, s, extras, own, rc.steps, seconds / r.count,
                                     r.flops[c] if spec.count_flops else None,
                                     r.traces[c] if r.traces is not None else None, program.copies))
    return [uploads[i] for i in sorted(range(r.count), key=r.order.__getitem__)]  # the caller's order


def _host_rows(values: dict[str, Tensor]) -> dict[str, list]:
    """Each key's per-client values as Python numbers, read off the device in one copy."""
    keys = list(values)
    return dict(zip(keys, torch.stack([values[k] for k in keys]).tolist())) if keys else {}


def _read_traces(traces: list[list[dict[str, Any]]]) -> None:
    """The step traces' values, recorded on the device as (value, present) pairs, read in one copy
    and written into their rows as Python floats; a value its client had no term for (present
    False) is left out, as its term is."""
    cells = [(row, name, value, on) for rows in traces for row in rows for name, (value, on) in row.items()]
    if not cells:
        return
    values = torch.stack([value for _, _, value, _ in cells])
    ons = torch.stack([torch.ones_like(value, dtype=torch.bool) if on is None else on for _, _, value, on in cells])
    for (row, name, _, _), value, on in zip(cells, values.tolist(), ons.tolist()):
        if on:
            row[name] = value
        else:
            del row[name]


def _unrecorded(key: str, values: Tensor, present: Tensor | None = None) -> None:
    """The recorder of an objective left out of the metrics (an inner computation's)."""


def _batch_rows(out: ModelOutput | None, lo: int, hi: int) -> ModelOutput | None:
    """The rows ``lo`` … ``hi`` − 1 of each client's batch in a (clients, batch, …) output."""
    if out is None:
        return None
    return ModelOutput(out.logits[:, lo:hi], out.z[:, lo:hi], {k: v[:, lo:hi] for k, v in out.features.items()})


def _stack_rows(group: Group, rows: Tensor) -> Tensor:
    """The stack's row indices of the group members that ``rows`` (a (members,) mask) marks."""
    if group is None:
        return rows.nonzero().flatten()
    if isinstance(group, slice):
        return rows.nonzero().flatten() + (group.start or 0)
    return group[rows]


def _logits(out: ModelOutput) -> Tensor:
    """The logits the task loss reads: (clients, batch, classes), or one client's own (batch, classes)."""
    return out.plain.logits if isinstance(out, _OneClientOutput) else out.logits


def _task_losses(kind: str, logits: Tensor, y: Tensor, temperature: float, weights: Tensor | None = None) -> Tensor:
    """Per-client :func:`~fedlatent.methods.parts.task_loss` of (clients, batch, classes) logits:
    the same means, from one call outside vmap (cross-entropy's batching rule is a slow
    decomposition); ``weights`` (clients, batch): each client's mean over its real rows only. One
    client's own (batch, classes) logits: its batch mean as a plain loop takes it, a 0-d loss (no
    client axis to add and remove in every backward)."""
    if logits.dim() == 2:
        return task_loss(kind, logits, y[0], temperature=temperature)
    per = task_loss(kind, logits, y, reduction="none", temperature=temperature)  # (clients, batch[, classes])
    if weights is None:
        return per.flatten(1).mean(1)
    per_row = per if per.dim() == 2 else per.mean(2)  # MSE: per sample and class
    return (per_row * weights).sum(1) / weights.sum(1)


def _recorder(sums: dict[str, Tensor], seen: dict[str, Tensor], index: Tensor,
              trace: list[dict[str, Any]] | None = None, prefix: str = "",
              loss_key: str = "train_loss") -> Callable[[str, Tensor, Tensor | None], None]:
    """Adds a (group,) tensor of per-client values to the running per-client sums under ``key``,
    for the clients ``present`` marks (all by default: a term absent for a client, as MOON's
    without a previous model, is left out of its metrics);
    when the step is traced, each member's value also into its row of ``trace`` under the
    step-trace key: ``prefix`` + the key, the copy's task loss ``loss_key`` as ``prefix`` + ``task``
    (``prefix``: ``personal_`` for Ditto's personal step). ``index``: the members' rows of the sums.
    Everything stays on the training device, summed in float64 (a float32 value is exact there, and
    each step adds one value per row, so the sums are those of the values read one by one): the
    step reads nothing back; a trace row holds (value, present) pairs until the round's end
    (:func:`_read_traces`)."""

    def record(key: str, values: Tensor, present: Tensor | None = None) -> None:
        values = values.detach().to(torch.float64).reshape(-1)  # one client's task loss: 0-d
        if present is None:
            sums[key].index_add_(0, index, values)
            seen[key].index_fill_(0, index, True)
        else:
            sums[key].index_add_(0, index, torch.where(present, values, 0.0))
            seen[key].index_copy_(0, index, seen[key].index_select(0, index) | present)
        if trace is not None:
            name = prefix + ("task" if key == loss_key else key)
            for i, row in enumerate(trace):
                row[name] = (values[i], None if present is None else present[i])
    return record


def _sample_flops(ws: Workspace, shape: tuple[int, ...], frozen: bool, passes: float) -> tuple[int, int]:
    """FLOPs of one sample's local step (:func:`fedlatent.models.flops.per_sample_flops`): the
    program's ``passes`` of forward and backward (one per copy: the global copy, Ditto's personal
    model; :attr:`~fedlatent.methods.program.ClientProgram.passes`), the frozen round-start model's
    forward when a part reads it; and of one forward, which the previous local model adds for each
    client that has one."""
    forward, backward = per_sample_flops(ws.model, shape)
    return round(passes * (forward + backward)) + frozen * forward, forward


def _with_terms(task: Tensor, parts: list[Part], ctx: LockstepContext,
                record: Callable[[str, Tensor, Tensor | None], None]) -> Tensor:
    """Each client's :func:`~fedlatent.federated.client.add_terms`: task + Σ weight·term, a (clients,)
    tensor (one client's task alone: 0-d, its loss), summed by the step (fp16 scales each client's
    first); each part's (clients,) term recorded (a part with no term for any client of the group
    returns None, as its :meth:`~Part.loss` would)."""
    return add_terms(task, parts, lambda part: part.lockstep_loss(ctx),
                     lambda part, value: record(part.name, value, ctx.prev_present if part.needs_prev_out else None))
