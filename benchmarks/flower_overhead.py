"""What fedlatent costs on Flower: fedlatent on Flower's simulation engine against the embedded
backend and against a hand-written Flower app of the same workload, all measured in one run.

Workload: digits, MLP 64-128-10, 10 IID clients, one local epoch (batch 32, lr 0.05, momentum
0.9), the global model evaluated every round, 20 rounds. Sides:

- ``flower``: ``fedlatent run`` with ``backend = "flower"`` (simulation engine, Ray, one virtual
  SuperNode per client), the full run directory written (metrics, a checkpoint every round);
- ``embedded``: the same config on ``backend = "simulation"``;
- ``hand``: ``flower_handwritten.py``, plain torch and the Message API, nothing written.

Per side: the median round time (fedlatent: ``time_round_s`` of ``metrics.jsonl``; the hand-written
app times its rounds the same way, training messages + aggregation + evaluation) and the fixed
cost = the call's wall time − rounds × the median round: start-up (Ray, its workers, data, model;
on the hand-written app the workers start inside round 1, on fedlatent during its census),
shutdown, and the first round's warm-up. The sides run alternately (``hand flower embedded`` then reversed, ``--reps`` times),
Ray gets the same CPUs on both Flower sides; ratios are of medians.

    python benchmarks/flower_overhead.py [--reps 1] [--cpus 2] [--rounds 20] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import flower_handwritten  # noqa: E402
import fedlatent  # noqa: E402
from fedlatent.experiment.tooling.timing import machine  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"


def fedlatent_side(backend: str, rounds: int, cpus: int) -> dict[str, float]:
    config = fedlatent.load_config(CONFIG, [f'backend="{backend}"', f"train.rounds={rounds}", f"flower.cpus={cpus}",
                                            "eval.every=1"])
    out = Path(tempfile.mkdtemp(prefix="fedlatent-flower-bench-")) / backend
    started = time.perf_counter()
    summary = fedlatent.run(config, out)
    total = time.perf_counter() - started
    rounds_s = [json.loads(line)["time_round_s"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"round_s": float(np.median(rounds_s)), "fixed_s": total - len(rounds_s) * float(np.median(rounds_s)),
            "total_s": total, "accuracy": summary["final"]["accuracy"]}


def hand_side(rounds: int, cpus: int) -> dict[str, float]:
    started = time.perf_counter()
    result = flower_handwritten.run(rounds, 10, {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                                 "init_args": {"num_cpus": cpus}})
    total = time.perf_counter() - started
    median = float(np.median(result["round_s"]))
    return {"round_s": median, "fixed_s": total - len(result["round_s"]) * median, "total_s": total,
            "accuracy": result["accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=1, help="alternating passes (each runs every side twice)")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs Ray gets on both Flower sides")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sides = {"hand": lambda: hand_side(args.rounds, args.cpus),
             "flower": lambda: fedlatent_side("flower", args.rounds, args.cpus),
             "embedded": lambda: fedlatent_side("simulation", args.rounds, args.cpus)}
    order = ["hand", "flower", "embedded"]
    results: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for _ in range(args.reps):
        for name in order + order[::-1]:
            results[name].append(sides[name]())
            print(f"{name:>8}: {results[name][-1]}", file=sys.stderr)
    med = {name: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for name, rs in results.items()}
    print(f"digits MLP 64-128-10, 10 clients, {args.rounds} rounds, eval every round; "
          f"{2 * args.reps} runs per side, medians; Ray: {args.cpus} CPUs")
    print(f"{'side':>10} {'round (s)':>10} {'fixed (s)':>10} {'total (s)':>10} {'accuracy':>9}")
    for name in order:
        m = med[name]
        print(f"{name:>10} {m['round_s']:>10.3f} {m['fixed_s']:>10.2f} {m['total_s']:>10.2f} {m['accuracy']:>9.4f}")
    ratios = {f"flower/{other} {k}": med["flower"][k] / med[other][k]
              for other in ("hand", "embedded") for k in ("round_s", "fixed_s", "total_s")}
    for key, value in ratios.items():
        print(f"{key:>28}: {value:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "runs": results, "medians": med,
                                               "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
