"""Partial personalisation: some state entries stay with each client (kept under ``local.`` in its
state, never averaged), the others are shared — FedRep and LG-FedAvg, FedPer, FedBN.

A round starts from the global state with the client's own entries in place of the shared ones (the
global values where the client has none yet: its first round); it first trains the own layers
alone for ``local_epochs`` (FedRep's head phase, the task loss only), then the shared layers alone
(``freeze_local``) or all of them with the method's parts for ``shared_epochs`` (0 =
``train.local_epochs``), and keeps the own entries in the client's state. An upload carries every
entry; the server averages only the shared ones. Each client is evaluated on its own entries with
the global ones; a client that never trained (``data.holdout_clients``), on its own layers
fine-tuned from the global ones on its training split.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from fedlatent.methods.parts import ClientRound, MethodSpec, Upload
from fedlatent.methods.program import LOCAL, ClientProgram, Tensors, Train, Tune, prefixed, register_program
from fedlatent.models.base import FedModel

LocalKeys = Callable[[list[str], list[str]], list[str]]  # (parameter names, state keys) ↦ a client's own keys


@register_program("partial")
class Partial(ClientProgram):
    """Some entries kept by each client, the others averaged; evaluated on its own with the global ones.

    ``local(parameters, keys)`` picks the client's own entries (both lists in the model's order); a
    round trains them alone for ``local_epochs``, then the shared layers (``freeze_local``) or all
    layers for ``shared_epochs`` (0 = ``train.local_epochs``)."""

    personalizes = True
    stacks_runs = False  # two phases around the trainer: not trained across the runs of a stack

    def __init__(self, local: LocalKeys, local_epochs: int = 0, freeze_local: bool = False,
                 shared_epochs: int = 0) -> None:
        super().__init__()
        self.local = local
        self.local_epochs, self.freeze_local, self.shared_epochs = local_epochs, freeze_local, shared_epochs
        self.epochs = local_epochs or 1  # a new client's own layers: as long as a round's own-layer phase

    def local_keys(self, parameters: list[str], keys: list[str]) -> list[str]:
        return list(self.local(parameters, keys))

    def own_state(self, parameters: list[str], client_state: Tensors, global_state: Tensors) -> Tensors:
        """``global_state`` with the client's own entries in place of the shared ones; the global values
        where the client has none yet (its first round)."""
        own = prefixed(client_state, LOCAL)
        return {**global_state, **{k: own[k] for k in self.local_keys(parameters, list(global_state)) if k in own}}

    def start(self, model: FedModel, starts: list[Tensors], spec: MethodSpec, rcs: list[ClientRound],
              datas: Sequence[Any], s: Any) -> list[Tensors]:
        names = [n for n, _ in model.named_parameters()]
        if not self.local_keys(names, list(starts[0])):  # nothing of the client's own: the round's start as it is
            return starts
        return [self.own_state(names, rc.state, start) for rc, start in zip(rcs, starts)]

    def round(self, model: FedModel, starts: list[Tensors], spec: MethodSpec, rcs: list[ClientRound],
              s: Any, train: Train) -> list[Upload]:
        """The own layers alone (the task loss only, a fresh optimiser), then the shared layers or all
        of them with the method's parts; the own entries kept in the clients' states."""
        names = [n for n, _ in model.named_parameters()]
        local = set(self.local_keys(names, list(starts[0])))
        first: list[Upload] | None = None
        if self.local_epochs and any(q.requires_grad for n, q in model.named_parameters() if n in local):
            alone = [replace(rc, state={}, payload={}, steps=0, metrics={}, scratch={}) for rc in rcs]
            settings = replace(s, epochs=self.local_epochs, steps=0, keep_optimizer=False)
            local_spec = MethodSpec("local", loss=spec.loss, temperature=spec.temperature, trace=spec.trace,
                                    count_flops=spec.count_flops)
            with training_only(model, local):
                first = train(starts, local_spec, alone, settings)
            starts = [u.state for u in first]
        shared = {n for n in names if n not in local} if self.freeze_local else set(names)
        with training_only(model, shared):
            uploads = train(starts, replace(spec, personalization=ClientProgram()), rcs,
                            replace(s, epochs=self.shared_epochs or s.epochs))
        for c, (rc, upload) in enumerate(zip(rcs, uploads)):
            rc.state.update({LOCAL + k: upload.state[k].clone() for k in local})
            if first is not None:
                upload.metrics["local_layers_loss"] = first[c].metrics["train_loss"]
                upload.trace = first[c].trace + upload.trace  # the own layers' steps first, as they ran
                if spec.count_flops:
                    upload.metrics["flops"] += first[c].metrics["flops"]
        return uploads

    def evaluated(self, parameters: list[str], client_state: Tensors, global_state: Tensors,
                  tune: Tune | None) -> Tensors:
        return self.own_state(parameters, client_state, global_state)

    new_client_rule = ("its own layers fine-tuned from the global ones on its training split, the running "
                       "statistics of the BatchNorm layers it keeps then estimated on that split")

    def adapted_new(self, parameters: list[str], global_state: Tensors, tune: Tune) -> Tensors:
        """A new client's own layers trained from the global ones (the server's values of entries it
        never averages: FedRep's and FedPer's heads and FedBN's BatchNorm layers as initialised)
        with the shared layers fixed; where it keeps BatchNorm layers (FedBN, LG-FedAvg's CNN
        representation), their running statistics are then estimated anew on its split, as their
        average over its batches (AdaBN), not left at the initial values a few batches move little."""
        kept = self.local_keys(parameters, list(global_state))
        names = set(parameters)
        own = [k for k in kept if k in names]
        statistics = any(k.endswith(".running_mean") for k in kept)
        return tune(global_state, own, statistics=statistics) if own else global_state


def layer_of(key: str) -> str:
    """The module a state entry belongs to (its name without the last component)."""
    return key.rsplit(".", 1)[0] if "." in key else ""


def _stage(module: str) -> int:
    """Where a module sits in the forward pass of a FedModel: encoder, projector, classifier
    (the base class registers the projector and classifier before a subclass's encoder)."""
    return 2 if module == "classifier" else 1 if module.startswith("projector.") else 0


def layers(parameters: list[str]) -> list[str]:
    """The layers of a FedModel — the modules owning parameters (linear, convolution, normalisation)
    — in forward order (encoder, projector, classifier), from its parameter names."""
    return sorted(dict.fromkeys(layer_of(p) for p in parameters), key=_stage)


@contextmanager
def training_only(model: FedModel, names: set[str]) -> Iterator[None]:
    """Train only the parameters in ``names`` (those already trainable) for the block's duration."""
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.requires_grad_(flags[n] and n in names)
    try:
        yield
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(flags[n])
