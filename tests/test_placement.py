"""Every CUDA device of one machine in use under ``--jobs N`` (fedlatent.experiment.studies.placement),
checked on a CPU by patching torch's CUDA queries: the sweep places each unit on the device the fewest
running units use, the cell's config.toml records it, and a cell resumed on another device continues."""
from __future__ import annotations

import threading
import tomllib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from fedlatent.config import to_toml
from fedlatent.experiment.runner.folders import check_same_config
from fedlatent.experiment.runner.single import as_started
from fedlatent.experiment.studies import executors, units
from fedlatent.experiment.studies.placement import Shares, as_recorded, placed, settle
from fedlatent.experiment.studies.study import parse_study
from fedlatent.experiment.studies.sweep import run_sweep


def test_shares_give_each_new_unit_the_least_used_device() -> None:
    shares = Shares(2)
    assert [shares.take() for _ in range(4)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    shares.give("cuda:1")
    assert shares.take() == "cuda:1" and shares.use == [2, 2]


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """torch sees two CUDA devices; the --jobs pool is threads and each unit, instead of training,
    writes the config.toml its run would write (a run writes ``to_toml`` of its configuration) or,
    resuming, checks it as the run does (:func:`check_same_config`), and,
    with every worker busy at once, records (cell, device). Returns the records."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(executors, "worker_processes", lambda jobs: ThreadPoolExecutor(jobs))
    records: list[tuple[str, str]] = []
    together = threading.Barrier(4, timeout=30)

    def unit(configs, outs, figures):
        together.wait()  # four workers run at once
        for config, out in zip(configs, outs):
            path = Path(out) / "config.toml"
            if path.is_file():  # a resumed run refuses a configuration other than its config.toml's
                check_same_config(as_started(config, path), path)
            else:
                Path(out).mkdir(parents=True, exist_ok=True)
                path.write_text(to_toml(config))
            records.append((Path(out).name, config.train.device))
        return [""] * len(configs)

    monkeypatch.setattr(units, "run_unit", unit)
    return records


def _study(tmp_path: Path, digits_config: Path):
    return parse_study({"base": str(digits_config), "set": {"train.rounds": 1, "train.device": "cuda",
                                                              "train.precision": "fp32", "backend": "simulation"},
                        "grid": {"seed": [0, 1, 2, 3]}}, tmp_path)


def test_four_jobs_on_two_devices_use_each_twice_as_config_toml_states(
        tmp_path: Path, digits_config: Path, two_gpus: list[tuple[str, str]]) -> None:
    study = _study(tmp_path, digits_config)
    run_sweep(study, tmp_path / "out", jobs=4, echo=None, stack="off")
    assert Counter(device for _, device in two_gpus) == {"cuda:0": 2, "cuda:1": 2}
    for cell, device in two_gpus:
        recorded = tomllib.loads((tmp_path / "out" / cell / "config.toml").read_text())["train"]["device"]
        assert recorded == device


def test_a_cell_started_on_another_device_resumes_on_the_one_it_is_given(
        tmp_path: Path, digits_config: Path, two_gpus: list[tuple[str, str]]) -> None:
    """Every cell recorded on cuda:1 (the study says cuda): the sweep accepts the folders, and the
    two cells given cuda:0 have their config.toml moved to it, nothing else changed."""
    study = _study(tmp_path, digits_config)
    out = tmp_path / "out"
    for cell in study.cells:
        (out / cell.name).mkdir(parents=True)
        (out / cell.name / "config.toml").write_text(to_toml(placed(cell.config, "cuda:1")))
    run_sweep(study, out, jobs=4, echo=None, stack="off")
    for cell in study.cells:
        text = (out / cell.name / "config.toml").read_text()
        device = dict(two_gpus)[cell.name]
        assert text == to_toml(placed(cell.config, device))


def test_settle_moves_only_the_device_and_leaves_other_differences_to_the_run(
        tmp_path: Path, digits_config: Path) -> None:
    config = _study(tmp_path, digits_config).cells[0].config
    path = tmp_path / "config.toml"
    path.write_text(to_toml(placed(config, "cuda:1")))
    assert as_recorded(config, path) == placed(config, "cuda:1")
    settle(placed(config, "cuda:0"), tmp_path)
    assert path.read_text() == to_toml(placed(config, "cuda:0"))
    other = to_toml(placed(config, "cuda:1")).replace("rounds = 1", "rounds = 2")
    path.write_text(other)
    settle(placed(config, "cuda:0"), tmp_path)
    assert path.read_text() == other  # the run's own check names train.rounds
