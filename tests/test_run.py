"""End-to-end runs on digits: accuracy, determinism, crash + resume, the run directory."""
from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import fedlatent
from fedlatent import load_config
from fedlatent.backends import simulation
from fedlatent.config import to_toml
from fedlatent.errors import ConfigError
from fedlatent.federated import state
from fedlatent.federated.state import verify

pytestmark = pytest.mark.slow

DIGITS_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"
SHORT = ["train.rounds=4", "train.participation=0.5", "server.optimizer=momentum"]


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in rows]


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    folder = json.loads((out / "checkpoints" / "latest.json").read_text())["folder"]
    return load_file(str(out / "checkpoints" / folder / "global.safetensors"))


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> tuple[dict, Path]:
    """configs/digits_fedavg.toml as shipped: 10 IID clients, 20 rounds."""
    out = tmp_path_factory.mktemp("full") / "run"
    with pytest.MonkeyPatch.context() as mp:  # every round written (runs pace them): the last two are kept
        mp.setattr(state, "CHECKPOINT_SECONDS", 0.0)
        return fedlatent.run(load_config(DIGITS_CONFIG), out), out


@pytest.fixture(scope="module")
def short_run(tmp_path_factory) -> tuple[dict, Path]:
    """4 rounds, half the clients per round, server momentum (so there is server state to resume)."""
    out = tmp_path_factory.mktemp("short") / "run"
    return fedlatent.run(load_config(DIGITS_CONFIG, SHORT), out), out


def test_digits_fedavg_reaches_90_percent(full_run) -> None:
    summary, out = full_run
    assert summary["rounds_completed"] == 20
    assert summary["final"]["accuracy"] >= 0.9
    assert summary["final"]["balanced_accuracy"] >= 0.9
    rows = _metrics(out)
    assert [r["round"] for r in rows] == list(range(1, 21))
    # it learned: accuracy after the last round well above the first, loss went down
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"]
    assert rows[-1]["train_loss"] < 0.5 * rows[0]["train_loss"]
    # the summary's final accuracy is the last round's test accuracy (not the best over rounds)
    assert summary["final"]["accuracy"] == rows[-1]["test_accuracy"]


def test_summary_and_run_directory(full_run) -> None:
    summary, out = full_run
    for name in ("config.toml", "metrics.jsonl", "summary.json", "checkpoints", "plots/partition.png"):
        assert (out / name).exists(), name
    for figure in ("partition.png", "curves.png"):  # drawn by the figure process, on disk on return
        assert (out / "plots" / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    final = on_disk["final"]
    assert 0.0 <= final["accuracy"] <= 1.0 and 0.0 <= final["balanced_accuracy"] <= 1.0
    assert on_disk["rounds_completed"] == 20
    assert on_disk["seed"] == 0
    assert on_disk["wall_seconds"] > 0
    assert on_disk["fedlatent_version"] == fedlatent.__version__
    assert on_disk["machine"].endswith(f", {os.cpu_count()} cores")  # what the run trained on
    # config.toml is the fully resolved configuration and loads back to the same config
    # ... with backend = "auto" resolved to the backend the run trained on (the MLP: vectorized)
    assert on_disk["backend"] == "vectorized" and load_config(DIGITS_CONFIG).backend == "auto"
    # ... and train.precision = "auto" to what it is on the CPU, fp32
    given = load_config(DIGITS_CONFIG)
    assert given.train.precision == "auto"
    started = dataclasses.replace(given, backend="vectorized", train=dataclasses.replace(given.train, precision="fp32"))
    assert load_config(out / "config.toml") == started
    assert (out / "config.toml").read_text() == to_toml(started)
    assert "lr_schedule" in tomllib.loads((out / "config.toml").read_text())["train"]
    # checkpoint: safetensors weights + JSON state of the last round
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())["folder"]
    assert json.loads((out / "checkpoints" / latest / "state.json").read_text())["round"] == 20
    weights = _final_weights(out)
    assert weights and all(isinstance(v, torch.Tensor) for v in weights.values())
    # the last two rounds are kept, each sealed by a manifest of checksums
    assert sorted(p.name for p in (out / "checkpoints").glob("round*")) == ["round00019", "round00020"]
    assert all(verify(p) is None for p in (out / "checkpoints").glob("round*"))


def test_same_config_and_seed_give_identical_metrics(short_run, tmp_path: Path) -> None:
    summary, out = short_run
    again = fedlatent.run(load_config(DIGITS_CONFIG, SHORT), tmp_path / "again")
    assert _untimed(_metrics(tmp_path / "again")) == _untimed(_metrics(out))
    assert again["final"] == summary["final"]
    a, b = _final_weights(out), _final_weights(tmp_path / "again")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # partial participation really sampled different clients over the rounds
    assert len({tuple(r["clients"]) for r in _metrics(out)}) > 1
    assert all(len(r["clients"]) == 5 for r in _metrics(out))


