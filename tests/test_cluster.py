"""A study on a Ray cluster (``--cluster``, fedlatent.experiment.studies.cluster): bad input refused in
one line before the study folder exists; on a real two-node cluster started on this machine (Ray's
own ``ray.cluster_utils.Cluster``, as Ray's test suite starts one) an 8-cell digits study equals the
``--jobs 1`` study cell for cell, and losing the worker node mid-study costs only its cells' time."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedlatent.cli import main
from fedlatent.experiment.studies.cluster import PLACEMENT, Cluster, newest_checkpoint, parse_resources
from fedlatent.experiment.studies.study import Study, parse_study
from fedlatent.experiment.studies.sweep import run_sweep

from tests.conftest import DIGITS_CONFIG, ROOT

STUDY = ('base = "{base}"\nset = {{"train.rounds" = {rounds}, "model.hidden" = [16], "data.num_clients" = 6, "data.partition" = "dirichlet", '
         '"backend" = "simulation"}}\n[grid]\n"data.alpha" = [0.1, 1.0]\n"train.lr" = [0.05, 0.1]\nseed = [0, 1]\n')
COMPARED = ("run", "status", "accuracy", "loss", "rounds_completed")
SMALL = {"object_store_memory": 80 * 2**20}  # Ray's least; the machine is shared


def _study_file(tmp_path: Path, digits_config: Path, rounds: int = 3) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(STUDY.format(base=digits_config, rounds=rounds))
    return path


@pytest.mark.parametrize("args, needle", [
    (["--cluster", "spark"], "--cluster spark: expected ray"),
    (["--cluster", "ray:127.0.0.1:1"], "--cluster ray:127.0.0.1:1: nothing answers at 127.0.0.1:1"),
    (["--cluster", "ray", "--jobs", "2"], "--jobs 2 with --cluster"),
    (["--cell-resources", "cpus=1"], "--cell-resources belongs to --cluster"),
    (["--cluster", "ray", "--cell-resources", "gpus=half"], "--cell-resources gpus=half: expected"),
])
def test_bad_cluster_input_is_one_line_before_the_study_folder(
        args: list[str], needle: str, tmp_path: Path, digits_config: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(["sweep", str(_study_file(tmp_path, digits_config)), "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fedlatent: error: {needle}") and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_cluster_without_ray_names_the_extra(tmp_path: Path, digits_config: Path, capsys: pytest.CaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    out = tmp_path / "out"
    assert main(["reproduce", "feddecorr_table1", "--quick", "--out", str(out), "--cluster", "ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("pip install 'fedlatent[cluster]'") and len(err.splitlines()) == 1 and not out.exists()


def test_no_gpu_for_cells_on_cuda_is_refused(tmp_path: Path, digits_config: Path, capsys: pytest.CaptureFixture) -> None:
    path = _study_file(tmp_path, digits_config)
    path.write_text(path.read_text().replace('"backend"', '"train.device" = "cuda", "backend"'))
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--cluster", "ray", "--cell-resources", "gpus=0"]) == 2
    assert capsys.readouterr().err.strip() == ("fedlatent: error: --cell-resources gpus=0: cells on 'cuda' would see "
                                               "no GPU; give a share (gpus=0.5)")
    assert not (tmp_path / "out").exists()


def test_cell_resources_parse_memory_units() -> None:
    assert parse_resources("cpus=2, gpus=0.5,memory=1.5GiB") == {"cpus": 2.0, "gpus": 0.5, "memory": 1.5 * 2**30}


@pytest.fixture(scope="module")
def two_nodes():
    """A head node and a worker node of one CPU each, on this machine; their workers import this
    checkout's sources. Yields (the cluster, the worker node)."""
    RayCluster = pytest.importorskip("ray.cluster_utils").Cluster
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *([previous] if previous else [])])
    cluster = RayCluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, **SMALL})
    worker = cluster.add_node(num_cpus=1, **SMALL)
    cluster.wait_for_nodes()
    try:
        yield cluster, worker
    finally:
        import ray
        ray.shutdown()  # a driver a failed test left connected
        cluster.shutdown()
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


