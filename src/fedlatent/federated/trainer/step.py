"""A step of a group of clients as their program sees it (:class:`GroupStep`, the
:class:`fedlatent.methods.program.Step` the programs call): each copy's objective — the task loss
per client (one call outside vmap), plus the parts' terms through their lockstep form — recorded
into the round's running per-client sums and the step trace, and each copy's training step from the
gradient source its settings call for (the loss, fp16's scaled loss, DP-SGD's private gradients)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable, Protocol, cast

import torch
from torch import Tensor

from fedlatent.federated import devices
from fedlatent.federated.client import add_terms
from fedlatent.federated.trainer.gradients import Objective, PerSample, Private, loss_source
from fedlatent.federated.trainer.rows import Group, batch_rows, rows
from fedlatent.federated.trainer.setup import Copy, Round
from fedlatent.methods.parts import LockstepContext, Part, Tensors, task_loss
from fedlatent.models.base import ModelOutput



class Recorder(Protocol):
    """Adds a (group,) tensor of per-client values to the round's sums under ``key`` (for the clients
    ``present`` marks: all by default)."""

    def __call__(self, key: str, values: Tensor, present: Tensor | None = None) -> None: ...


class GroupStep:
    """A step of a group of clients: the batch, the frozen models' outputs on it, the group's rows
    of the round's stacks, the coefficients its members' terms read."""

    def __init__(self, r: Round, group: Group, members: list[int], sizes: list[int], x: Tensor, y: Tensor,
                 weights: Tensor | None, global_out: ModelOutput | None, prev_out: ModelOutput | None,
                 present: Tensor | None, global_params: Tensors, index: Tensor,
                 trace: list[dict[str, Any]] | None, again: bool) -> None:
        self.r, self.group, self.members, self.sizes = r, group, members, sizes
        self.x, self.y, self.row_weights = x, y, weights
        self.global_out, self.prev_out, self.present = global_out, prev_out, present
        self.global_params, self.index, self.trace, self.again = global_params, index, trace, again
        self.rcs = [r.rcs[c] for c in members]
        self.data, self.lr = r.data, r.s.lr

    def _recorder(self, trained: Copy) -> Recorder:
        """Records the copy's losses and terms (a copy of the client's own under its name's prefix)."""
        return recorder(self.r.sums, self.r.seen, self.index, self.trace,
                        f"{trained.decl.name}_" if trained.personal else "", trained.decl.loss_key)

    def objective(self, copy: str, weights: Callable[[Mapping[str, Tensor]], Mapping[str, Tensor]] | None = None,
                  recorded: bool = True) -> Objective:
        r, trained = self.r, self.r.copies[copy]
        spec, decl = r.spec, trained.decl
        forward = trained.forward if weights is None else trained.functional
        record = self._recorder(trained) if recorded else _unrecorded
        parts = r.coefficients.parts(self.members, personal=trained.personal)

        def loss(params: Mapping[str, Tensor]) -> Tensor:
            used = params if weights is None else weights(params)
            out = forward(used, self.x)
            task = task_losses(spec.loss, r.form.task_logits(out), self.y, spec.temperature, self.row_weights)
            record(decl.loss_key, task)
            # the previous local model's output is the global copy's term's (MOON)
            return with_terms(task, parts, LockstepContext(
                out, self.y, used, self.global_params, self.global_out, r.s.num_classes, self.rcs,
                None if trained.personal else self.prev_out, None if trained.personal else self.present), record)
        return loss

    def train(self, copy: str, objective: Objective | None = None, extras: Sequence[Tensor] = (),
              again: bool | None = None) -> list[Tensor | None]:
        trained = self.r.copies[copy]
        holder = trained.weights
        again = self.again if again is None else again
        if trained.private is not None:  # validation leaves DP-SGD only the copies' own objectives
            return holder.step(self.group, Private(self._private(trained), len(extras)), again)
        source = loss_source(objective or self.objective(copy), extras, holder.arithmetic, holder.device, holder.scale)
        return holder.step(self.group, source, again)

    def _private(self, trained: Copy) -> PerSample:
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
            terms = with_terms(task.new_zeros(len(self.members)), parts, context, record)
            if not terms.requires_grad:
                return grads
            extra = torch.autograd.grad(terms.sum(), leaves, allow_unused=True)
            return [g if e is None else g + e.reshape(g.shape) for g, e in zip(grads, extra)]
        return gradients

    def part(self, index: int, parts: int) -> GroupStep:
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
            return GroupStep(self.r, self.group, self.members, [hi - lo] * len(self.members), self.x[:, lo:hi],
                             self.y[:, lo:hi], None, batch_rows(self.global_out, lo, hi),
                             batch_rows(self.prev_out, lo, hi), self.present, self.global_params, self.index,
                             self.trace, self.again)
        bounds = [(0, n) if n < 2 * parts else (index * n // parts, (index + 1) * n // parts) for n in self.sizes]
        first, end = devices.upload(bounds, self.row_weights.device).unbind(1)
        positions = torch.arange(size, device=self.row_weights.device)
        weights = ((positions >= first[:, None]) & (positions < end[:, None])).to(self.row_weights)
        return GroupStep(self.r, self.group, self.members, [hi - lo for lo, hi in bounds], self.x, self.y, weights,
                         self.global_out, self.prev_out, self.present, self.global_params, self.index, self.trace,
                         self.again)

    def weights(self, copy: str) -> dict[str, Tensor]:
        return self.r.copies[copy].weights.rows(self.group)

    def rows(self, values: Tensor) -> Tensor:
        return cast(Tensor, rows(values, self.group))

    def put(self, values: Tensor, rows: Tensor) -> None:
        with torch.no_grad():
            if self.group is None:
                values.copy_(rows)
            elif isinstance(self.group, slice):
                values[self.group] = rows
            else:
                values.index_copy_(0, self.group, rows)


def _unrecorded(key: str, values: Tensor, present: Tensor | None = None) -> None:
    """The recorder of an objective left out of the metrics (an inner computation's)."""


def task_losses(kind: str, logits: Tensor, y: Tensor, temperature: float, weights: Tensor | None = None) -> Tensor:
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


def recorder(sums: dict[str, Tensor], seen: dict[str, Tensor], index: Tensor,
              trace: list[dict[str, Any]] | None = None, prefix: str = "",
              loss_key: str = "train_loss") -> Recorder:
    """Adds a (group,) tensor of per-client values to the running per-client sums under ``key``,
    for the clients ``present`` marks (all by default: a term absent for a client, as MOON's
    without a previous model, is left out of its metrics);
    when the step is traced, each member's value also into its row of ``trace`` under the
    step-trace key: ``prefix`` + the key, the copy's task loss ``loss_key`` as ``prefix`` + ``task``
    (``prefix``: ``personal_`` for Ditto's personal step). ``index``: the members' rows of the sums.
    Everything stays on the training device, summed in float64 (a float32 value is exact there, and
    each step adds one value per row, so the sums are those of the values read one by one): the
    step reads nothing back; a trace row holds (value, present) pairs until the round's end
    (:func:`fedlatent.federated.trainer.finish.read_traces`)."""

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


def with_terms(task: Tensor, parts: list[Part], ctx: LockstepContext,
                record: Recorder) -> Tensor:
    """Each client's :func:`~fedlatent.federated.client.add_terms`: task + Σ weight·term, a (clients,)
    tensor (one client's task alone: 0-d, its loss), summed by the step (fp16 scales each client's
    first); each part's (clients,) term recorded (a part with no term for any client of the group
    returns None, as its :meth:`~Part.loss` would)."""
    return add_terms(task, parts, lambda part: part.lockstep_loss(ctx),
                     lambda part, value: record(part.name, value, ctx.prev_present if part.needs_prev_out else None))
