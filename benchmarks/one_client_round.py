"""The sequential client's round, timed in the source tree this interpreter imports: compare two
commits by running this script alternately under each (``PYTHONPATH=<tree>/src``), so both sides
see the same machine moments.

Digits (the MLP of ``configs/digits_fedavg.toml``, 10 IID clients, one epoch, batch 32) and each
method of METHODS with SGD (momentum 0.9) and AdamW: every round trains the ten clients one after
another with ``simulation.train_in_turn`` (the one-client local update, ten times); the figure is
the median over rounds of the seconds per client. Prints one JSON line.

    python benchmarks/one_client_round.py [ROUNDS]
    for i in 1 2 3; do for t in OLD NEW; do PYTHONPATH=$t/src python benchmarks/one_client_round.py; done; done
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.data.federation import build_federation
from fedlatent.methods import resolve

METHODS = ("fedavg", "fedprox", "ditto")
OPTIMIZERS = {"sgd": [], "adamw": ["train.optimizer=adamw", "train.lr=0.001"]}


def seconds_per_client(method: str, optimizer: str, rounds: int) -> float:
    config = fedlatent.load_config("configs/digits_fedavg.toml", ["train.rounds=1", "eval.every=1000", *OPTIMIZERS[optimizer]])
    config.algorithm = {"name": method}
    federation = build_federation(config.data, config.data_seed)
    s = simulation.setup(config, federation, resolve(config.algorithm, config.terms))
    simulation.run_round(s, 0)  # warm-up
    times = []
    for rnd in range(1, rounds + 1):
        started = time.perf_counter()
        simulation.run_round(s, rnd)
        times.append((time.perf_counter() - started) / len(federation.clients))
    return statistics.median(times)


def main(rounds: int) -> None:
    torch.set_num_threads(1)
    print(json.dumps({"tree": fedlatent.__file__,
                      **{f"{m}/{o}": seconds_per_client(m, o, rounds) for m in METHODS for o in OPTIMIZERS}}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
