"""The client-state store (``train.client_state_memory``, issue 54): peak memory, seconds per round and
checkpoint bytes of stateful methods with a state budget, beside the same run without one.

Each cell is one ``fedlatent run`` in its own process (its peak resident memory its own): Synthetic(0.5,
0.5) with 50 samples a client, ``N`` clients, a cohort of 100 a round, one CPU thread, the default
backend, SCAFFOLD (c_i: one float per weight) or Ditto (a personal model), an MLP of ``--hidden`` units
(60·h + h + 10·h + 10 floats a state: 568 KB at the default 2,000) for ``--rounds`` rounds, so that the
states of the clients trained so far (cohort × rounds of them) outgrow the budget. The baseline of each
row is the same run without a budget, measured in the same invocation: "× unbounded" divides the
budget's seconds per round (the median of ``time_round_s``) by it; beside them FedAvg's run, which keeps
no client state: its peak is what the data, the model and the cohort's training take, which a budget's
run should exceed by the budget at most (and the states in use: a cohort's, a checkpoint's copies).

    python benchmarks/state_store.py --sizes 10000                       # a piece
    python benchmarks/state_store.py --sizes 100000 --budget 256MiB,16MiB --json out.json

"checkpoint written" is what the run's last checkpoint wrote of its client states' files (those not
hard-linked from the write before: the segment of the states changed since the write before, or the
whole live set when it compacted) over the full set it holds; "largest write" the most any of the
run's checkpoints wrote (a compaction), "written in all" the sum over every checkpoint the run took; "states" the bytes of every client state
of the last checkpoint. Peak memory is the child's ``ru_maxrss`` (the data included: 100,000 clients of
50 samples of 60 floats are 1.2 GB).
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

from scale import CHILD as SCALE_CHILD  # one run in a fresh interpreter, its peak printed last
from scale import COHORT
from scale import CONFIG as SCALE_CONFIG

# scale.py's cells (the data, the model, one thread, the cohort), evaluated at the end alone
CONFIG = SCALE_CONFIG.replace("[algorithm]", "[eval]\nevery = 1000\nfinal_clients = 100\n[algorithm]")
# scale.py's run, the bytes of client-state files each checkpoint wrote counted (their sum, the most, how many)
CHILD = ("import collections; from fedlatent.federated import state\n"
         "wrote, real = collections.Counter(), state.write_file\n"
         "def counted(path, data):\n"
         "    real(path, data)\n"
         "    if state.is_client_file(path.name):\n"
         "        wrote[path.parent.name] += path.stat().st_size\n"
         "state.write_file = counted\n"
         + SCALE_CHILD.replace("code = main(sys.argv[1:])\n", "code = main(sys.argv[1:])\n"
                               "print('WROTE', sum(wrote.values()), max(wrote.values(), default=0), len(wrote))\n"))


def checkpoint_bytes(folder: Path) -> tuple[int, int]:
    """(bytes the newest checkpoint wrote of its client states' files, bytes of them all)."""
    rounds = sorted(folder.glob("round*"), key=lambda p: int(p.name[5:]))
    newest, before = rounds[-1], (rounds[-2] if len(rounds) > 1 else None)
    files = list(newest.glob("clients*"))
    fresh = [p for p in files if before is None or not (before / p.name).exists()
             or (before / p.name).stat().st_ino != p.stat().st_ino]
    return sum(p.stat().st_size for p in fresh), sum(p.stat().st_size for p in files)


def cell(folder: Path, method: str, clients: int, budget: str, rounds: int, hidden: int, extra: list[str]) -> dict:
    """One run: seconds per round, wall seconds, peak memory, checkpoint bytes."""
    config = folder / "state_store.toml"
    config.write_text(CONFIG)
    out = folder / f"{method}_{clients}_{budget}"
    sets = [f"data.num_clients={clients}", f"train.participation={COHORT / clients!r}", f'algorithm.name="{method}"',
            f"train.rounds={rounds}", f"model.hidden=[{hidden}]", f'train.client_state_memory="{budget}"', *extra]
    argv = [sys.executable, "-c", CHILD, "run", str(config), "--out", str(out), "--no-figures", "--no-progress",
            *[a for s in sets for a in ("--set", s)]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{method} N={clients} budget {budget}: exit {done.returncode}\n{done.stderr[-2000:]}")
    *_, wrote, peak_line = done.stdout.strip().splitlines()
    peak = int(peak_line.split()[1])
    all_written, largest, writes = map(int, wrote.split()[1:])
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    written, total = checkpoint_bytes(out / "checkpoints")
    return {"method": method, "clients": clients, "budget": budget, "rounds": rounds, "hidden": hidden,
            "s_per_round": statistics.median(line["time_round_s"] for line in lines), "wall_s": wall,
            "peak_bytes": peak, "checkpoint_written": written, "states_bytes": total,
            "written_all": all_written, "largest_write": largest, "writes": writes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000", help="numbers of clients N, comma-separated")
    parser.add_argument("--methods", default="scaffold,ditto")
    parser.add_argument("--budget", default="256MiB,16MiB",
                        help="train.client_state_memory of the budget's cells, comma-separated")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=2000, help="the MLP's hidden units (a state's size)")
    parser.add_argument("--set", action="append", default=[], help="an extra override for every cell")
    parser.add_argument("--json", type=Path, help="write the cells here")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="state_store_") as tmp:
        for clients in (int(n) for n in args.sizes.split(",")):
            alone = cell(Path(tmp), "fedavg", clients, "unbounded", args.rounds, args.hidden, args.set)
            rows.append({**alone, "x_unbounded": 1.0})
            print(f"fedavg   N={clients:>7,} (no state): {alone['s_per_round']:.3f} s/round, peak "
                  f"{alone['peak_bytes'] / 2**30:.2f} GiB (the data, the model, the cohort's training)", flush=True)
            for method in args.methods.split(","):
                base, *kept = (cell(Path(tmp), method, clients, budget, args.rounds, args.hidden, args.set)
                               for budget in ("unbounded", *args.budget.split(",")))
                for row in (base, *kept):
                    row["x_unbounded"] = row["s_per_round"] / base["s_per_round"]
                    rows.append(row)
                    print(f"{method:8} N={clients:>7,} {row['budget']:>9}: {row['s_per_round']:.3f} s/round "
                          f"({row['x_unbounded']:.2f}x), peak {row['peak_bytes'] / 2**30:.2f} GiB, whole run "
                          f"{row['wall_s']:.0f} s, checkpoint wrote {row['checkpoint_written'] / 2**20:.1f} of "
                          f"{row['states_bytes'] / 2**20:.1f} MiB of states; {row['writes']} checkpoints wrote "
                          f"{row['written_all'] / 2**20:.1f} MiB in all, the largest "
                          f"{row['largest_write'] / 2**20:.1f} MiB", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
