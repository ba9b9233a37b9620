"""``benchmarks/full_scale_cifar10.sh``, the script a GPU session runs once in its few minutes of
device time: checked here on a CPU in its smoke mode (``SMOKE=1``: a few images a class and one
round) on a generated archive of the shared CIFAR-10 archive's layout, so that a broken script is
found before a device's minutes are spent on it."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedlatent.data.readers import CIFAR10_CLASSES

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "full_scale_cifar10.sh"

pytestmark = pytest.mark.slow


def _archive(tmp_path: Path) -> Path:
    """cifar10-jpeg/{train,test}/<class>/NNNN.jpg, 20 training and 10 test images a class, as .tar.gz."""
    rng = np.random.default_rng(0)
    tree = tmp_path / "tree" / "cifar10-jpeg"
    for split, n in (("train", 20), ("test", 10)):
        for name in CIFAR10_CLASSES:
            (tree / split / name).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(tree / split / name / f"{i:04d}.jpg")
    archive = tmp_path / "cifar10-jpeg.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname="cifar10-jpeg")
    return archive


def test_the_full_scale_script_extracts_decodes_trains_both_steps_and_compares(tmp_path: Path) -> None:
    fedlatent = tmp_path / "fedlatent"  # the command the script calls, as this interpreter runs it
    fedlatent.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fedlatent.cli "$@"\n')
    fedlatent.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "SMOKE": "1", "DEVICE": "cpu", "JOBS": "1", "BUDGET": "600", "FEDLATENT": str(fedlatent),
           "FEDLATENT_CACHE_DIR": str(tmp_path / "cache"), "MPLBACKEND": "Agg"}
    done = subprocess.run(["bash", str(SCRIPT), str(_archive(tmp_path)), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (out / "cifar10-jpeg" / "train" / "airplane" / "0000.jpg").is_file()
    assert any((tmp_path / "cache").iterdir())  # decoded once, into the cache asked for
    for step, column in (("feduv_a0.01", "cifar10-a0.01"), ("feduv_a1", "cifar10-a1")):
        comparison = (out / step / "comparison.md").read_text()
        for method, paper in (("fedavg", "34.70" if column.endswith("0.01") else "72.40"),
                              ("feduv-mu0.5-lamC4", "37.70" if column.endswith("0.01") else "75.30")):
            line = next(l for l in comparison.splitlines() if l.startswith(f"| {column} | {method} |"))
            assert f"| {paper} |" in line and line.rstrip().endswith("| 1 | ran |")
