"""``benchmarks/lease_state.py``: a lease folder packed into the few files the device tool brings
back (its limits: 8 files, 16 MiB each, 64 MiB in all, two folders down) and unpacked by the next
lease, which then continues its unfinished runs exactly as one uninterrupted run would; a step whose
state does not fit is left out loudly, and a pack missing a chunk is refused."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load, save

import fedlatent
from fedlatent.config import load_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ["train.rounds=4", "model.hidden=[16]", "data.num_clients=4", 'algorithm.name="moon"']
pytestmark = pytest.mark.usefixtures("no_figures")


def _module() -> Any:
    """``benchmarks/lease_state.py``, imported from its file (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("lease_state", ROOT / "benchmarks" / "lease_state.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lines(run: Path) -> list[dict]:
    """The run's metrics lines without what the clock decides."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if "time" not in k and "seconds" not in k} for line in lines]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _first_lease(tmp_path: Path, digits_config: Path, crash_at_round_2) -> Path:
    """A lease folder as a lease leaves it: the step ``moon`` stopped after two of its four rounds
    (MOON keeps a previous model per client), the step ``done`` finished, the lease's own files."""
    lease = tmp_path / "lease1"
    for step in ("moon", "done"):
        (lease / "runs" / step).mkdir(parents=True)
    with pytest.raises(KeyboardInterrupt):
        fedlatent.run(load_config(digits_config, TINY), lease / "runs" / "moon" / "run")
    checkpoints = lease / "runs" / "moon" / "run" / "checkpoints"
    shutil.copytree(checkpoints / "round00002", checkpoints / "round00001")  # an older sealed one, as KEEP = 2 leaves
    from fedlatent.backends import simulation
    simulation.run_round = crash_at_round_2  # the real rounds again (the fixture's monkeypatch restores it too)
    fedlatent.run(load_config(digits_config, [*TINY[:3], "train.rounds=1"]), lease / "runs" / "done" / "run")
    (lease / "environment.txt").write_text("== lease 2026-11-28, commit abc1234\n")
    return lease


def test_a_lease_packed_into_a_few_files_continues_exactly_in_the_next(tmp_path: Path, digits_config: Path,
                                                                      crash_at_round_2) -> None:
    lease_state = _module()
    lease = _first_lease(tmp_path, digits_config, crash_at_round_2)
    assert len(list((lease / "runs" / "moon" / "run" / "checkpoints").glob("round*"))) == 2
    state = tmp_path / "out" / "state"
    assert lease_state.main(["pack", str(lease), str(state), "--steps", "moon", "done"]) == 0
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert 2 <= len(files) <= 8 and all(p.parent == state for p in files)  # one folder down from $OUT
    assert all(p.stat().st_size <= 16 << 20 for p in files) and sum(p.stat().st_size for p in files) <= 64 << 20
    assert json.loads((state / "index.json").read_text())["left_out"] == []

    lease2 = tmp_path / "lease2"
    assert lease_state.main(["unpack", str(state), str(lease2)]) == 0
    before, after = _files(lease), _files(lease2)
    kept = sorted({k.split("/checkpoints/")[1].split("/")[0] for k in after if "/checkpoints/" in k})
    assert kept == ["round00002"]  # the unfinished run's newest checkpoint alone; none of the finished run's
    assert all(before[k] == v for k, v in after.items())  # byte for byte (safetensors shuffled and back)
    assert set(before) - set(after) == {k for k in before if "/checkpoints/" in k and k not in after}
    shutil.rmtree(lease)  # the next lease has the packed files alone

    whole = fedlatent.run(load_config(digits_config, TINY), tmp_path / "whole")
    resumed = fedlatent.run(load_config(digits_config, TINY), lease2 / "runs" / "moon" / "run", resume=True)
    assert resumed["final"] == whole["final"] and resumed["rounds_completed"] == 4
    assert _lines(lease2 / "runs" / "moon" / "run") == _lines(tmp_path / "whole")
    assert (lease2 / "runs" / "done" / "run" / "summary.json").is_file()


def test_a_step_that_does_not_fit_is_left_out_by_name_and_the_others_packed(tmp_path: Path, digits_config: Path,
                                                                            crash_at_round_2, capsys) -> None:
    lease_state = _module()
    lease = _first_lease(tmp_path, digits_config, crash_at_round_2)
    assert lease_state.main(["pack", str(lease), str(tmp_path / "all"), "--steps", "moon", "done"]) == 0
    sizes = json.loads((tmp_path / "all" / "index.json").read_text())["packed"]
    # room for the lease's own files and the finished step, not for the unfinished one's checkpoint
    total = (sizes["(lease)"] + sizes["done"] + lease_state.MARGIN + sizes["moon"] // 2) / (1 << 20)
    capsys.readouterr()
    code = lease_state.main(["pack", str(lease), str(tmp_path / "some"), "--steps", "moon", "done",
                             "--total-mib", str(total)])
    err = capsys.readouterr().err
    assert code == 3 and "step moon LEFT OUT" in err and "does not fit even alone" in err
    index = json.loads((tmp_path / "some" / "index.json").read_text())
    assert index["left_out"] == ["moon"] and list(index["packed"]) == ["(lease)", "done"]


def test_a_pack_missing_a_chunk_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    lease_state = _module()
    lease = tmp_path / "lease"
    (lease / "runs" / "step" / "run").mkdir(parents=True)
    (lease / "runs" / "step" / "run" / "metrics.jsonl").write_bytes(torch.randn(20000).numpy().tobytes())
    assert lease_state.main(["pack", str(lease), str(tmp_path / "state"), "--file-mib", "0.03"]) == 0
    chunks = json.loads((tmp_path / "state" / "index.json").read_text())["chunks"]
    assert len(chunks) > 1
    (tmp_path / "state" / chunks[-1]).unlink()
    capsys.readouterr()
    assert lease_state.main(["unpack", str(tmp_path / "state"), str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and chunks[-1] in err and not (tmp_path / "again").exists()


def test_shuffled_safetensors_come_back_byte_for_byte() -> None:
    lease_state = _module()
    tensors = {"w": torch.randn(7, 3), "h": torch.randn(5, dtype=torch.float64), "b": torch.randn(4).bfloat16(),
               "n": torch.arange(6), "m": torch.tensor([True, False, True]), "e": torch.zeros(0)}
    data = save(tensors, metadata={"round": "2"})
    shuffled = lease_state.shuffle(data)
    assert shuffled != data and len(shuffled) == len(data)
    assert lease_state.shuffle(shuffled, inverse=True) == data
    assert all(torch.equal(load(data)[k], v) for k, v in tensors.items())
