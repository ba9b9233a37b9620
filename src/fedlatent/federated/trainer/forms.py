"""One client or a stack: the one place the trainer tells them apart. One client trains on its
model's own weights with the model's own (or compiled) forward (:class:`~fedlatent.federated.
trainer.weights.Own`: no copy of the weights, no vmap); several are stacked on a leading client
axis (:class:`~fedlatent.federated.trainer.weights.Stacked`) and trained in lockstep, one forward
and one backward per step for all of them. Everything else — the step, the objectives, the
gradient sources, the frozen models, the end of the round — is the same code for both."""
from __future__ import annotations

from collections.abc import Callable
from typing import cast

from torch import Tensor

from fedlatent.federated.client import Workspace
from fedlatent.federated.trainer.forward import Forward, OneClientOutput, functional_own, own_forward, stacked_forward
from fedlatent.federated.trainer.weights import Own, Recipe, Stacked, Training, Weights
from fedlatent.methods.parts import Part, Tensors
from fedlatent.models.base import FedModel, ModelOutput


class Form:
    """How a round's clients are held: ``holder`` makes their weights; ``stacked``: on a client axis
    (batches of different sizes may then share a padded step, and ``finish`` reads each client's
    trained weights once loaded into the model), else one client's own modules."""

    holder: Callable[[Recipe, Training], Weights]
    stacked: bool

    def prepare(self, model: FedModel, start: Tensors, parts: list[Part]) -> list[str]:
        """Ready the template for the round; the names the holders hold (one client's own: none)."""
        raise NotImplementedError

    def forwards(self, ws: Workspace, module: FedModel, run: Callable[..., ModelOutput] | None,
                 taps: tuple[str, ...]) -> tuple[Forward, Forward]:
        """A copy's forward on its weights, and on given weights (a program's mixture: APFL's);
        ``run``: the module's own forward where it is compiled."""
        raise NotImplementedError

    def client(self, c: int) -> int | None:
        """The row of client ``c`` in what the weights save (one client's own: no row)."""
        raise NotImplementedError

    def task_logits(self, out: ModelOutput) -> Tensor:
        """The logits the task loss reads: (clients, batch, classes), or one client's own (batch,
        classes), whose mean is then its 0-d loss as a plain loop takes it."""
        raise NotImplementedError


class _OneClient(Form):
    holder, stacked = Own, False

    def prepare(self, model: FedModel, start: Tensors, parts: list[Part]) -> list[str]:
        return []

    def forwards(self, ws: Workspace, module: FedModel, run: Callable[..., ModelOutput] | None,
                 taps: tuple[str, ...]) -> tuple[Forward, Forward]:
        return own_forward(run or module, taps), functional_own(module, taps)

    def client(self, c: int) -> int | None:
        return None

    def task_logits(self, out: ModelOutput) -> Tensor:
        return cast(OneClientOutput, out).plain.logits


class _Stack(Form):
    holder, stacked = Stacked, True

    def prepare(self, model: FedModel, start: Tensors, parts: list[Part]) -> list[str]:
        model.train()  # the template's mode is what functional_call runs (BatchNorm: batch statistics)
        if any(type(p).begin is not Part.begin for p in parts):
            model.load_state_dict(start)  # what begin may read off rc.model (shapes, devices)
        return list(model.state_dict())

    def forwards(self, ws: Workspace, module: FedModel, run: Callable[..., ModelOutput] | None,
                 taps: tuple[str, ...]) -> tuple[Forward, Forward]:
        forward = stacked_forward(ws.model, taps)  # every copy runs on the template's stacked forward
        return forward, forward

    def client(self, c: int) -> int | None:
        return c

    def task_logits(self, out: ModelOutput) -> Tensor:
        return out.logits


ONE, STACK = _OneClient(), _Stack()


def form_of(count: int) -> Form:
    return ONE if count == 1 else STACK
