"""The vectorized backend: the simulation backend's round loop (the server and client halves of
``federated.round``), with the selected clients trained at once (its trainer hook is
``federated.trainer``: stacked weights, the model's stacked forward or ``torch.func.vmap``)
instead of in turn.

Same server, checkpoints, evaluation and results as ``simulation``; the weights agree with it up to
floating-point rounding (models with dropout: in distribution only, see ``federated.trainer``). Worth it when clients are many and steps small (per-operator overhead is
paid once per step for all clients, not once per client); :func:`check` names what it cannot run.
"""
from __future__ import annotations

from functools import partial

from fedlatent.backends import simulation
from fedlatent.config import RunConfig
from fedlatent.errors import ConfigError
from fedlatent.federated.trainer import lockstep_update, unsupported
from fedlatent.methods.parts import MethodSpec

trainer = lockstep_update
run = partial(simulation.run, trainer=trainer)


def check(config: RunConfig, spec: MethodSpec) -> None:
    """Raise a one-line ConfigError when this run cannot train in lockstep."""
    reason = unsupported(spec)
    if reason:
        raise ConfigError(f"backend = 'vectorized': {reason} (method '{spec.name}', model '{config.model.arch}'); "
                          f"use backend = 'simulation'")
