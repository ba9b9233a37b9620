"""Is the sequential client the lockstep trainer over one client? What that would cost per round.

Digits (the MLP of ``configs/digits_fedavg.toml``, 10 IID clients, one epoch, batch 32), 1 thread,
every client of a round trained by ``federated.client.local_update`` (sequential, twice: the A/A
row) or by ``federated.trainer.lockstep_update`` called for one client at a time. The three
sides alternate round by round in one process; the figure is the median of the per-round ratios.

    python benchmarks/one_client_lockstep.py [ROUNDS] [METHOD ...]
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.data.federation import build_federation
from fedlatent.federated.trainer import lockstep_update
from fedlatent.methods import resolve

METHODS = ("fedavg", "fedprox", "moon", "ditto_mkmmd")


def one_at_a_time(ws, global_state, datas, spec, rcs, settings, generators):
    """The simulation backend's trainer with each client's update run in lockstep alone."""
    return [lockstep_update(ws, global_state, [d], spec, [rc], settings, [g])[0]
            for d, rc, g in zip(datas, rcs, generators)]


def main(rounds: int, methods: list[str]) -> None:
    torch.set_num_threads(1)
    for name in methods:
        config = fedlatent.load_config("configs/digits_fedavg.toml", ["train.rounds=1"])
        config.algorithm = {"name": name}
        fed = build_federation(config.data, config.data_seed)
        trainers = {"seq": simulation.train_in_turn, "seq2": simulation.train_in_turn, "lock1": one_at_a_time}
        setups = {k: simulation.setup(config, fed, resolve(config.algorithm, config.terms), t)
                  for k, t in trainers.items()}
        times: dict[str, list[float]] = {k: [] for k in setups}
        for rnd in range(rounds + 1):  # round 0 warms up
            for key, s in setups.items():
                started = time.perf_counter()
                simulation.run_round(s, rnd)
                if rnd:
                    times[key].append(time.perf_counter() - started)
        aa = statistics.median(a / b for a, b in zip(times["seq2"], times["seq"]))
        ratio = statistics.median(a / b for a, b in zip(times["lock1"], times["seq"]))
        print(f"{name:12s} sequential {statistics.median(times['seq']) * 1e3:6.1f} ms/round  "
              f"A/A {aa:.3f}  one-client lockstep / sequential {ratio:.3f}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7, sys.argv[2:] or list(METHODS))
