"""A step's clients as rows of the stacks: a group is all of them (None), a run of adjacent rows (a
slice: views, so that in-place updates reach the stack) or scattered rows (an index tensor: copies,
written back)."""
from __future__ import annotations

import torch
from torch import Tensor

from fedlatent.federated import devices
from fedlatent.models.base import ModelOutput

Group = Tensor | slice | None  # a step's clients: all, a run of stack rows, or stack indices


def rows(t: Tensor | None, group: Group) -> Tensor | None:
    """The rows of ``group`` of a stacked tensor (None: all; a slice: a view)."""
    if t is None or group is None:
        return t
    return t[group] if isinstance(group, slice) else t.index_select(0, group)


def group_of(members: list[int], count: int, device: torch.device) -> Group:
    """The stack rows of a step's ``members`` (increasing): None for all, a slice for a run of
    adjacent rows (no copies), else their indices."""
    if len(members) == count:
        return None
    if members[-1] - members[0] + 1 == len(members):
        return slice(members[0], members[-1] + 1)
    return devices.upload(members, device)


def pick(values: dict[str, Tensor], group: Group) -> dict[str, Tensor]:
    """The rows of ``group`` of every stacked tensor of ``values``."""
    return {n: rows(v, group) for n, v in values.items()}  # type: ignore[misc]


def stack_rows(group: Group, marked: Tensor) -> Tensor:
    """The stack's row indices of the group members that ``marked`` (a (members,) mask) marks."""
    if group is None:
        return marked.nonzero().flatten()
    if isinstance(group, slice):
        return marked.nonzero().flatten() + (group.start or 0)
    return group[marked]


def batch_rows(out: ModelOutput | None, lo: int, hi: int) -> ModelOutput | None:
    """The rows ``lo`` … ``hi`` − 1 of each client's batch in a (clients, batch, …) output."""
    if out is None:
        return None
    return ModelOutput(out.logits[:, lo:hi], out.z[:, lo:hi], {k: v[:, lo:hi] for k, v in out.features.items()})
