"""Runs of an earlier commit's code beside this checkout's: the check that a change left the numbers
as they were. The commit's ``src`` is taken out of this repository's history (``git archive``), and a
script runs under each tree in its own process, writing its runs under the folder it is given."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
