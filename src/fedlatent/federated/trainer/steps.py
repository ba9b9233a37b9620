"""The round's steps: each step, the clients that still have a batch, each group's step taken by
the program (:meth:`~fedlatent.methods.program.ClientProgram.step`), with the frozen models' outputs
on its batch and, where counted, its FLOPs.

Clients with fewer batches drop out of the later steps. Where no row's loss reads another row of its
batch (no BatchNorm, no term that reads the batch), a stack's clients take each step together, a
batch shorter than the others (a client's last, or a smaller client's) padded and weighted zero in
the task loss; otherwise a step groups the clients by batch size."""
from __future__ import annotations

from typing import Any

from torch import Tensor

from fedlatent.federated import devices, precision
from fedlatent.federated.client import Workspace
from fedlatent.federated.trainer.batches import Taken, row_weights, step_groups
from fedlatent.federated.trainer.rows import Group, group_of, pick, rows
from fedlatent.federated.trainer.setup import Round
from fedlatent.federated.trainer.step import GroupStep
from fedlatent.models.base import mixes_batch_rows
from fedlatent.models.flops import per_sample_flops

Padding = dict[tuple[tuple[int, ...], int], Tensor | None]  # (batch sizes, step size) ↦ row weights


def take_steps(r: Round) -> None:
    """Every step of the round, until each client has taken its planned steps."""
    indices: dict[tuple[int, ...], tuple[Tensor, Group]] = {}  # a group's sums' row index and stack rows, made once
    padding: Padding = {}  # a step's row weights, made once per round for each set of batch sizes
    active = [c for c in range(r.count) if r.total[c]]
    # batches of different sizes share a step, padded, where no row's loss reads another row
    pad = r.form.stacked and not mixes_batch_rows(r.ws.model) and not any(p.has_term() and p.term_reads_batch
                                                                          for p in r.parts)
    while active:
        taken = r.draws.take(active)
        batch_sizes = {c: r.draws.size(taken[c]) for c in active}
        for c in active:
            r.steps[c] += 1
        for members in step_groups(active, batch_sizes, pad):
            key = tuple(members)
            if key not in indices:
                indices[key] = devices.upload(members, r.s.device), group_of(members, r.count, r.s.device)
            _group_step(r, taken, members, batch_sizes, *indices[key], padding)
        active = [c for c in active if r.steps[c] < r.total[c]]


def _group_step(r: Round, taken: dict[int, Taken], members: list[int], batch_sizes: dict[int, int],
                index: Tensor, group: Group, padding: Padding) -> None:
    """One group's step: its batch, its trace rows, the frozen models' outputs (in the trained
    model's arithmetic), the program's step, its FLOPs."""
    spec, s, device = r.spec, r.s, r.s.device
    member_sizes = [batch_sizes[c] for c in members]
    size = max(*member_sizes, 1)  # a step of empty Poisson batches runs on their stand-in rows
    if (tuple(member_sizes), size) not in padding:
        padding[tuple(member_sizes), size] = row_weights(member_sizes, size, device)
    x, y = r.draws.stacked(taken, members, size)
    trace: list[dict[str, Any]] | None = None
    if r.traces is not None:
        trace = [{} for _ in members]
        for c, row in zip(members, trace):
            r.traces[c].append(row)
    with precision.autocast(s.precision, device):  # frozen models' forwards: as the trained one's
        global_out = r.frozen.out(group, x) if r.frozen is not None else None
        prev_out = r.previous.out(group, x) if r.previous is not None else None
    # a buffer is needed again when a client steps again, or keeps its optimiser state for the next round
    again = s.keep_optimizer or any(r.steps[c] < r.total[c] for c in members)
    spec.personalization.step(GroupStep(
        r, group, members, member_sizes, x, y, padding[tuple(member_sizes), size], global_out, prev_out,
        rows(r.present, group), r.global_params if r.same_start else pick(r.global_params, group),
        index, trace, again))
    if spec.count_flops:
        _count_flops(r, members, batch_sizes, tuple(x.shape[2:]))


def _count_flops(r: Round, members: list[int], batch_sizes: dict[int, int], shape: tuple[int, ...]) -> None:
    """Each member's FLOPs of the step, the previous local model's forward for the clients that have one."""
    if r.per_sample is None:
        r.per_sample = sample_flops(r.ws, shape, r.frozen is not None, r.spec.personalization.passes)
    step_flops, forward_flops = r.per_sample
    for c in members:
        has_previous = r.previous is not None and r.had_previous[c]
        r.flops[c] += batch_sizes[c] * (step_flops + has_previous * forward_flops)


def sample_flops(ws: Workspace, shape: tuple[int, ...], frozen: bool, passes: float) -> tuple[int, int]:
    """FLOPs of one sample's local step (:func:`fedlatent.models.flops.per_sample_flops`): the
    program's ``passes`` of forward and backward (one per copy: the global copy, Ditto's personal
    model; :attr:`~fedlatent.methods.program.ClientProgram.passes`), the frozen round-start model's
    forward when a part reads it; and of one forward, which the previous local model adds for each
    client that has one."""
    forward, backward = per_sample_flops(ws.model, shape)
    return round(passes * (forward + backward)) + frozen * forward, forward
