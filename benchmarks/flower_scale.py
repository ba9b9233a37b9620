"""Flower's simulation engine at cross-device scale: N virtual clients, one SuperNode each, a cohort of 100.

One ``fedlatent run`` with ``backend = "flower"`` (``flwr.simulation.run_simulation``, Ray) in its
own process: Synthetic(0.5, 0.5) with 50 samples a client (``scale.py``'s cell), ``N`` clients and
as many SuperNodes, 100 clients a round, FedAvg, one torch thread a ClientApp, Ray given
``--cpus`` CPUs. Each SuperNode builds its own client alone when first asked (a node's process
holds the federation's outline, not its clients: ``data.clients.Clients``); the server holds no
client's data. Measured: the run's wall seconds, its set-up (the census of every node included;
the census's own seconds beside it) and rounds, the driver's peak resident memory (``ru_maxrss``: the ServerApp and the engine) and the
peak of the resident memory of the driver and all its descendants together (Ray's raylet, GCS and
workers; sampled every 0.5 s from /proc, shared pages counted once per process).

    python benchmarks/flower_scale.py --clients 1000
    python benchmarks/flower_scale.py --clients 10000 --rounds 3 --set eval.clients=100 --json out.json
    python benchmarks/flower_scale.py --clients 1000 --client-cpus 0.5     # 4 ClientApps at once on 2 CPUs
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import CONFIG  # noqa: E402  (the scale cell's configuration)

# one run, in a fresh interpreter: the census's seconds (ServerRun.take_census timed) and its peak
# resident memory (bytes) printed last
CHILD = ("import resource, sys, time\n"
         "from fedlatent.backends.flower import server_app\n"
         "take = server_app.ServerRun.take_census\n"
         "def timed(self):\n"
         "    started = time.perf_counter(); census = take(self)\n"
         "    print('CENSUS', time.perf_counter() - started, flush=True); return census\n"
         "server_app.ServerRun.take_census = timed\n"
         "from fedlatent.cli import main\n"
         "code = main(sys.argv[1:])\n"
         "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)\n"
         "sys.exit(code)\n")


def tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and every process below it (read from /proc)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parents[int(entry)] = int(fields[1])
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    inside, frontier = {root}, [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier and pid not in inside]
        inside.update(frontier)
    return sum(rss.get(pid, 0) for pid in inside)


def run(clients: int, rounds: int, cohort: int, cpus: int, extra: list[str], client_cpus: float = 1.0,
        supernodes: int = 0) -> dict:
    """One Flower simulation run of ``clients`` virtual clients on ``supernodes`` SuperNodes (0: one
    a client), each ClientApp given ``client_cpus`` of Ray's ``cpus``: its times and peak memory."""
    with tempfile.TemporaryDirectory(prefix="fedlatent-flower-scale-") as tmp:
        config = Path(tmp) / "scale.toml"
        config.write_text(CONFIG)
        out = Path(tmp) / "run"
        sets = ['backend="flower"', f"data.num_clients={clients}", f"train.participation={cohort / clients!r}",
                f"train.rounds={rounds}", f"flower.cpus={cpus}", f"flower.client_cpus={client_cpus!r}",
                f"flower.supernodes={supernodes}", *extra]
        argv = [sys.executable, "-c", CHILD, "run", str(config), "--out", str(out), "--no-figures", "--no-progress",
                *[a for s in sets for a in ("--set", s)]]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "FLWR_TELEMETRY_ENABLED": "0"}
        started = time.perf_counter()
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        peak = [0]

        def sample() -> None:
            while child.poll() is None:
                peak[0] = max(peak[0], tree_rss(child.pid))
                time.sleep(0.5)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        stdout, stderr = child.communicate()
        wall = time.perf_counter() - started
        sampler.join()
        if child.returncode != 0:
            raise SystemExit(f"N={clients}: exit {child.returncode}\n{stderr[-3000:]}")
        summary = json.loads((out / "summary.json").read_text())
        rounds_s = [json.loads(line)["time_round_s"] for line in (out / "metrics.jsonl").read_text().splitlines()]
        printed = dict(line.split(maxsplit=1) for line in stdout.splitlines() if line.startswith(("CENSUS ", "PEAK ")))
        return {"clients": clients, "supernodes": supernodes or clients, "client_cpus": client_cpus, "cohort": cohort,
                "cpus": cpus, "wall_s": wall, "setup_s": summary["setup_seconds"], "census_s": float(printed["CENSUS"]),
                "train_s": summary["train_seconds"], "rounds_s": rounds_s, "round_s": statistics.median(rounds_s),
                "driver_peak_bytes": int(printed["PEAK"]), "tree_peak_bytes": peak[0],
                "accuracy": summary["final"].get("accuracy"), "accuracy_se": summary["final"].get("accuracy_se")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1000", help="comma-separated numbers of virtual clients")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cohort", type=int, default=100)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs given to Ray (flower.cpus)")
    parser.add_argument("--client-cpus", type=float, default=1.0, help="CPUs reserved per ClientApp (flower.client_cpus)")
    parser.add_argument("--supernodes", type=int, default=0, help="SuperNodes (flower.supernodes; 0: one a client)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an extra override")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    rows = []
    for n in (int(c) for c in args.clients.split(",")):
        row = run(n, args.rounds, args.cohort, args.cpus, args.set, args.client_cpus, args.supernodes)
        rows.append(row)
        print(f"flower N={n:>7,d} on {row['supernodes']:,d} SuperNodes, {args.client_cpus:g} CPU a ClientApp  "
              f"{row['round_s']:7.2f} s/round  set-up {row['setup_s']:7.1f} s (census {row['census_s']:7.1f} s)  "
              f"train {row['train_s']:7.1f} s  whole {row['wall_s']:7.1f} s  driver peak "
              f"{row['driver_peak_bytes'] / 2 ** 30:5.2f} GiB  all processes {row['tree_peak_bytes'] / 2 ** 30:5.2f} GiB",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
