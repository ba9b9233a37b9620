"""The trainer's entry points: one client (:func:`local_update`, the simulation backend and Flower's
ClientApp), the clients of a round at once (:func:`lockstep_update`, the vectorized backend), the
clients of several runs at once (:func:`lockstep_runs`, stacked cells), and :func:`unsupported`, why
a method cannot train in lockstep. A call is the client program's round around three steps: the
set-up (:mod:`~fedlatent.federated.trainer.setup`), the steps
(:mod:`~fedlatent.federated.trainer.steps`), the end (:mod:`~fedlatent.federated.trainer.finish`)."""
from __future__ import annotations

import torch

from fedlatent.data.types import Split
from fedlatent.federated.client import LocalSettings, Workspace
from fedlatent.federated.trainer.finish import finish
from fedlatent.federated.trainer.setup import set_up
from fedlatent.federated.trainer.steps import take_steps
from fedlatent.methods.parts import ClientRound, MethodSpec, Tensors, Upload


def unsupported(spec: MethodSpec) -> str | None:
    """Why ``spec`` cannot train in lockstep (one line), or None when it can: a term without a
    lockstep form, a copy of the client's program declared not ``stacked``."""
    for part in spec.parts:
        if part.has_term() and not part.has_lockstep_form():
            return f"part '{part.name}' acts on the client's training step, which has no lockstep form yet"
    program = spec.personalization
    for copy in program.copies:
        if not copy.stacked:
            return f"the {program.kind} program's copy '{copy.name}' trains one client at a time"
    for part in program.parts:
        if not part.has_lockstep_form() or part.needs_prev_out:
            return f"the {program.kind} program's constraint '{part.name}' has no lockstep form yet"
    return None


def local_update(ws: Workspace, global_state: Tensors, data: Split, spec: MethodSpec, rc: ClientRound,
                 s: LocalSettings, generator: torch.Generator) -> Upload:
    """Train one client from ``global_state`` on ``data`` (the trainer with a stack of one: the
    model's own weights and forward); update ``rc.state`` in place; return the upload."""
    return lockstep_update(ws, global_state, [data], spec, [rc], s, [generator])[0]


def lockstep_update(ws: Workspace, global_state: Tensors, datas: list[Split], spec: MethodSpec,
                    rcs: list[ClientRound], s: LocalSettings, generators: list[torch.Generator]) -> list[Upload]:
    """Train the clients of ``rcs`` from ``global_state`` on ``datas`` at once, as their program
    has it (its start weights, its round around the trainer); update each ``rc.state`` in place and
    return their uploads (as :func:`local_update` would, one by one)."""
    return _program_round(ws, [global_state] * len(rcs), datas, spec, rcs, s, generators)


def lockstep_runs(ws: Workspace, global_states: list[Tensors], datas: list[Split], specs: list[MethodSpec],
                  rcs: list[ClientRound], s: LocalSettings, generators: list[torch.Generator]) -> list[Upload]:
    """Train clients of several runs at once, client c from ``global_states[c]`` (its run's global
    state: one object for the clients of one run) with ``specs[c]``, its run's method — the cells of
    a study stacked (:mod:`fedlatent.backends.stacked`). The runs share ``s`` and their methods'
    shape (:func:`fedlatent.methods.coefficients.method_shape`): they may differ in coefficients,
    each client's terms then reading its own. A client's numbers are those of its run trained
    alone, up to floating-point rounding. A program that trains in phases around the trainer
    (partial personalisation) is not stacked across runs."""
    program = specs[0].personalization
    if not program.stacks_runs:
        raise ValueError(f"the {program.kind} program is not trained across runs")
    return _program_round(ws, global_states, datas, specs[0], rcs, s, generators, methods=specs)


def _program_round(ws: Workspace, starts: list[Tensors], datas: list[Split], spec: MethodSpec,
                   rcs: list[ClientRound], s: LocalSettings, generators: list[torch.Generator],
                   methods: list[MethodSpec] | None = None) -> list[Upload]:
    """The program's round: its start weights from the round's ``starts``, its round around the
    trainer (``methods``: the clients' own runs' methods, where they come from stacked runs)."""
    program = spec.personalization

    def train(starts_: list[Tensors], spec_: MethodSpec, rcs_: list[ClientRound], s_: LocalSettings) -> list[Upload]:
        return _train_together(ws, starts_, datas, spec_, rcs_, s_, generators, methods)
    return program.round(ws.model, program.start(ws.model, starts, spec, rcs, datas, s), spec, rcs, s, train)


def _train_together(ws: Workspace, starts: list[Tensors], datas: list[Split], spec: MethodSpec,
                    rcs: list[ClientRound], s: LocalSettings, generators: list[torch.Generator],
                    methods: list[MethodSpec] | None) -> list[Upload]:
    """Train client c of ``rcs`` from ``starts[c]`` on ``datas[c]``, all at once: the set-up, the
    steps, the end."""
    r = set_up(ws, starts, datas, spec, rcs, s, generators, methods)
    take_steps(r)
    return finish(r)
