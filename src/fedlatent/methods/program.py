"""Client programs: what a client does in its round besides the method's loss terms, and which model
it is evaluated on.

A program declares the model copies a client trains (:class:`ModelCopy`: the copy of the global
model it uploads, and copies of its own kept in its state across rounds, Ditto's and APFL's
personal models), the state entries it keeps to itself (the layers of FedRep, LG-FedAvg, FedPer,
FedBN), and implements only the hooks it needs: the weights a round starts from (:meth:`start`, with
the clients' training data: a round-start procedure), the round around the trainer (:meth:`round`:
FedRep's two phases), each local step (:meth:`step`: the declared copies each take a step, or any
number of inner steps on the batch), its round-scoped values (:meth:`begin` / :meth:`finish`: APFL's
α), the model a client is evaluated on (:meth:`evaluated`) and the one a client that never trained
is evaluated on (:meth:`adapted_new`, ``data.holdout_clients``: a personalising program states its
rule in :attr:`ClientProgram.new_client_rule`, else it has none and such a run is refused). The client trainer
(``federated.trainer``) runs every program the same way, iterating over the declared copies;
programs never own a loop and keep no per-client state on themselves.

Each program is registered by name (:func:`register_program`); a method preset chooses one as
``MethodSpec.personalization``. The types (:class:`ClientProgram`, the base program, and
:class:`ModelCopy`, :class:`Step`, :class:`Tune`) live in :mod:`fedlatent.methods.spec`; here are
the registry and fine-tuning.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from torch import Tensor

from fedlatent.methods.spec import (GLOBAL, LOCAL, PERSONAL, ClientProgram, ModelCopy, Step, Tensors, Train, Tune)

__all__ = ["GLOBAL", "LOCAL", "PERSONAL", "PROGRAMS", "ClientProgram", "Finetune", "ModelCopy", "Step", "Tensors",
           "Train", "Tune", "prefixed", "register_program"]

P = TypeVar("P", bound=ClientProgram)

PROGRAMS: dict[str, type[ClientProgram]] = {ClientProgram.kind: ClientProgram}


def register_program(name: str) -> Callable[[type[P]], type[P]]:
    """Register a program class under ``name`` (its :attr:`ClientProgram.kind`)."""
    def wrap(cls: type[P]) -> type[P]:
        cls.kind = name
        PROGRAMS[name] = cls
        return cls
    return wrap


@register_program("finetune")
class Finetune(ClientProgram):
    """Plain training; each client evaluated on the global model fine-tuned on its training split.

    ``epochs`` of fine-tuning of every parameter (``scope = "all"``, FedBABU; a head fixed during
    training included) or of the classifier alone on the fixed encoder (``"head"``, SphereFed's
    "Ours (SGD)", Appendix B)."""

    personalizes = True

    def __init__(self, epochs: int = 1, scope: str = "all") -> None:
        super().__init__()
        self.epochs, self.scope = epochs, scope

    new_client_rule = "the global model fine-tuned on its training split"

    def evaluated(self, parameters: list[str], client_state: Tensors, global_state: Tensors,
                  tune: Tune | None) -> Tensors:
        return tune(global_state, self.scope) if tune is not None else global_state

    def adapted_new(self, parameters: list[str], global_state: Tensors, tune: Tune) -> Tensors:
        return tune(global_state, self.scope)


def prefixed(state: Mapping[str, Tensor], prefix: str) -> Tensors:
    """The entries of ``state`` under ``prefix``, without it."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
