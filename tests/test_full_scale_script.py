"""``benchmarks/full_scale_cifar10.sh`` and ``benchmarks/gpu_lease.sh``, the scripts a lease of a
device runs in its few minutes: checked here on a CPU in their smoke mode (``SMOKE=1``: a few images
a class, one round, each step's first setting and seed) on a generated archive of the shared
CIFAR-10 archive's layout, so that a broken script is found before a device's minutes are spent on
it; and the table writer ``benchmarks/full_scale_table.py`` on runs stopped at different rounds.

The lease is checked as a device machine would run it (the dry run): from a bare copy of the working
tree (tracked and untracked-not-ignored files, no ``../shared`` beside it), the archive carried into
the copy's ignored ``data/``, the packages the device image lacks hidden
(``tests/device_image/sitecustomize.py``), ``$OUT`` set as the device tool sets it."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import re
import shlex
import shutil
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fedlatent.data.readers import CIFAR10_CLASSES

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "full_scale_cifar10.sh"


def _table_module() -> Any:
    """``benchmarks/full_scale_table.py``, imported from its file (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("full_scale_table", ROOT / "benchmarks" / "full_scale_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(markdown: str) -> dict[str, dict[str, str]]:
    """The table's body lines by their first two cells (setting/method), each cell by its header
    (the start of it: ``paper``, ``fedlatent``, ``majority``, ``test accuracy``, ``rounds``, ``seeds``, ``status``)."""
    header, *rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in markdown.splitlines()
                     if line.startswith("| ")]
    short = [h.split()[0] for h in header]
    return {f"{r[0]}/{r[1]}": dict(zip(short, r)) for r in rows}


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


def _fedlatent(tmp_path: Path) -> dict[str, str]:
    """The environment the scripts run under here: the command as this interpreter runs it, on this
    checkout's sources, a cache folder of the test's own."""
    fedlatent = tmp_path / "fedlatent"
    fedlatent.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fedlatent.cli "$@"\n')
    fedlatent.chmod(0o755)
    return {**os.environ, "SMOKE": "1", "DEVICE": "cpu", "JOBS": "1", "FEDLATENT": str(fedlatent),
            "PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src"), "COMMIT": "abc1234",
            "FEDLATENT_CACHE_DIR": str(tmp_path / "cache"), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}


