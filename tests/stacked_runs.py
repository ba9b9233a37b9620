"""Short runs for tests: runs trained as one lockstep stack, each set up and played in the cohort's
thread as ``fedlatent sweep --stack`` plays them (:func:`fedlatent.experiment.studies.stacking.run_stack`),
and one run on each embedded backend."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fedlatent.backends import simulation
from fedlatent.backends.stacked import Cohort


def run_stacked(configs: list, setup: Callable[[Any, Callable], simulation.Setup], rounds: int = 2) -> list[simulation.Setup]:
    """``configs`` run as one stack for ``rounds`` rounds, each set up by ``setup(config, trainer)``;
    their setups, in the configs' order."""
    cohort = Cohort(len(configs))
    setups: list = [None] * len(configs)

    def member(i: int) -> Callable[[], list]:
        def go() -> list:
            setups[i] = setup(configs[i], cohort.trainer)
            return [simulation.run_round(setups[i], rnd) for rnd in range(rounds)]
        return go
    results = cohort.play([member(i) for i in range(len(configs))])
    assert not any(isinstance(r, BaseException) for r in results), results
    return setups


def run_on_each_backend(config: Any, setup: Callable[[Any, Callable], simulation.Setup], trainers: dict[str, Callable],
                        rounds: int = 2) -> dict[str, simulation.Setup]:
    """``config`` run alone with each of ``trainers`` (name → client trainer) for ``rounds`` rounds;
    the simulation and vectorized trainers' global weights asserted equal up to float rounding."""
    alone = {name: setup(config, trainer) for name, trainer in trainers.items()}
    for s in alone.values():
        for rnd in range(rounds):
            simulation.run_round(s, rnd)
    for k, v in alone["simulation"].server.global_state.items():
        torch.testing.assert_close(alone["vectorized"].server.global_state[k], v, atol=2e-5, rtol=1e-4, msg=k)
    return alone
