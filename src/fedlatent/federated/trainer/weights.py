"""The weights a copy trains, with their update rule: one holder protocol (:class:`Weights`) for one
client (:class:`Own`: its model's own parameters, moved in place, no copy and no vmap) and for a
stack of clients (:class:`Stacked`: their weights on a leading client axis). Either takes a step from
a gradient source (:mod:`fedlatent.federated.trainer.gradients`) through the update rule's chain
(:mod:`fedlatent.losses.update`: SGD, Adam or AdamW with the method's links — FedDyn's per-row
``extra_decay``, Ditto's ``pull`` towards the round's start, SCAFFOLD's ``drift``, the frozen
weights' mask), its state per client from the kept states, and under fp16 a loss scale per client."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from fedlatent.federated import precision
from fedlatent.federated.client import state_to_cpu
from fedlatent.federated.trainer.gradients import GradientSource
from fedlatent.federated.trainer.rows import Group, rows, stack_rows
from fedlatent.losses import update
from fedlatent.losses.amp import LossScale
from fedlatent.losses.update import LocalOptimizer, Rule
from fedlatent.methods.parts import Tensors, WithClientAxis
from fedlatent.models.base import FedModel


@dataclass
class Recipe:
    """What a copy's weights start from and what its update rule chains besides the rule, for its
    clients in stack order: their ``starts``; the parts' after-step move (``drift``, SCAFFOLD's c − c_i,
    stacked); FedDyn's α_k per client (``decay``); the pull (``pull``: one λ, or one per row) towards
    each client's ``anchor`` (Ditto's personal model towards the round's start)."""

    starts: list[Tensors]
    module: FedModel
    drift: Tensors | None = None
    decay: list[float] = field(default_factory=list)
    anchor: list[Tensors] | None = None
    pull: Tensor | float = 0.0


@dataclass
class Training:
    """What every copy of a round trains with: its weights' names (the model's state, its trainable
    and its fixed parameters), the device, the rule, the clients' kept optimiser states and loss
    scales for the copy (``saved``, ``scales``), the arithmetic."""

    names: list[str]
    trainable: list[str]
    fixed: list[str]
    device: torch.device
    rule: Rule
    saved: list[Tensors]
    scales: list[Tensors]
    arithmetic: str


class Weights:
    """The holder protocol, and the step both holders share: the group's weights and leaves
    (:meth:`take`), the source's gradients, one update of the chain, the weights written back
    (:meth:`put`); fp16's rows whose gradients are not finite put back as they were."""

    optimizer: LocalOptimizer
    scale: LossScale | None
    frozen: list[Tensor]
    arithmetic: str
    device: torch.device

    def take(self, group: Group) -> tuple[Mapping[str, Tensor], list[Tensor]]:
        """The weights the group's step reads, and the trained ones among them (autograd's leaves)."""
        raise NotImplementedError

    def put(self, group: Group, weights: Mapping[str, Tensor]) -> None:
        """Write the group's stepped weights back where they live (nothing where they are views)."""

    def stored(self) -> Mapping[str, Tensor]:
        """Every weight and buffer with its client axis, as held."""
        raise NotImplementedError

    def client_state(self, c: int) -> Tensors:
        raise NotImplementedError

    def client_rows(self) -> list[Tensors]:
        """Every client's state, in stack order."""
        raise NotImplementedError

    def step(self, group: Group, source: GradientSource, again: bool) -> list[Tensor | None]:
        """One optimiser step of the clients in ``group`` (None: all) on ``source``'s gradients;
        ``again``: some of them step again after it. Returns the gradients of the source's extra
        tensors (None where the step was skipped, or where the source has none)."""
        weights, leaves = self.take(group)
        found = source(weights, leaves, group)
        if not found.taken:
            return found.extras
        finite = found.finite
        kept = None if finite is None or bool(finite.all()) else self._snapshot()
        self.optimizer.step(leaves + self.frozen, [*found.leaves, *[None] * len(self.frozen)], rows=group,
                            again=again)
        with torch.no_grad():
            self.put(group, weights)
            if kept is not None and finite is not None:
                self._restore(kept, stack_rows(group, ~finite))
        return found.extras

    def rows(self, group: Group) -> dict[str, Tensor]:
        """The group's weights as they are, detached."""
        return {n: rows(p, group).detach() for n, p in self.stored().items()}  # type: ignore[union-attr]

    def _snapshot(self) -> tuple[Tensors, Any]:
        """The weights and optimiser state as they are (a copy), for :meth:`_restore`."""
        return {n: p.detach().clone() for n, p in self.stored().items()}, self.optimizer.snapshot()

    def _restore(self, kept: tuple[Tensors, Any], marked: Tensor) -> None:
        """Put the stack rows ``marked`` back as :meth:`_snapshot` saw them (their step skipped); an
        optimiser slot the step created is zero there, as it was."""
        params, state = kept
        for n, p in self.stored().items():
            p.index_copy_(0, marked, params[n].index_select(0, marked))
        self.optimizer.restore_rows(state, marked)


