"""Shared pieces of the benchmark scripts: workloads, thread settings, the operator census.

The timing (alternating sides, ratios to a bracketing baseline, tables) and the CIFAR-shaped arrays
are ``fedlatent bench``'s, imported from :mod:`fedlatent.experiment.tooling.timing` and
:mod:`fedlatent.experiment.tooling.bench`; nothing of the library is copied here.
"""
from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from fedlatent.backends import simulation
from fedlatent.config import RunConfig, load_config
from fedlatent.data.federation import build_federation
from fedlatent.data.types import Federation
from fedlatent.experiment.tooling.bench import cifar_shaped_npz
from fedlatent.experiment.tooling.timing import (BASELINE, Clock, bracketed, dump, machine, median, quartiles,
                                         table, timed)
from fedlatent.federated.trainer import lockstep_update
from fedlatent.methods import resolve

__all__ = ["BASELINE", "TRAINERS", "Clock", "Workload", "base_parser", "bracketed", "cifar_shaped_npz", "dump",
           "federation_for", "machine", "median", "op_census", "quartiles", "set_threads", "table",
           "timed", "workloads"]

# Each embedded backend's trainer (simulation.setup's trainer hook), by backend name
TRAINERS = {"simulation": simulation.train_in_turn, "vectorized": lockstep_update}

# A run long enough that run_round never reaches its last round (which always evaluates), and
# eval.every large: no evaluation inside the timed rounds.
NO_EVAL = ["train.rounds=100000", "eval.every=100000"]


@dataclass
class Workload:
    """One benchmark setting: a name, the configuration overrides and the federation."""

    name: str
    label: str
    overrides: list[str]

    def config(self, extra: list[str] = ()) -> RunConfig:
        return load_config(None, [*self.overrides, *NO_EVAL, *extra])


_TMP = tempfile.TemporaryDirectory(prefix="fedlatent-bench-")


def workloads(quick: bool, batch_size: int, clients: int | None = None, samples: int | None = None,
              local_epochs: int = 1) -> dict[str, Workload]:
    """The two settings every benchmark runs: the digits MLP and the small CNN on CIFAR-shaped data."""
    n_clients = clients or (4 if quick else 10)
    n_samples = samples or (100 if quick else 200)
    npz = cifar_shaped_npz(Path(_TMP.name) / f"cifar_shaped_{n_clients}x{n_samples}.npz", n_clients, n_samples)
    common = [f"train.batch_size={batch_size}", f"train.local_epochs={local_epochs}", "train.lr=0.01"]
    return {
        "mlp": Workload("mlp", f"digits MLP 64-128-10, {n_clients} clients iid",
                        ["data.dataset=digits", "data.partition=iid", f"data.num_clients={n_clients}",
                         "model.arch=mlp", *common]),
        "cnn": Workload("cnn", f"small CNN (FedUV, release widths), {n_clients}x{n_samples} 3x32x32 random",
                        ["data.dataset=arrays", f"data.path={npz}", "data.partition=given", "model.arch=cnn",
                         *common]),
    }


def federation_for(config: RunConfig) -> Federation:
    return build_federation(config.data, config.data_seed)


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="a short run (fewer clients and repetitions)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads, the same for every side (default 1)")
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated subset of: mlp, cnn")
    parser.add_argument("--reps", type=int, default=0, help="timed repetitions (0 = the script's default)")
    parser.add_argument("--batch-size", type=int, default=32, help="local mini-batch size (default 32)")
    parser.add_argument("--clients", type=int, default=0, help="clients (0 = 4 quick, 10 full)")
    parser.add_argument("--samples", type=int, default=0,
                        help="samples per client of the CIFAR-shaped data (0 = 100 quick, 200 full)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return parser


def set_threads(n: int) -> None:
    torch.set_num_threads(n)


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += 1
        return func(*args, **(kwargs or {}))


def op_census(fn: Callable[[], Any]) -> dict[str, int]:
    """Deterministic cost figures of ``fn()``: the number of ATen operators dispatched (forward,
    backward and optimiser alike: on small models each costs microseconds of fixed overhead) and
    the FLOPs of the matmuls and convolutions (``torch.utils.flop_counter``). Unlike timings they
    do not depend on the load of the machine."""
    counter = _OpCounter()
    with FlopCounterMode(display=False) as flops, counter:
        fn()
    return {"ops": counter.count, "flops": int(flops.get_total_flops())}


def round_caller(workload: "Workload", backend: str, device: str, extra: list[str]) -> Callable[[], None]:
    """One round (``simulation.run_round``, no evaluation) of ``workload`` on ``backend`` per call, on
    ``device`` with SGD momentum 0.9 and the overrides ``extra`` (rounds numbered on; CUDA synchronised)."""
    config = workload.config([f'train.device="{device}"', "train.momentum=0.9", *extra])
    setup = simulation.setup(config, federation_for(config), resolve(config.algorithm, config.terms), TRAINERS[backend])
    rounds = iter(range(10 ** 6))

    def one() -> None:
        simulation.run_round(setup, next(rounds))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return one

