"""The forwards the trainer runs: one client's on its model's own weights (the module's own or
compiled forward, no copy of the weights, no vmap; its output read as a group of one), and stacked
clients' on a leading client axis: the model's own stacked form where it has one
(:meth:`~fedlatent.models.base.FedModel.stacked_forward`: the MLP's layers as batched matrix
products), else ``torch.func``'s ``functional_call`` under ``vmap`` (convolutions, projectors,
dropout).

Dropout: ``vmap(randomness="different")`` draws an independent mask per client, from the global
generator as one client's own forward does, but not the same draws (those come client after client
there; reproducing them would serialise the step). Runs with dropout are therefore equivalent in
distribution, not in numbers: every client's masks are Bernoulli(1 − p) scaled by 1/(1 − p), drawn
afresh each step, and a run is still determined by its seed."""
from __future__ import annotations

from typing import Any, Callable

from torch import Tensor
from torch.func import functional_call, vmap

from fedlatent.models.base import FedModel, ModelOutput, has_dropout

Forward = Callable[[Any, Tensor], ModelOutput]  # (weights, (clients, batch, …) inputs) ↦ their output


def own_forward(run: Callable[..., ModelOutput], taps: tuple[str, ...]) -> Forward:
    """(params, x) ↦ the output of one client's (1, batch, …) input by the module's own forward
    ``run`` (its weights are the ones trained: ``params`` are their views)."""
    asked = frozenset(taps)

    def output(params: dict[str, Tensor], x: Tensor) -> ModelOutput:
        return OneClientOutput(run(x[0], asked))
    return output


def functional_own(module: FedModel, taps: tuple[str, ...]) -> Forward:
    """(params, x) ↦ the output of one client's (1, batch, …) input by ``module`` run on the given
    weights (with a client axis of 1; those not given: the module's own), not on its own: a
    program's mixture of copies (APFL's)."""
    asked = frozenset(taps)

    def output(params: Any, x: Tensor) -> ModelOutput:
        return OneClientOutput(functional_call(module, {n: p[0] for n, p in params.items()}, (x[0], asked)))
    return output


class OneClientOutput(ModelOutput):
    """One client's output read as a group of one: logits, z and features get their leading client
    axis of 1 when a term reads them (a view, and an autograd node in every backward, only for what
    is read); the task loss reads ``plain`` (``Form.task_logits``)."""

    def __init__(self, plain: ModelOutput) -> None:  # not the dataclass __init__: no fields of its own
        self.plain = plain

    @property
    def logits(self) -> Tensor:  # type: ignore[override]
        return self.plain.logits.unsqueeze(0)

    @property
    def z(self) -> Tensor:  # type: ignore[override]
        return self.plain.z.unsqueeze(0)

    @property
    def features(self) -> dict[str, Tensor]:  # type: ignore[override]
        return {k: v.unsqueeze(0) for k, v in self.plain.features.items()}


def one_forward(model: FedModel, taps: tuple[str, ...]) -> Callable:
    """vmap-able forward: (params, x) ↦ (logits, z, taps...) of one client's batch."""
    def one(params: dict[str, Tensor], x: Tensor) -> tuple[Tensor, ...]:
        out = functional_call(model, params, (x, frozenset(taps)))
        return (out.logits, out.z, *(out.features[t] for t in taps))
    return one


def stacked_forward(model: FedModel, taps: tuple[str, ...]) -> Forward:
    """(params, x) ↦ the output of stacked clients' (clients, batch, …) input: the model's
    :meth:`~fedlatent.models.base.FedModel.stacked_forward` where it has one (no vmap or
    functional_call to pay for on each step), else its forward under ``vmap``, with an
    independent dropout mask per client (see the module's docstring)."""
    if model.has_stacked_forward:
        asked = frozenset(taps)
        return lambda params, x: model.stacked_forward(params, x, asked)
    vmapped = vmap(one_forward(model, taps), randomness="different" if has_dropout(model) else "error")

    def output(params: dict[str, Tensor], x: Tensor) -> ModelOutput:
        values = vmapped(params, x)
        return ModelOutput(logits=values[0], z=values[1], features=dict(zip(taps, values[2:])))
    return output
