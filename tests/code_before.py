"""Runs of an earlier commit's code beside this checkout's: the check that a change left the numbers
as they were. The commit's ``src`` is taken out of this repository's history (``git archive``), and a
script runs under each tree in its own process, writing its runs under the folder it is given."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedlatent.federated.state import client_tensors, is_client_file

ROOT = Path(__file__).resolve().parents[1]

# the head of a script for runs_before_and_now: fedlatent with its figures off, one thread, and the
# folder ``out`` (its sys.argv[1]) that its runs go under
SCRIPT_HEAD = """
import sys
from pathlib import Path
import torch
import fedlatent
from fedlatent.experiment.runner import single
from fedlatent.experiment.runner.figures import NoFigures
single.FigureWorker = lambda *a, **k: NoFigures()
single.start_process = lambda: None
torch.set_num_threads(1)
out = Path(sys.argv[1])
"""


def _run(script: str, src: Path, out: Path) -> None:
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script, str(out)], env=env, capture_output=True, text=True,
                          cwd=out.parent)
    assert done.returncode == 0, done.stderr[-2000:]


def runs_before_and_now(commit: str, script: str, tmp_path: Path) -> tuple[Path, Path]:
    """``script`` (its ``sys.argv[1]``: the folder to write into) run by ``commit``'s code and by this
    checkout's; the two folders, (before, now). Skipped where git or the commit is missing."""
    git = shutil.which("git")
    if git is None or subprocess.run([git, "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                                     capture_output=True).returncode != 0:
        pytest.skip(f"commit {commit} is not in this checkout's history")
    before = tmp_path / "before"
    before.mkdir()
    archive = subprocess.run([git, "-C", str(ROOT), "archive", commit, "src"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
    _run(script, before / "src", tmp_path / "old")
    _run(script, ROOT / "src", tmp_path / "new")
    return tmp_path / "old", tmp_path / "new"


# what later changes add to or take from a run's metrics lines on purpose, so that "the numbers of
# the code before" compares numbers: the server's count of updates held to the clip bound (issue
# 53; 0 for honest clients, so a non-zero count still differs) and the per-client training losses,
# no longer released under DP (their mean, train_loss, is still compared)
ADDED_IF_ZERO = ("privacy_over_bound",)
RELEASED_BEFORE = ("client_train_loss",)


def record(run: Path) -> tuple[list[dict], dict, dict]:
    """A run's metrics lines and final evaluation without their clocks (and the keys above), and its
    last checkpoint's digests (:func:`checkpoint_digests`)."""
    lines = []
    for text in (run / "metrics.jsonl").read_text().splitlines():
        line = {k: v for k, v in json.loads(text).items()
                if not (k.startswith("time_") or "seconds" in k or k in RELEASED_BEFORE)}
        lines.append({k: v for k, v in line.items() if not (k in ADDED_IF_ZERO and v == 0)})
    final = json.loads((run / "summary.json").read_text())["final"]
    return lines, {k: v for k, v in final.items() if "seconds" not in k}, checkpoint_digests(run)


def checkpoint_digests(run: Path) -> dict[str, str]:
    """The digests of a run's last checkpoint's files but state.json (its clock), the client states'
    set as one (``clients``: the same states whichever layout of files holds them, an earlier
    version's shards or segments)."""
    latest = json.loads((run / "checkpoints" / "latest.json").read_text())["folder"]
    digests = json.loads((run / "checkpoints" / latest / "manifest.json").read_text())["sha256"]
    states, clients = client_tensors(run / "checkpoints" / latest), hashlib.sha256()
    for key in sorted(states):
        clients.update(f"{key} {states[key].dtype} {list(states[key].shape)}".encode())
        clients.update(states[key].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return {**{k: v for k, v in digests.items() if k != "state.json" and not is_client_file(k)},
            "clients": clients.hexdigest()}
