"""Gradient sources: what a step's gradients come from, taken by either weight holder
(:mod:`fedlatent.federated.trainer.weights`). The plain loss (its backward, under the run's
autocast), fp16's scaled loss (each client's loss scaled by its own scale, the gradients unscaled, a
row whose gradients are not finite skipping its step: :class:`~fedlatent.losses.amp.LossScale`),
and sample-level DP-SGD's private gradients (per-sample gradients clipped and noised,
:mod:`fedlatent.federated.sample_dp`; Abadi et al. 2016, Algorithm 1)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import Tensor

from fedlatent.federated import precision
from fedlatent.federated.trainer.rows import Group
from fedlatent.losses.amp import LossScale

Objective = Callable[[Mapping[str, Tensor]], Tensor]  # the weights ↦ each client's loss ((clients,) or 0-d)
# the weights and their trained leaves ↦ each leaf's gradient (with the leaves' client axis)
PerSample = Callable[[Mapping[str, Tensor], list[Tensor]], list[Tensor]]


@dataclass
class Found:
    """A step's gradients: each trained leaf's (None: the loss does not read it), each extra tensor's
    (the tensors a loss reads besides the weights: APFL's α), and, under fp16, which rows' gradients
    are finite (the others skip the step; none: every row skips it)."""

    leaves: list[Tensor | None]
    extras: list[Tensor | None]
    finite: Tensor | None = None

    @property
    def taken(self) -> bool:
        return self.finite is None or bool(self.finite.any())


class GradientSource(Protocol):
    def __call__(self, weights: Mapping[str, Tensor], leaves: list[Tensor], group: Group) -> Found: ...


def _backward(loss: Tensor, inputs: list[Tensor]) -> list[Tensor | None]:
    return list(torch.autograd.grad(loss, inputs, allow_unused=True))


class Loss:
    """The gradients of the objective's sum over the group's clients (one client's 0-d loss as it is)."""

    def __init__(self, objective: Objective, extras: Sequence[Tensor], arithmetic: str, device: torch.device) -> None:
        self.objective, self.extras, self.arithmetic, self.device = objective, list(extras), arithmetic, device

    def _loss(self, weights: Mapping[str, Tensor]) -> Tensor:
        with precision.autocast(self.arithmetic, self.device):
            return self.objective(weights)

    def __call__(self, weights: Mapping[str, Tensor], leaves: list[Tensor], group: Group) -> Found:
        loss = self._loss(weights)
        grads = _backward(loss.sum() if loss.dim() else loss, [*leaves, *self.extras])
        return Found(grads[:len(leaves)], grads[len(leaves):])


class ScaledLoss(Loss):
    """fp16's: each client's loss times its own scale, the gradients unscaled, the scale updated
    (halved for a row not finite, grown after a run of finite steps)."""

    def __init__(self, objective: Objective, extras: Sequence[Tensor], arithmetic: str, device: torch.device,
                 scale: LossScale) -> None:
        super().__init__(objective, extras, arithmetic, device)
        self.scale = scale

    def __call__(self, weights: Mapping[str, Tensor], leaves: list[Tensor], group: Group) -> Found:
        loss = self._loss(weights)
        scaled = _backward(self.scale.scaled(loss, group), [*leaves, *self.extras])
        grads, finite = self.scale.unscale(scaled, group)
        self.scale.update(finite, group)
        if not bool(finite.any()):
            return Found([], [None] * len(self.extras), finite)
        return Found(grads[:len(leaves)], grads[len(leaves):], finite)


def loss_source(objective: Objective, extras: Sequence[Tensor], arithmetic: str, device: torch.device,
                scale: LossScale | None) -> Loss:
    """The objective's gradient source: scaled where the weights keep a loss scale (fp16)."""
    if scale is None:
        return Loss(objective, extras, arithmetic, device)
    return ScaledLoss(objective, extras, arithmetic, device, scale)


class Private:
    """Sample-level DP-SGD's gradients (float32, no autocast), in the leaves' shape; no gradient of
    an extra tensor."""

    def __init__(self, gradients: PerSample, extras: int) -> None:
        self.gradients, self.extras = gradients, extras

    def __call__(self, weights: Mapping[str, Tensor], leaves: list[Tensor], group: Group) -> Found:
        grads = self.gradients(weights, leaves)
        return Found([g.reshape(p.shape) for g, p in zip(grads, leaves)], [None] * self.extras)
