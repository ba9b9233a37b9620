"""One client's state in bytes, measured before a run with a state budget (``train.client_state_memory``)
starts, so that a budget below it is refused before any run folder exists.

What a client keeps is whatever its method's parts, its program, the optimiser rule (kept states) and
the update codec (a residual) put in its state, so it is measured rather than declared: client 0 of
the run's model and method plays two rounds of one step each on two zero samples of the data's input
shape, on the CPU (the shapes and dtypes are those of any device), and its state's bytes are counted.
Every random draw is made inside a forked generator state, so the run's numbers do not depend on it.
A state that grows only later in a run (a rule that starts after some rounds) is counted as it is
after two: the check refuses budgets that cannot hold one state, and the store holds the state in
use whatever its size.
"""
from __future__ import annotations

import dataclasses

import torch

from fedlatent.backends.simulation import initial_server
from fedlatent.config import RunConfig
from fedlatent.data.types import ServerView, Split
from fedlatent.federated.client import workspace_for
from fedlatent.federated.client_states import state_bytes
from fedlatent.federated.round import ClientTask, client_update, encoded, local_settings, round_lr
from fedlatent.methods.parts import MethodSpec, Tensors

ROUNDS = 2  # rounds client 0 plays: a state some part first fills in its second round is counted
SAMPLES = 2  # one batch of two (BatchNorm trains on more than one sample)


def one_state_bytes(config: RunConfig, spec: MethodSpec, input_shape: tuple[int, ...], num_classes: int) -> int:
    """The bytes of one client's state under ``config`` and ``spec`` (see the module's docstring)."""
    train = dataclasses.replace(config.train, device="cpu", compile=False, batch_size=SAMPLES, drop_last=False,
                                local_steps=1)
    cfg = dataclasses.replace(config, train=train, model=dataclasses.replace(config.model, weights=""))
    data = Split(torch.zeros((SAMPLES, *input_shape)), torch.arange(SAMPLES) % max(num_classes, 1))
    state: Tensors = {}
    with torch.random.fork_rng(devices=[]):
        model, server = initial_server(cfg, ServerView(None, num_classes, input_shape, config.data.dataset), spec,
                                       ROUNDS)
        ws = workspace_for(model, spec)
        for rnd in range(ROUNDS):
            payload = {k: v for part in server.payload().values() for k, v in part.items()}
            task = ClientTask(0, rnd, server.global_state, payload, round_lr(train, rnd), ROUNDS, ROUNDS * SAMPLES,
                              cfg.seed)
            settings = local_settings(train, task.lr, 1, False, max(num_classes, 1), torch.device("cpu"), cfg.privacy)
            upload, state = client_update(ws, spec, task, data, state, settings)
            encoded(server.codec, [upload], task, server.untransmitted(), {0: state})
    return state_bytes(state)