@pytest.mark.long  # every step of the GPU script on a CPU (~5 min); the lease script's test runs the first step
def test_the_full_scale_script_runs_every_step_writes_its_table_and_resumes(tmp_path: Path) -> None:
    out, results = tmp_path / "out", tmp_path / "results"
    env = {**_fedlatent(tmp_path), "BUDGET": "1200", "RESULTS": str(results)}
    done = subprocess.run(["bash", str(SCRIPT), str(_archive(tmp_path)), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (out / "cifar10-jpeg" / "train" / "airplane" / "0000.jpg").is_file()
    assert any((tmp_path / "cache").iterdir())  # decoded once, into the cache asked for
    papers: dict[str, dict[str, str | None]] = {"feduv_a0.01": {"cifar10-a0.01/fedavg": "34.70", "cifar10-a0.01/fedprox-mu0.001": "35.50",
                              "cifar10-a0.01/moon-mu1": "35.70", "cifar10-a0.01/feduv-mu0.5-lamC4": "37.70"},
              "feduv_a1": {"cifar10-a1/fedavg": "72.40", "cifar10-a1/fedprox-mu0.001": "73.50",
                           "cifar10-a1/moon-mu1": "74.70", "cifar10-a1/feduv-mu0.5-lamC4": "75.30"},
              "feddecorr": {"cifar10-a0.05/fedavg": "64.85 ± 2.01", "cifar10-a0.05/fedavg+decorr": "73.06 ± 0.81"},
              "ditto_table1": {"cifar10-a0.1/fedavg": "71.22", "cifar10-a0.1/cosine": "84.21",
                               "cifar10-a0.1/mmdd": "83.79", "cifar10-a0.1/mkmmd_every1": "84.14",
                               "cifar10-a0.1/mkmmd_every20": "84.44"},
              "ditto_table2": {"cifar10-a0.1/fedavg": None, "cifar10-a0.1/ditto": None, "cifar10-a0.1/ditto+cosine": None,
                               "cifar10-a0.1/ditto+mmdd": None, "cifar10-a0.1/ditto+mkmmd_every1": None,
                               "cifar10-a0.1/ditto+mkmmd_every20": None}}
    for step, expected in papers.items():
        assert (out / step / "comparison.md").is_file()
        page = (results / f"{step}.md").read_text()
        rows = _rows(page)
        assert set(rows) == set(expected), step
        for key, row in rows.items():
            assert expected[key] is None or row["paper"] == expected[key]
            assert row["fedlatent"] != "-" and row["rounds"] == "1 / 1" and row["status"] == "finished"
            assert row["seeds"] == ("2021" if step.startswith("ditto") else "0")
            assert ("majority" in row) == step.startswith("ditto")  # personalised: the majority-class rate beside
        assert "abc1234" in page and "cpu" in page and "mean of rounds 1-1" in page
        per_round = (results / f"{step}.csv").read_text().splitlines()
        assert per_round[0].startswith("run,setting,method,seed,round,") and len(per_round) == 1 + len(expected)
        assert len(json.loads((results / f"{step}.json").read_text())) == 1
    # the same command again: every run is kept, the tables note a second update
    again = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "cifar10-jpeg.tar.gz"), str(out)], cwd=ROOT,
                           env={**env, "STEPS": "feduv_a0.01"}, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "4 of 4 runs finished already" in again.stdout and "feduv_a1:" not in again.stdout
    assert len(json.loads((results / "feduv_a0.01.json").read_text())) == 2


def test_an_unknown_step_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(SCRIPT), "missing.tar.gz", str(tmp_path / "out")], cwd=ROOT,
                          env={**_fedlatent(tmp_path), "STEPS": "feduv_a0.01 feduv_a2"}, capture_output=True, text=True)
    assert done.returncode == 2 and "unknown step 'feduv_a2'" in done.stderr


def _metrics(run: Path, accuracies: list[float]) -> None:
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "test_accuracy": a, "train_loss": 1.0}) + "\n"
                                               for r, a in enumerate(accuracies, start=1)))


def test_the_table_compares_every_row_over_the_same_last_five_rounds(tmp_path: Path, monkeypatch) -> None:
    """Runs stopped by the budget at rounds 8 and 6, one not started: the window is rounds 2-6 for
    both started rows (means by hand), the last values are those of rounds 8 and 6."""
    from fedlatent.experiment.studies.reproduce import load_spec, write_record
    table = _table_module()
    folder = tmp_path / "feduv_a0.01"
    only = {"setting": ["cifar10-a0.01"], "method": ["fedavg", "moon-mu1", "feduv-mu0.5-lamC4"]}
    write_record(folder, "feduv_supp_table2", "full", None, only, ['train.device="cpu"'])
    cells = {c.labels["method"]: c.name for c in load_spec("feduv_supp_table2", only=only).cells}
    _metrics(folder / cells["fedavg"], [r / 100 for r in range(1, 9)])  # rounds 1-8: 0.01 ... 0.08
    _metrics(folder / cells["feduv-mu0.5-lamC4"], [0.2 + r / 100 for r in range(1, 7)])  # rounds 1-6
    monkeypatch.setenv("COMMIT", "abc1234")
    page = table.write_step(folder, tmp_path / "results", "2026-11-27", table.commit()).read_text()
    table.write_step(folder, tmp_path / "results", "2026-11-28", "def5678")
    assert "mean of rounds 2-6 (%)" in page and "Updated 2026-11-27 on commit abc1234, cpu" in page
    rows = {key: list(row.values())[2:] for key, row in _rows(page).items()}
    assert rows["cifar10-a0.01/fedavg"] == ["34.70", "8.00", "4.00", "8 / 100", "0", "unfinished"]
    assert rows["cifar10-a0.01/feduv-mu0.5-lamC4"] == ["37.70", "26.00", "24.00", "6 / 100", "0", "unfinished"]
    assert rows["cifar10-a0.01/moon-mu1"] == ["35.70", "-", "-", "0 / 100", "0", "not run"]
    history = json.loads((tmp_path / "results" / "feduv_a0.01.json").read_text())
    assert [h["commit"] for h in history] == ["abc1234", "def5678"]
    assert history[0]["rounds_reached"]["cifar10-a0.01/fedavg"] == [8]
    per_round = (tmp_path / "results" / "feduv_a0.01.csv").read_text().splitlines()
    assert len(per_round) == 1 + 8 + 6 and per_round[0] == "run,setting,method,seed,round,test_accuracy,train_loss"


