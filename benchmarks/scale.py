"""Cross-device scale: seconds per round and peak memory as the federation grows, at a fixed cohort.

Each cell is one ``fedlatent run`` in its own process (so its peak resident memory is its own):
Synthetic(0.5, 0.5) with 50 samples a client (``data.partition = "given"``), ``N`` clients, a
cohort of 100 a round (``train.participation = 100 / N``), one CPU thread, the default backend,
FedAvg, SCAFFOLD or Ditto. Beside them, the baseline measured in the same invocation: the cohort's
training alone, a federation of exactly the cohort's 100 clients, all of them sampled every round.
A cell's seconds per round (the median of its rounds' ``time_round_s``) divided by the baseline's
is what the federation's size adds to a round (the issue's goal: at most 1.5 at N = 100,000).

    python benchmarks/scale.py --sizes 1000,10000                 # a piece: two sizes, FedAvg
    python benchmarks/scale.py --sizes 100000 --methods fedavg,scaffold,ditto --json out.json
    python benchmarks/scale.py --sizes 1000 --set eval.every=100     # any extra --set override
    python benchmarks/scale.py --sizes 100000 --final-clients 1000   # the final evaluation on a sample
    python benchmarks/scale.py --partitions 10000,100000             # the partitions alone, in seconds

Peak memory is the child process's ``ru_maxrss``; "whole run" is its wall seconds (data built,
rounds, final evaluation, files written). Where ``--final-clients`` is given (and below N), the
final evaluation takes that sample (``eval.final_clients``): it is the run's, not a round's, cost.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

COHORT = 100
CONFIG = """seed = 0
[data]
dataset = "synthetic"
partition = "given"
num_clients = 100
samples_per_client = 50
synthetic_alpha = 0.5
synthetic_beta = 0.5
[model]
arch = "mlp"
hidden = [20]
[train]
rounds = 3
threads = 1
[algorithm]
name = "fedavg"
"""

# one run, in a fresh interpreter; its peak resident memory printed last (bytes)
CHILD = ("import resource, sys; from fedlatent.cli import main\n"
         "code = main(sys.argv[1:])\n"
         "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)\n"
         "sys.exit(code)\n")


def cell(folder: Path, method: str, clients: int, cohort: int, rounds: int, extra: list[str],
         final_clients: int = 0) -> dict:
    """One run of ``method`` over ``clients`` clients at ``cohort`` a round: its seconds per round,
    set-up, training and wall seconds, and peak memory."""
    config = folder / "scale.toml"
    config.write_text(CONFIG)
    out = folder / f"{method}_{clients}"
    sets = [f"data.num_clients={clients}", f"train.participation={cohort / clients!r}",
            f'algorithm.name="{method}"', f"train.rounds={rounds}", *extra]
    if final_clients and final_clients < clients:  # the final evaluation on a sample (it is not a round's cost)
        sets.append(f"eval.final_clients={final_clients}")
    argv = [sys.executable, "-c", CHILD, "run", str(config), "--out", str(out), "--no-figures", "--no-progress",
            *[a for s in sets for a in ("--set", s)]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{method} N={clients}: exit {done.returncode}\n{done.stderr[-2000:]}")
    peak = int(done.stdout.strip().splitlines()[-1].split()[1])
    summary = json.loads((out / "summary.json").read_text())
    rounds_s = [json.loads(line)["time_round_s"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"method": method, "clients": clients, "cohort": cohort, "round_s": statistics.median(rounds_s),
            "rounds_s": rounds_s, "setup_s": summary["setup_seconds"], "train_s": summary["train_seconds"],
            "wall_s": wall, "peak_bytes": peak, "backend": summary["backend"]}


def partitions(sizes: list[int], per_client: int = 20, classes: int = 10) -> None:
    """Seconds of the Dirichlet (α = 0.5, ``min_size`` 0), shards (2 classes a client) and iid
    partitions of ``per_client`` × N seeded labels over N clients, in this process."""
    from fedlatent.data import partition as P
    for n in sizes:
        labels = np.random.default_rng(0).integers(0, classes, n * per_client)
        timed = {}
        for name, make in (("dirichlet", lambda: P.dirichlet(labels, n, 0.5, seed=0, min_size=0)),
                           ("shards", lambda: P.shards(labels, n, 2, seed=0)),
                           ("iid", lambda: P.iid(len(labels), n, seed=0))):
            started = time.perf_counter()
            make()
            timed[name] = time.perf_counter() - started
        print(f"partition N={n:>8,d} ({len(labels):,} samples): " +
              "  ".join(f"{k} {v:6.2f} s" for k, v in timed.items()), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated federation sizes N")
    parser.add_argument("--methods", default="fedavg", help="comma-separated: fedavg, scaffold, ditto")
    parser.add_argument("--cohort", type=int, default=COHORT, help="clients a round (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds a run (default 3)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra configuration override for every cell (repeatable)")
    parser.add_argument("--final-clients", type=int, default=0,
                        help="the final evaluation on a sample of this many clients (0: every client)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the cohort-alone baseline")
    parser.add_argument("--json", metavar="PATH", help="also write the cells as JSON")
    parser.add_argument("--partitions", metavar="N,N", help="time the partitions alone over these sizes instead")
    args = parser.parse_args(argv)
    if args.partitions:
        partitions([int(n) for n in args.partitions.split(",")])
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedlatent-scale-") as tmp:
        for method in args.methods.split(","):
            base = None if args.no_baseline else cell(Path(tmp), method, args.cohort, args.cohort, args.rounds,
                                                      args.set, args.final_clients)
            for n in ([] if base is None else [None]) + sizes:
                row = base if n is None else cell(Path(tmp), method, n, args.cohort, args.rounds, args.set,
                                                         args.final_clients)
                row = {**row, "vs_cohort": None if base is None else row["round_s"] / base["round_s"]}
                rows.append(row)
                ratio = "" if row["vs_cohort"] is None else f"{row['vs_cohort']:6.2f}x"
                print(f"{method:9s} N={row['clients']:>8,d}  {row['round_s']:8.3f} s/round {ratio:>8s}  "
                      f"set-up {row['setup_s']:7.1f} s  train {row['train_s']:7.1f} s  whole {row['wall_s']:7.1f} s"
                      f"  peak {row['peak_bytes'] / 2 ** 30:5.2f} GiB  ({row['backend']})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
