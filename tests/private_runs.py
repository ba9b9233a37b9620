"""Short private runs for the privacy tests: digits FedAvg over six clients, three sampled a round,
set up on either embedded trainer and played round by round (:func:`simulation.run_round`)."""
from __future__ import annotations

from pathlib import Path

import fedlatent
from fedlatent.backends import simulation
from fedlatent.config import RunConfig
from fedlatent.data.federation import build_federation
from fedlatent.federated.trainer import lockstep_update
from fedlatent.methods import resolve

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"
SMALL = ["data.num_clients=6", "train.rounds=3", "train.participation=0.5"]
TRAINERS = {"simulation": simulation.train_in_turn, "vectorized": lockstep_update}


def small_config(*extra: str) -> RunConfig:
    """The small digits run with ``extra`` overrides."""
    return fedlatent.load_config(CONFIG, [*SMALL, *extra])


def set_up(config: RunConfig, trainer=simulation.train_in_turn) -> simulation.Setup:
    """``config``'s run set up on ``trainer`` (the simulation backend's by default), no round played."""
    return simulation.setup(config, build_federation(config.data, config.data_seed),
                            resolve(config.algorithm, config.terms), trainer)