def _bare_copy(dest: Path, archive: Path | None) -> Path:
    """The working tree as the device tool sends it — tracked and untracked-not-ignored files — with
    ``archive`` carried to its ignored ``data/cifar10-jpeg.tar.gz``; nothing beside it."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        source, target = ROOT / rel, dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():  # travels as a link (src/fedlatent/configs → the checkout's configs/)
            target.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, target)
    if archive is not None:
        (dest / "data").mkdir()
        shutil.copy2(archive, dest / "data" / "cifar10-jpeg.tar.gz")
    return dest


def _lease(tree: Path, out: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """``benchmarks/gpu_lease.sh`` run in ``tree`` as on a device machine: ``$OUT`` set, the lease's
    defaults (lease folder ``$OUT/lease``, pack ``$OUT/state``, the archive in ``data/``), the
    device image's missing packages hidden, the scratch folder at one path for every lease (as
    ``/tmp/fedlatent-lease`` is on each device machine) and a cache of the lease's own."""
    out.mkdir(parents=True)
    base = {k: v for k, v in os.environ.items() if k not in ("PACK", "UNPACK", "OUT", "PYTHONPATH")}
    variables = {**base, "OUT": str(out), "SMOKE": "1", "DEVICE": "cpu", "JOBS": "1", "PYTHON": sys.executable,
                 "PYTHONPATH": str(tree / "tests" / "device_image"), "COMMIT": "abc1234", "STEPS": "feduv_a0.01",
                 "SCRATCH": str(tmp_path / "scratch"), "FEDLATENT_CACHE_DIR": str(out.parent / f"{out.name}-cache"),
                 "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(["bash", "benchmarks/gpu_lease.sh"], cwd=tree, env=variables, capture_output=True,
                          text=True, timeout=900)


def test_the_lease_names_everything_missing_in_one_line_before_it_starts(tmp_path: Path) -> None:
    tree = _bare_copy(tmp_path / "tree", None)
    done = _lease(tree, tmp_path / "out", tmp_path, DEVICE="cuda", UNPACK="runs/lease-state")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("lease: cannot start: "), done.stderr
    assert "torch sees no CUDA device" in lines[0] and "data/cifar10-jpeg.tar.gz" in lines[0] and "UNPACK" in lines[0]
    assert not any((tmp_path / "out").iterdir())


def test_a_failing_step_still_packs_the_lease(tmp_path: Path) -> None:
    """A corrupt archive fails the full-scale step (the budget leaves the bench no time): the lease
    exits non-zero, and what comes back under ``$OUT`` is the pack and the summary alone."""
    bad = tmp_path / "cifar10-jpeg.tar.gz"
    bad.write_bytes(b"not a gzip stream")
    tree = _bare_copy(tmp_path / "tree", bad)
    out = tmp_path / "out"
    done = _lease(tree, out, tmp_path, BUDGET="150")
    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "the full-scale steps failed" in done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["SUMMARY.txt", "state"]
    assert (out / "state" / "index.json").is_file() and "commit abc1234" in (out / "SUMMARY.txt").read_text()