def test_another_seed_gives_other_numbers(short_run, tmp_path: Path) -> None:
    _, out = short_run
    fedlatent.run(load_config(DIGITS_CONFIG, SHORT + ["seed=1", "train.rounds=1"]), tmp_path / "other")
    assert _metrics(tmp_path / "other")[0]["train_loss"] != _metrics(out)[0]["train_loss"]


def test_resume_after_a_crash_reproduces_the_uninterrupted_run(short_run, tmp_path: Path, crash_at_round_2,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    summary, reference = short_run
    config = load_config(DIGITS_CONFIG, SHORT)
    out = tmp_path / "crashed"
    real_round = crash_at_round_2
    with pytest.raises(KeyboardInterrupt):
        fedlatent.run(config, out)
    monkeypatch.undo()
    assert [r["round"] for r in _metrics(out)] == [1, 2]
    assert not (out / "summary.json").exists()
    # without --resume the directory is refused; with it the run continues from round 2
    with pytest.raises(ConfigError, match="resume=True"):
        fedlatent.run(config, out)
    rounds_run = []

    def counting(s, rnd):
        rounds_run.append(rnd)
        return real_round(s, rnd)

    monkeypatch.setattr(simulation, "run_round", counting)
    resumed = fedlatent.run(load_config(DIGITS_CONFIG, SHORT), out, resume=True)
    assert rounds_run == [2, 3]                                          # continued, not restarted
    assert resumed["final"] == summary["final"]
    assert resumed["rounds_completed"] == 4
    # the training seconds hold the rounds before the crash too; the total holds both segments
    assert resumed["train_seconds"] == sum(r["time_round_s"] for r in _metrics(out))
    assert resumed["setup_seconds"] + resumed["train_seconds"] <= resumed["wall_seconds"]
    assert _untimed(_metrics(out)) == _untimed(_metrics(reference))
    a, b = _final_weights(out), _final_weights(reference)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    server_a = load_file(str(next((out / "checkpoints").glob("round*")) / "server.safetensors"))
    assert any(k.startswith("server_opt.") for k in server_a)            # momentum state was resumed


def test_wall_time_is_split_into_set_up_and_training(short_run, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """summary.json splits ``wall_seconds`` (the total) into ``setup_seconds`` (data, model, the
    process's one-off start) and ``train_seconds`` (the rounds' own ``time_round_s``), and tells
    whether the run was its process's first (whose set-up holds the process's warm-up)."""
    import itertools

    from fedlatent.experiment.runner import single
    monkeypatch.setattr(single, "_RUNS_IN_PROCESS", itertools.count())  # as in a fresh process
    config = load_config(DIGITS_CONFIG, ["train.rounds=2"])
    first = fedlatent.run(config, tmp_path / "first")
    second = fedlatent.run(config, tmp_path / "second")
    assert (first["first_in_process"], second["first_in_process"]) == (True, False)
    for summary, out in ((first, tmp_path / "first"), (second, tmp_path / "second")):
        assert summary["train_seconds"] == sum(r["time_round_s"] for r in _metrics(out)) > 0
        assert 0 < summary["setup_seconds"]
        assert summary["setup_seconds"] + summary["train_seconds"] <= summary["wall_seconds"]
        assert json.loads((out / "summary.json").read_text())["setup_seconds"] == summary["setup_seconds"]


def test_resume_with_a_different_config_is_refused(short_run, tmp_path: Path) -> None:
    out = tmp_path / "run"
    fedlatent.run(load_config(DIGITS_CONFIG, ["train.rounds=1"]), out)
    with pytest.raises(ConfigError, match="configuration differs"):
        fedlatent.run(load_config(DIGITS_CONFIG, ["train.rounds=1", "train.lr=0.1"]), out, resume=True)
    with pytest.raises(ConfigError, match="^out .*pass resume=True"):  # Python's terms: fedlatent.run's arguments
        fedlatent.run(load_config(DIGITS_CONFIG, ["train.rounds=1"]), out)


def test_resume_of_a_finished_run_changes_nothing(short_run, tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = load_config(DIGITS_CONFIG, ["train.rounds=2"])
    first = fedlatent.run(config, out)
    before = _metrics(out)
    again = fedlatent.run(config, out, resume=True)
    assert again["final"] == first["final"]
    assert _metrics(out) == before
