"""A study's per-cell cost as Ray tasks on one machine (``--cluster ray``) against ``--jobs`` worker processes.

Digits cells (the MLP of ``configs/digits_fedavg.toml``, 10 clients, ``--rounds`` rounds, seeds
0..N-1), two at a time on each side: ``--jobs 2`` (spawned worker processes) and ``--cluster ray``
(a Ray instance started by the sweep with 2 CPUs, a cell asking one). Whole sweeps into fresh
folders, alternating sides, with one torch thread. Each side runs K and 2K cells; the difference
over K is the cost of one more cell (start-up — worker spawn, imports, ``ray.init`` — cancels), and
what is left of the K-cell sweep is the side's fixed start-up. Prints the medians and the ratio of
the per-cell costs (Ray / --jobs).

    python benchmarks/ray_overhead.py [--cells 4] [--rounds 2] [--reps 2]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedlatent.experiment.studies.cluster import Cluster
from fedlatent.experiment.studies.study import parse_study
from fedlatent.experiment.studies.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]
WORKERS = 2


def study(cells: int, rounds: int):
    raw = {"title": "ray overhead", "base": str(ROOT / "configs" / "digits_fedavg.toml"),
           "set": {"train.rounds": rounds, "backend": "simulation"}, "grid": {"seed": list(range(cells))}}
    return parse_study(raw, ROOT)


def sweep(side: str, cells: int, rounds: int, out: Path) -> float:
    cluster = Cluster("ray", num_cpus=WORKERS, include_dashboard=False, object_store_memory=80 * 2**20,
                      log_to_driver=False) if side == "ray" else None
    started = time.perf_counter()
    run_sweep(study(cells, rounds), out, jobs=1 if cluster else WORKERS, echo=None, figures=False, stack="off",
              cluster=cluster)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=4, help="K: the sides run K and 2K cells")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    times: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for cells in (args.cells, 2 * args.cells):
                for side in ("jobs", "ray"):
                    seconds = sweep(side, cells, args.rounds, Path(tmp) / f"{side}-{cells}-{rep}")
                    times.setdefault((side, cells), []).append(seconds)
                    print(f"  {side} {cells} cells: {seconds:.2f} s", flush=True)
    per_cell, fixed = {}, {}
    for side in ("jobs", "ray"):
        small, large = (statistics.median(times[(side, c)]) for c in (args.cells, 2 * args.cells))
        per_cell[side] = (large - small) / args.cells
        fixed[side] = small - args.cells * per_cell[side]
        print(f"{side:4s}: {args.cells} cells {small:.2f} s, {2 * args.cells} cells {large:.2f} s; "
              f"per cell {per_cell[side]:.3f} s, fixed start-up {fixed[side]:.2f} s")
    print(f"{WORKERS} at a time, digits x {args.rounds} rounds: per-cell cost ray / jobs {per_cell['ray'] / per_cell['jobs']:.3f}, "
          f"ray's extra per cell {per_cell['ray'] - per_cell['jobs']:+.3f} s, extra start-up {fixed['ray'] - fixed['jobs']:+.2f} s")


if __name__ == "__main__":
    main()