@pytest.mark.slow
def test_the_dry_run_a_lease_from_a_bare_copy_benches_runs_packs_and_the_next_lease_resumes(tmp_path: Path) -> None:
    """The dry run: two leases as a device machine runs them, the second on a fresh copy of the tree
    from the first's pack alone (what the device tool brought back, carried into the next call)."""
    archive = _archive(tmp_path)
    out = tmp_path / "device-out"
    done = _lease(_bare_copy(tmp_path / "tree", archive), out, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["SUMMARY.txt", "state"]  # the lease folder became its pack
    state = out / "state"
    files = sorted(state.iterdir())
    assert files[-1].name == "state.00" and (state / "index.json").is_file()
    assert len(files) + 1 <= 8 and all(p.stat().st_size <= 16 << 20 for p in files)  # the device tool's limits
    summary = (out / "SUMMARY.txt").read_text()
    assert "commit abc1234" in summary and "| fedlatent (vectorized) | fp32" in summary
    assert "bare loop: top operators by self time on the CPU" in summary  # benchmarks/profile_round.py
    assert "| cifar10-a0.01 | moon-mu1 | 35.70 |" in summary
    tree = _bare_copy(tmp_path / "tree2", archive)
    shutil.copytree(state, tree / "runs" / "lease-state")
    shutil.rmtree(tmp_path / "scratch")  # a fresh machine: the same scratch path (the runs' data.root), empty
    out2 = tmp_path / "device-out2"
    again = _lease(tree, out2, tmp_path, UNPACK="runs/lease-state")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "bench (auto): kept from an earlier lease" in again.stdout and "4 of 4 runs finished already" in again.stdout
    restored = tmp_path / "restored"
    from importlib import util
    spec = util.spec_from_file_location("lease_state", ROOT / "benchmarks" / "lease_state.py")
    assert spec is not None and spec.loader is not None
    lease_state = util.module_from_spec(spec)
    spec.loader.exec_module(lease_state)
    lease_state.unpack(out2 / "state", restored)
    assert (restored / "environment.txt").read_text().count("== lease") == 2 and (restored / "lease.log").is_file()
    assert json.loads((restored / "bench_auto.json").read_text())


def _readme_calls() -> list[tuple[str, list[str]]]:
    """Each device-tool call in benchmarks/README.md: its command and its carry."""
    text = (ROOT / "benchmarks" / "README.md").read_text()
    calls = []
    for match in re.finditer(r"run\(command='([^']*)'(.*?)\)\n", text, flags=re.S):
        carry = re.search(r"carry=\[([^\]]*)\]", match.group(2))
        calls.append((match.group(1), re.findall(r"'([^']*)'", carry.group(1)) if carry else []))
    return calls


def test_every_lease_call_in_the_readme_carries_every_path_its_command_reads() -> None:
    """A device machine receives the tree and what ``carry`` names: the archive the lease reads by
    default (``data/``, ignored) and the folder ``UNPACK`` names must be among them."""
    calls = _readme_calls()
    assert len(calls) >= 2 and any("UNPACK=" in command for command, _ in calls)
    for command, carry in calls:
        assert "benchmarks/gpu_lease.sh" in command
        words = shlex.split(command)
        script = words.index("benchmarks/gpu_lease.sh")
        needed = [w.split("=", 1)[1] for w in words[:script] if w.startswith("UNPACK=")]
        arguments = words[script + 1:]
        needed.append(arguments[1] if len(arguments) > 1 else "data/cifar10-jpeg.tar.gz")
        for path in needed:
            assert any(path == c or path.startswith(c.rstrip("/") + "/") for c in carry), (command, path, carry)
            ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
            assert ignored.returncode == 0, f"{path}: carry takes ignored paths; a tracked one travels anyway"
