"""FedAvg rounds of the simulation backend with 1 and with 2 torch threads.

Each thread count runs in its own worker process (``torch.set_num_threads`` once, at start, as
``fedlatent run`` does with ``train.threads``; changing it inside a running process is not what a
run does and distorts the result), one untimed warm-up round, then ``--rounds`` timed rounds.
Workers for the different counts are launched in alternation, ``--reps`` times each, so all see
the same load; the table gives medians over every timed round and the ratio of the wall time to
the first count's. Wall time is what matters here (CPU time counts every thread).

    python benchmarks/threads.py --quick
    python benchmarks/threads.py --threads-list 1,2
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from fedlatent.backends import simulation  # noqa: E402
from fedlatent.methods import resolve  # noqa: E402

DEFAULT_REPS = {True: 2, False: 4}
DEFAULT_ROUNDS = {True: {"mlp": 5, "cnn": 1}, False: {"mlp": 10, "cnn": 2}}


def worker(args) -> None:
    """Time ``args.rounds`` rounds of one model at ``args.threads`` threads; print JSON."""
    C.set_threads(args.threads)
    load = C.workloads(args.quick, args.batch_size, args.clients or None, args.samples or None)[args.models]
    config = load.config()
    s = simulation.setup(config, C.federation_for(config), resolve(config.algorithm, config.terms))
    simulation.run_round(s, 0)
    times = []
    for rnd in range(1, args.rounds + 1):
        times.append(C.timed(lambda: simulation.run_round(s, rnd)))
    print(json.dumps({"threads": torch.get_num_threads(), "label": load.label, "times": times}))


def main(argv: list[str] | None = None) -> int:
    parser = C.base_parser(__doc__.split("\n")[0])
    parser.add_argument("--threads-list", default="1,2", help="thread counts to compare (the first is the baseline)")
    parser.add_argument("--rounds", type=int, default=0, help="timed rounds per worker (0 = the default)")
    parser.add_argument("--worker", action="store_true", help=argparse_hidden())
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    counts = [int(n) for n in args.threads_list.split(",")]
    reps = args.reps or DEFAULT_REPS[args.quick]
    rows, results = [], {"machine": C.machine(), "argv": sys.argv[1:], "workloads": {}}
    for name in args.models.split(","):
        rounds = args.rounds or DEFAULT_ROUNDS[args.quick][name]
        times: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
        label = ""
        for rep in range(reps):
            order = counts if rep % 2 == 0 else counts[::-1]
            for n in order:
                cmd = [sys.executable, __file__, "--worker", "--threads", str(n), "--models", name,
                       "--rounds", str(rounds), "--batch-size", str(args.batch_size),
                       "--clients", str(args.clients), "--samples", str(args.samples)] + (["--quick"] if args.quick else [])
                done = subprocess.run(cmd, check=True, capture_output=True, text=True)
                report = json.loads(done.stdout.strip().splitlines()[-1])
                times[n] += report["times"]
                label = report["label"]
            print(f"  {name}: rep {rep + 1}/{reps}", file=sys.stderr, flush=True)
        results["workloads"][name] = {"label": label, "reps": reps, "rounds_per_worker": rounds,
                                      "times": {str(n): t for n, t in times.items()}}
        base = C.median([t["wall"] for t in times[counts[0]]])
        for n in counts:
            wall = C.median([t["wall"] for t in times[n]])
            rows.append([name, n, len(times[n]), 1e3 * wall, 1e3 * C.median([t["wall_cpu"] for t in times[n]]),
                         wall / base])
        print(f"{name}: {label}", flush=True)
    print(f"torch {torch.__version__}, {C.machine()['cpu_count']} CPUs, FedAvg run_round, "
          f"one worker process per thread count, launched in alternation; medians")
    print(C.table(["model", "threads", "rounds", "round ms (wall)", "round ms (cpu, all threads)",
                   f"wall / {counts[0]} thread(s)"], rows))
    C.dump(args.json, results)
    return 0


def argparse_hidden() -> str:
    import argparse
    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
