"""A study's per-cell overhead as Ray tasks on one machine (``--cluster ray``) against ``--jobs`` worker processes.

Digits cells (the MLP of ``configs/digits_fedavg.toml``, 10 clients, ``--rounds`` rounds, seeds
0..N-1), two at a time on each side: ``--jobs 2`` (spawned worker processes) and ``--cluster ray``
(a Ray instance started by the sweep with 2 CPUs, a cell asking one CPU; held to two tasks in
flight here, so that no cell waits in Ray's queue). Whole sweeps into fresh folders, alternating
sides, with one torch thread. A cell's overhead is the time from the sweep handing it to the
executor to the sweep holding its result, less the run's own wall time (``summary.json``'s
``wall_seconds``): argument and result transfer, scheduling, the worker's start and imports for a
worker's first cell, and for Ray the task's shared-folder check and placement line. Prints each
side's median over cells (all cells, and a worker's later cells alone), the start-up of the executor
(``ray.init`` for Ray; spawned workers start with their first cell), and the ratio of the medians.

    python benchmarks/ray_overhead.py [--cells 8] [--rounds 2] [--reps 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from fedlatent.experiment.studies import cluster as ray_cluster
from fedlatent.experiment.studies import sweep as sweeps
from fedlatent.experiment.studies.study import parse_study

ROOT = Path(__file__).resolve().parents[1]
WORKERS = 2


class Timed:
    """An executor held to ``WORKERS`` units in flight, timing each unit from submit to collect."""

    def __init__(self, inner: Any, overheads: list[tuple[float, bool]]) -> None:
        self.inner, self.overheads, self.started = inner, overheads, {}

    def room(self, running: int) -> bool:
        return running < WORKERS and self.inner.room(running)

    def submit(self, configs, outs, figures) -> Future:
        begun = time.perf_counter()
        future = self.inner.submit(configs, outs, figures)
        self.started[future] = (begun, outs)
        return future

    def collect(self, future: Future) -> list[str]:
        errors = self.inner.collect(future)
        ended = time.perf_counter()
        begun, outs = self.started.pop(future)
        summaries = [json.loads((Path(out) / "summary.json").read_text()) for out in outs]
        self.overheads.append((ended - begun - sum(s["wall_seconds"] for s in summaries),
                               any(s.get("first_in_process") for s in summaries)))
        return errors

    def close(self) -> None:
        self.inner.close()


class TimedCluster(ray_cluster.Cluster):
    def __init__(self, overheads: list[tuple[float, bool]], startup: list[float]) -> None:
        super().__init__("ray", num_cpus=WORKERS, include_dashboard=False, object_store_memory=80 * 2**20,
                         log_to_driver=False)
        self.overheads, self.startup = overheads, startup

    def connect(self) -> None:
        fresh, begun = not self.ray.is_initialized(), time.perf_counter()
        super().connect()
        if fresh:
            self.startup.append(time.perf_counter() - begun)

    def executor(self, out, echo):
        return Timed(super().executor(out, echo), self.overheads)


def study(cells: int, rounds: int):
    raw = {"title": "ray overhead", "base": str(ROOT / "configs" / "digits_fedavg.toml"),
           "set": {"train.rounds": rounds, "backend": "simulation"}, "grid": {"seed": list(range(cells))}}
    return parse_study(raw, ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    overheads: dict[str, list[tuple[float, bool]]] = {"jobs": [], "ray": []}
    walls: dict[str, list[float]] = {"jobs": [], "ray": []}
    startup: list[float] = []
    local = sweeps.local
    sweeps.local = lambda jobs: Timed(local(jobs), overheads["jobs"])  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for side in ("jobs", "ray"):
                cluster = TimedCluster(overheads["ray"], startup) if side == "ray" else None
                begun = time.perf_counter()
                sweeps.run_sweep(study(args.cells, args.rounds), Path(tmp) / f"{side}-{rep}", jobs=1 if cluster else WORKERS,
                                 echo=None, figures=False, stack="off", cluster=cluster)
                walls[side].append(time.perf_counter() - begun)
                print(f"  {side} sweep {rep}: {walls[side][-1]:.2f} s", flush=True)
    medians = {}
    for side in ("jobs", "ray"):
        every = [o for o, _ in overheads[side]]
        later = [o for o, first in overheads[side] if not first]
        firsts = [o for o, first in overheads[side] if first]
        medians[side] = statistics.median(later)
        print(f"{side:4s}: overhead per cell, median {statistics.median(every):.3f} s over {len(every)} cells, "
              f"{medians[side]:.3f} s over the {len(later)} that were not their worker's first, "
              f"{statistics.median(firsts) if firsts else float('nan'):.3f} s over the {len(firsts)} firsts; "
              f"sweep wall median {statistics.median(walls[side]):.2f} s")
    print(f"ray start-up (ray.init) median {statistics.median(startup):.2f} s")
    print(f"{WORKERS} at a time, {args.cells} digits cells x {args.rounds} rounds: later cells' overhead "
          f"ray - jobs {medians['ray'] - medians['jobs']:+.3f} s, ray / jobs {medians['ray'] / medians['jobs']:.2f}")


if __name__ == "__main__":
    main()
