"""A cross-device run killed by SIGKILL mid-round and resumed ends as the uninterrupted run does.

Issue 54's check at full scale: ``scale.py``'s cell (Synthetic(0.5, 0.5), 50 samples a client, a
cohort of 100 a round, one CPU thread) at ``N`` clients, run twice in fresh processes. The first
runs uninterrupted; the second is sent SIGKILL once its ``metrics.jsonl`` holds ``--kill-after``
rounds and the next round has started (``--delay`` seconds later: no Python handler runs, the
background checkpoint writer is cut wherever it is), then continued with ``fedlatent run --resume``.
The two must agree on every metric of every round (wall times aside) and on the final global model's
bytes. Printed: the rounds the killed run's newest intact checkpoint held, the bytes its
checkpoints wrote after the first (client-state files alone, counted by inode), and the verdict.

    python benchmarks/kill_resume.py                               # 100,000 clients, SCAFFOLD
    python benchmarks/kill_resume.py --clients 10000 --method ditto --set train.client_state_memory=16MiB
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import CHILD, CONFIG  # noqa: E402  (the scale cell's configuration and child)

TIME = "time_"  # a metric's prefix of wall seconds: the ones two identical runs differ in


def argv_for(config: Path, out: Path, sets: list[str], resume: bool = False) -> list[str]:
    return [sys.executable, "-c", CHILD, "run", str(config), "--out", str(out), "--no-figures", "--no-progress",
            *(["--resume"] if resume else []), *[a for s in sets for a in ("--set", s)]]


def rounds(out: Path) -> list[dict]:
    """The run's metrics lines, times left out."""
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIME)} for line in lines if line.strip()]


def final_model(out: Path) -> str:
    """SHA-256 of the newest checkpoint's global model (the run's final weights)."""
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    folder = out / "checkpoints" / latest["folder"]
    return hashlib.sha256((folder / "global.safetensors").read_bytes()).hexdigest()


def state_file_bytes(out: Path) -> dict[str, int]:
    """Bytes of client-state files in each round folder that no earlier folder shares (by inode)."""
    seen: set[int] = set()
    written: dict[str, int] = {}
    for folder in sorted((out / "checkpoints").glob("round*")):
        total = 0
        for f in folder.glob("clients*"):
            st = f.stat()
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_size
        written[folder.name] = total
    return written


def killed_run(config: Path, out: Path, sets: list[str], kill_after: int, delay: float, env: dict) -> int:
    """Start the run, SIGKILL it ``delay`` s after its ``kill_after``-th round line appears; the
    rounds its metrics held when it died."""
    child = subprocess.Popen(argv_for(config, out, sets), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, env=env)
    while child.poll() is None and len(rounds(out)) < kill_after:
        time.sleep(0.05)
    if child.poll() is not None:
        raise SystemExit(f"the run ended before round {kill_after} (exit {child.returncode}):\n"
                         f"{child.stderr.read()[-2000:] if child.stderr else ''}")
    time.sleep(delay)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    return len(rounds(out))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100_000)
    parser.add_argument("--method", default="scaffold")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--kill-after", type=int, default=6, help="rounds completed before the kill")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds into the next round the kill comes")
    parser.add_argument("--cohort", type=int, default=100)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an extra override")
    args = parser.parse_args(argv)
    sets = [f"data.num_clients={args.clients}", f"train.participation={args.cohort / args.clients!r}",
            f'algorithm.name="{args.method}"', f"train.rounds={args.rounds}", "eval.final_clients=1000", *args.set]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="fedlatent-kill-resume-") as tmp:
        config = Path(tmp) / "scale.toml"
        config.write_text(CONFIG)
        whole, cut = Path(tmp) / "whole", Path(tmp) / "cut"
        started = time.perf_counter()
        done = subprocess.run(argv_for(config, whole, sets), capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(f"uninterrupted run: exit {done.returncode}\n{done.stderr[-2000:]}")
        print(f"uninterrupted: {args.rounds} rounds in {time.perf_counter() - started:.0f} s", flush=True)
        held = killed_run(config, cut, sets, args.kill_after, args.delay, env)
        print(f"killed (SIGKILL) {args.delay} s after round {args.kill_after}'s line: metrics held {held} rounds",
              flush=True)
        written = state_file_bytes(cut)
        if not written:
            print("no checkpoint was written before the kill: the resume starts from round 1 "
                  "(raise --kill-after: a checkpoint is written at most every second)", flush=True)
        resumed = subprocess.run(argv_for(config, cut, sets, resume=True), capture_output=True, text=True, env=env)
        if resumed.returncode != 0:
            raise SystemExit(f"resumed run: exit {resumed.returncode}\n{resumed.stderr[-2000:]}")
        same_rounds = rounds(whole) == rounds(cut)
        same_model = final_model(whole) == final_model(cut)
        print(f"client-state bytes each checkpoint folder wrote before the kill (by inode): {written}")
        print(f"{args.method}, N = {args.clients:,}: metrics of every round equal: {same_rounds}; "
              f"final global model equal: {same_model}", flush=True)
        if not (same_rounds and same_model):
            raise SystemExit(1)


if __name__ == "__main__":
    main()
