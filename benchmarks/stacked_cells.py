"""A study's cells stacked into one lockstep stack against the same cells one after another.

K digits cells (the MLP of ``configs/digits_fedavg.toml``, 10 clients, Dirichlet 0.5, seeds
0..K-1) on the vectorized backend: ``fedlatent sweep --stack K`` against ``--stack off``, whole
sweeps into fresh folders (set-up, training, evaluation, files), alternating, with one torch
thread. Prints the median seconds of each side and their ratio; a ratio under 1 means stacking
pays on this device.

    python benchmarks/stacked_cells.py [--cells 4] [--rounds 20] [--reps 3] [--device cpu]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedlatent.experiment.studies.study import parse_study
from fedlatent.experiment.studies.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]


def study(cells: int, rounds: int, device: str):
    raw = {"title": "stacked cells", "base": str(ROOT / "configs" / "digits_fedavg.toml"),
           "set": {"train.rounds": rounds, "data.partition": "dirichlet", "data.alpha": 0.5,
                   "backend": "vectorized", "train.device": device},
           "grid": {"seed": list(range(cells))}}
    return parse_study(raw, ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    times: dict[str, list[float]] = {"one after another": [], "stacked": []}
    sides = {"one after another": "off", "stacked": args.cells}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for side, stack in sides.items():
                started = time.perf_counter()
                run_sweep(study(args.cells, args.rounds, args.device), Path(tmp) / f"{side}-{rep}", echo=None,
                          figures=False, stack=stack)
                times[side].append(time.perf_counter() - started)
    base, stacked = (statistics.median(times[s]) for s in sides)
    print(f"{args.cells} digits cells x {args.rounds} rounds on {args.device}: one after another {base:.2f} s, "
          f"stacked {stacked:.2f} s, stacked / one after another {stacked / base:.3f}")


if __name__ == "__main__":
    main()