def _mask(trainable: list[str], frozen: list[Tensor]) -> list[bool]:
    return [True] * len(trainable) + [False] * len(frozen)


class Stacked(Weights):
    """C clients' weights and buffers (BatchNorm statistics: the forward updates them in place, per
    client) on a leading client axis; clients that all start from one state get that state broadcast."""

    def __init__(self, recipe: Recipe, t: Training) -> None:
        states, device = recipe.starts, t.device
        if all(st is states[0] for st in states):
            self.params = {n: states[0][n].to(device).expand(len(states), *states[0][n].shape).contiguous()
                           for n in t.names}
        else:
            self.params = {n: torch.stack([s[n] for s in states]).to(device) for n in t.names}
        self.trainable = t.trainable
        self.frozen = [self.params[n] for n in t.fixed]  # the chain's mask drops them before anything reads them
        decay, pull = recipe.decay, recipe.pull
        anchor = None
        if isinstance(pull, Tensor) or pull:  # one state for every client, or one row per client
            assert recipe.anchor is not None
            one = all(a is recipe.anchor[0] for a in recipe.anchor)
            anchor = [(recipe.anchor[0][n] if one else torch.stack([a[n] for a in recipe.anchor])).to(device)
                      .expand_as(self.params[n]) for n in t.trainable]
        self.optimizer = update.restore(t.rule, [self.params[n] for n in t.trainable] + self.frozen, t.trainable,
                                        t.saved, stacked=True, links=update.Links(
            extra_decay=torch.tensor(decay, device=device) if any(decay) else 0.0, pull=pull, anchor=anchor,
            correction=[recipe.drift[n].to(device) for n in t.trainable] if recipe.drift else None,
            mask=_mask(t.trainable, self.frozen)))
        self.arithmetic, self.device = t.arithmetic, device
        self.scale = LossScale.restore(t.scales, True, device) if precision.scales_loss(t.arithmetic) else None

    def take(self, group: Group) -> tuple[dict[str, Tensor], list[Tensor]]:
        weights = {n: rows(p, group).detach().requires_grad_(n in self.trainable)  # type: ignore[union-attr]
                   for n, p in self.params.items()}
        return weights, [weights[n] for n in self.trainable]

    def put(self, group: Group, weights: Mapping[str, Tensor]) -> None:
        if isinstance(group, Tensor):  # the step acted on the group's copies: write them back
            for n in self.params:
                self.params[n].index_copy_(0, group, weights[n])

    def stored(self) -> dict[str, Tensor]:
        return self.params

    def client_state(self, c: int) -> Tensors:
        return {n: p[c].detach().to("cpu", copy=True) for n, p in self.params.items()}

    def client_rows(self) -> list[Tensors]:
        """Rows (views) of one CPU copy of the stack (on the CPU: of the stack itself): the server
        averages rows of one stack in one product (``methods.aggregation.weighted_mean``)."""
        values = {n: p.detach().to("cpu").unbind(0) for n, p in self.params.items()}
        return [dict(zip(values, row)) for row in zip(*values.values())]


class Own(Weights):
    """One client trained on its model's own weights: a stack of one without the stack. The update
    rule moves the module's parameters in place; the loss terms read them as views with a client
    axis of 1, as they read a stack. (A step of one row is taken or skipped whole.)"""

    def __init__(self, recipe: Recipe, t: Training) -> None:
        module, device = recipe.module, t.device
        module.load_state_dict(recipe.starts[0])
        module.train()
        self.module = module
        # the module's tensors, listed once (load_state_dict copies into them: the same objects all round)
        own = dict(module.named_parameters())
        self.views = WithClientAxis({**own, **dict(module.named_buffers())})
        self.leaves = [own[n] for n in t.trainable]
        self.frozen = [p for n, p in own.items() if n not in set(t.trainable)]  # the chain's mask drops them
        pull = recipe.pull
        anchor = [recipe.anchor[0][n].to(device) for n in t.trainable] if pull and recipe.anchor else None
        self.optimizer = update.restore(t.rule, self.leaves + self.frozen, t.trainable, t.saved[:1], stacked=False,
                                        links=update.Links(
            extra_decay=recipe.decay[0] if recipe.decay else 0.0, pull=pull, anchor=anchor, fused=False,
            correction=[recipe.drift[n][0].to(device) for n in t.trainable] if recipe.drift else None,
            mask=_mask(t.trainable, self.frozen)))
        self.arithmetic, self.device = t.arithmetic, device
        self.scale = LossScale.restore(t.scales[:1], False, device) if precision.scales_loss(t.arithmetic) else None

    def take(self, group: Group) -> tuple[Mapping[str, Tensor], list[Tensor]]:
        return self.views, list(self.leaves)

    def stored(self) -> Mapping[str, Tensor]:
        return self.views

    def client_state(self, c: int) -> Tensors:
        return state_to_cpu(self.module)

    def client_rows(self) -> list[Tensors]:
        return [state_to_cpu(self.module)]
