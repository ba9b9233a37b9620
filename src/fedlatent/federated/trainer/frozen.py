"""The frozen models' runners: a model the parts read but the step does not train — the round-start
model (FedProx's and MOON's global output, the feature-drift constraints'), MOON's previous local
models — run in eval mode (BatchNorm reads its running statistics) without gradients, on a (clients,
batch, …) input."""
from __future__ import annotations

import torch
from torch import Tensor

from fedlatent.federated.trainer.forward import stacked_forward
from fedlatent.federated.trainer.rows import Group, pick
from fedlatent.methods.parts import Tensors
from fedlatent.models.base import FedModel, ModelOutput


class Shared:
    """A frozen model the group's clients share, run on a (clients, batch, …) input as one plain
    forward (eval mode: no batch statistics, so flattening the clients together changes nothing)."""

    def __init__(self, module: FedModel, state: Tensors, taps: tuple[str, ...]) -> None:
        module.load_state_dict(state)
        module.eval()
        self.module, self.taps = module, frozenset(taps)

    def out(self, group: Group, x: Tensor) -> ModelOutput:
        with torch.no_grad():
            flat = self.module(x.flatten(0, 1), self.taps)
        return ModelOutput(logits=flat.logits.unflatten(0, x.shape[:2]), z=flat.z.unflatten(0, x.shape[:2]),
                           features={k: v.unflatten(0, x.shape[:2]) for k, v in flat.features.items()})


class PerClient:
    """Frozen models, one per client, stacked and run under ``vmap`` (or the model's stacked forward)
    in eval mode: MOON's previous local models, or the round-start models when the clients start
    from different weights (layers kept per client)."""

    def __init__(self, module: FedModel, states: list[Tensors], taps: tuple[str, ...], device: torch.device) -> None:
        self.params = {n: torch.stack([st[n] for st in states]).to(device) for n in states[0]}
        module.eval()  # functional_call runs the module's mode
        self.forward = stacked_forward(module, taps)

    def out(self, group: Group, x: Tensor) -> ModelOutput:
        with torch.no_grad():
            return self.forward(pick(self.params, group), x)


def frozen_models(module: FedModel, states: list[Tensors], taps: tuple[str, ...],
                  device: torch.device) -> Shared | PerClient:
    """The runner of the clients' frozen ``states``: one model for all where they are one state (the
    same object: every client's round-start model, or one client's), else one per client."""
    if all(st is states[0] for st in states):
        return Shared(module, states[0], taps)
    return PerClient(module, states, taps, device)