def _reference(folder: Path, rounds: int) -> tuple[Path, list[dict]]:
    """The 8-cell study of ``rounds`` rounds and its ``--jobs 1`` rows."""
    path = _study_file(folder, DIGITS_CONFIG, rounds=rounds)
    return path, run_sweep(_load(path), folder / "jobs1", echo=None, figures=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """The 8-cell study of 3 rounds and its ``--jobs 1`` rows."""
    return _reference(tmp_path_factory.mktemp("reference"), 3)


def _load(path: Path) -> Study:
    return parse_study(__import__("tomllib").loads(path.read_text()), path.parent)


def _csv(out: Path) -> list[dict]:
    with (out / "results.csv").open() as f:
        return list(csv.DictReader(f))


def _same(rows: list[dict], reference: list[dict]) -> None:
    as_text = lambda r: tuple(str(r.get(k)) for k in COMPARED)  # noqa: E731
    assert [as_text(r) for r in rows] == [as_text(r) for r in reference]


def _cluster(two_nodes) -> Cluster:
    return Cluster(f"ray:{two_nodes[0].address}", log_to_driver=False)


@pytest.mark.slow
def test_two_node_study_equals_the_jobs_1_study_cell_for_cell(two_nodes, reference, tmp_path: Path) -> None:
    path, expected = reference
    lines: list[str] = []
    run_sweep(_load(path), tmp_path / "ray", echo=lines.append, figures=False, cluster=_cluster(two_nodes))
    _same(_csv(tmp_path / "ray"), expected)
    nodes = {json.loads(line)["node"] for p in (tmp_path / "ray").glob(f"*/{PLACEMENT}") for line in p.read_text().splitlines()}
    assert len(nodes) == 2  # both nodes ran cells
    assert lines[0].startswith(f"Ray cluster {two_nodes[0].address}: 2 node(s), 2 CPUs")
    assert sum(line.startswith("[") for line in lines) == 8


@pytest.mark.slow
@pytest.mark.parametrize("device, given, claim", [("cpu", ["--cell-resources", "cpus=64"], "cpus=64, gpus=0"),
                                                  ("cuda", [], "cpus=1, gpus=1")])
def test_a_refused_resource_request_is_one_line_before_the_study_folder(
        two_nodes, tmp_path: Path, capsys: pytest.CaptureFixture, device: str, given: list[str], claim: str) -> None:
    """More CPUs than a node has; cells on cuda (which this driver, without CUDA, leaves to the nodes
    to check) on a cluster without GPUs."""
    path = _study_file(tmp_path, DIGITS_CONFIG)
    path.write_text(path.read_text().replace('"backend"', f'"train.device" = "{device}", "backend"'))
    out = tmp_path / "out"
    code = main(["sweep", str(path), "--out", str(out), "--cluster", f"ray:{two_nodes[0].address}", *given])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and not out.exists(), err
    assert err.startswith(f"fedlatent: error: --cell-resources {claim}: no node of the cluster has that much"), err


@pytest.mark.slow
def test_a_diverging_cell_is_stopped_once_and_a_rerun_skips_every_cell(two_nodes, tmp_path: Path) -> None:
    """A cell the failure policy stops is reported as under --jobs and not retried (one attempt in its
    placement.jsonl); the study run again skips its cells and starts no task."""
    path = tmp_path / "study.toml"
    path.write_text(f'base = "{DIGITS_CONFIG}"\nset = {{"train.rounds" = 2, "model.hidden" = [16]}}\n'
                    '[grid]\n"train.lr" = [0.05, 1e6]\n')
    out = tmp_path / "ray"
    rows = {r["train.lr"]: r for r in run_sweep(_load(path), out, echo=None, figures=False, cluster=_cluster(two_nodes))}
    assert rows["1e+06"]["status"] == "stopped" and "non-finite" in rows["1e+06"]["error"]
    assert rows["0.05"]["status"] == "ran"
    attempts = {p.parent.name: len(p.read_text().splitlines()) for p in out.glob(f"*/{PLACEMENT}")}
    assert attempts == {rows["0.05"]["run"]: 1, rows["1e+06"]["run"]: 1}
    again = {r["train.lr"]: r["status"] for r in run_sweep(_load(path), out, echo=None, figures=False,
                                                           cluster=_cluster(two_nodes))}
    assert again == {"0.05": "skipped", "1e+06": "stopped"}
    assert {p.parent.name: len(p.read_text().splitlines()) for p in out.glob(f"*/{PLACEMENT}")} == attempts


@pytest.mark.long
def test_a_killed_driver_started_again_resumes_the_study(two_nodes, tmp_path: Path) -> None:
    """``fedlatent sweep --cluster`` killed once a cell has a checkpoint and no summary, then run
    again: finished cells are skipped, the unfinished ones continue from their checkpoints, and the
    study has the numbers of the ``--jobs 1`` study."""
    path, expected = _reference(tmp_path, 40)
    out = tmp_path / "ray"
    cmd = [sys.executable, "-m", "fedlatent.cli", "sweep", str(path), "--out", str(out), "--no-figures",
           "--cluster", f"ray:{two_nodes[0].address}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    caught = None
    while caught is None and proc.poll() is None and time.time() < deadline:
        caught = next((p.parent for p in out.glob(f"*/{PLACEMENT}") if newest_checkpoint(p.parent) > 0
                       and not (p.parent / "summary.json").exists()), None)
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    assert caught is not None, "no cell was caught mid-run"
    finished = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/summary.json")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert all((out / name / "summary.json").stat().st_mtime_ns == t for name, t in finished.items())
    rows = {r["run"]: r for r in _csv(out)}
    assert sorted(rows) == sorted(r["run"] for r in expected)
    for r in expected:
        assert (rows[r["run"]]["accuracy"], rows[r["run"]]["loss"]) == (str(r["accuracy"]), str(r["loss"]))
    attempts = [json.loads(line) for line in (caught / PLACEMENT).read_text().splitlines()]
    assert len(attempts) == 2 and attempts[1]["from_checkpoint_round"] > 0


@pytest.mark.slow  # about a minute: the check of a lost node, kept in CI
def test_losing_the_worker_node_mid_study_reruns_its_cells_from_their_checkpoints(two_nodes, tmp_path: Path) -> None:
    """The worker node is removed while one of its cells trains past a checkpoint: Ray starts that cell
    again on the head node, from the checkpoint, and the study ends with every cell once, the
    numbers of the ``--jobs 1`` study. Cells of 120 rounds, long enough to catch one mid-run past a
    checkpoint (written at most a second apart) on a quiet machine too (40 rounds missed it).
    (Last in the file: the cluster has one node after it.)"""
    cluster, worker = two_nodes
    path, expected = _reference(tmp_path, 120)
    out = tmp_path / "ray"
    done = threading.Event()
    thread = threading.Thread(target=lambda: (run_sweep(_load(path), out, echo=None, figures=False,
                                                        cluster=_cluster(two_nodes)), done.set()), daemon=True)
    thread.start()
    caught = None
    deadline = time.time() + 300
    while caught is None and not done.is_set() and time.time() < deadline:
        for placement in out.glob(f"*/{PLACEMENT}"):
            lines = placement.read_text().splitlines()  # empty while the task writes its line
            cell = placement.parent
            if lines and json.loads(lines[0])["node"] == worker.node_id and newest_checkpoint(cell) > 0 \
                    and not (cell / "summary.json").exists():
                caught = cell
                break
        time.sleep(0.02)
    assert caught is not None, "no cell of the worker node was caught mid-run"
    cluster.remove_node(worker)
    thread.join(timeout=300)
    assert done.is_set()
    rows = _csv(out)
    assert sorted(r["run"] for r in rows) == sorted(r["run"] for r in expected)  # every cell once
    _same(rows, expected)
    attempts = [json.loads(line) for line in (caught / PLACEMENT).read_text().splitlines()]
    assert len(attempts) == 2 and attempts[1]["node"] != worker.node_id and attempts[1]["from_checkpoint_round"] > 0
