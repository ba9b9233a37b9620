"""Experiment tracking ([tracking]): what each tracker's own reader reads back of a digits run, the
configuration and sweep tags, resume and stopped runs, and the trackers that cannot start."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from fedlatent import load_config
from fedlatent.cli import main
from fedlatent.config import describe, from_dict, to_toml
from fedlatent.errors import ConfigError
from fedlatent.experiment import run
from fedlatent.experiment.runner import tracking
from fedlatent.experiment.studies.study import load_study
from fedlatent.experiment.studies.sweep import run_sweep

pytestmark = pytest.mark.usefixtures("no_figures")

ROOT = Path(__file__).resolve().parents[1]
DIGITS_CONFIG = ROOT / "configs" / "digits_fedavg.toml"
SMALL = ["train.rounds=3", "model.hidden=[16]"]


def _config(*overrides: str):
    return load_config(DIGITS_CONFIG, [*SMALL, *overrides])


def _mlflow(tmp_path: Path) -> list[str]:
    """Overrides sending a run to an MLflow SQLite store under ``tmp_path`` (an absolute sqlite:////... URI)."""
    return ['tracking.backends=["mlflow"]', f'tracking.mlflow_uri="sqlite:///{tmp_path}/mlflow.db"']


def _accuracy(out: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {line["round"]: line["test_accuracy"] for line in lines}


def _ids(out: Path) -> dict[str, str]:
    return json.loads((out / tracking.STATE).read_text())["ids"]


def _client(tmp_path: Path):
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")


# --- configuration -------------------------------------------------------------------------------

def test_tracking_section_round_trips_through_toml_and_is_described() -> None:
    config = _config('tracking.backends=["mlflow", "tensorboard"]', 'tracking.tags={study = "s", "a b" = "x\\"y"}',
                     'tracking.wandb_mode="online"', 'tracking.tensorboard_dir="tb"', "tracking.artifacts=false")
    text = to_toml(config)
    assert from_dict(tomllib.loads(text)) == config
    assert config.tracking.tags == {"study": "s", "a b": 'x"y'}
    listed = describe().split("\n[tracking]")[1]
    for key in ("backends", "experiment", "tags", "mlflow_uri", "wandb_mode", "tensorboard_dir", "artifacts"):
        assert f"\n{key} = " in listed


@pytest.mark.parametrize("override, needle", [
    ('tracking.backends=["tensorbord"]',
     "'tensorbord' is not a tracker; allowed values are tensorboard, mlflow, wandb"),
    ('tracking.backends=["mlflow", "mlflow"]', "names a tracker twice"),
    ("tracking.tags={a = 1}", "tracking.tags.a = 1: expected a string"),
    ('tracking.wandb_mode="cloud"', "allowed values are offline, online"),
    ("tracking.backend=[]", "unknown key tracking.backend"),
])
def test_bad_tracking_keys_are_one_line(override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        _config(override)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_metrics_of_takes_every_number_of_a_line() -> None:
    line = {"round": 2, "lr": 0.05, "clients": [0, 1], "train_loss": None, "test_accuracy": 0.5, "flag": True,
            "bytes_up": 10, "diag": {"rank": 3, "name": "x"}}
    assert tracking.metrics_of(line) == {"lr": 0.05, "test_accuracy": 0.5, "bytes_up": 10.0, "diag/rank": 3.0}


# --- nothing without [tracking] -------------------------------------------------------------------

@pytest.mark.slow  # processes of their own
def test_a_run_without_tracking_imports_no_tracker_and_writes_no_state(tmp_path: Path) -> None:
    assert tracking.trackers(_config()) == []
    code = ("import sys, fedlatent, fedlatent.experiment\n"
            f"config = fedlatent.load_config({str(DIGITS_CONFIG)!r}, ['train.rounds=1'])\n"
            f"fedlatent.experiment.run(config, {str(tmp_path / 'run')!r}, figures=False, echo=None)\n"
            "print([m for m in ('mlflow', 'wandb', 'tensorboard', 'torch.utils.tensorboard') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert not (tmp_path / "run" / tracking.STATE).exists() and not (tmp_path / "runs").exists()


# --- trackers that cannot start: one line, before the run directory ---------------------------------

def _refused(config, out: Path) -> str:
    with pytest.raises(ConfigError) as info:
        run(config, out, echo=None)
    assert not out.exists()
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("backend, module", [("mlflow", "mlflow"), ("wandb", "wandb"), ("tensorboard", "tensorboard")])
def test_a_tracker_whose_package_is_missing_is_refused(backend: str, module: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    message = _refused(_config(f'tracking.backends=["{backend}"]'), tmp_path / "run")
    assert message.startswith(f"tracking.backends: '{backend}' cannot start") and f"fedlatent[{backend}]" in message


def test_an_unwritable_store_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    message = _refused(_config('tracking.backends=["mlflow"]',
                               f'tracking.mlflow_uri="sqlite:///{tmp_path}/a_file/mlflow.db"'), tmp_path / "run")
    assert "a_file is a file, not a folder" in message
    message = _refused(_config('tracking.backends=["mlflow"]', f'tracking.mlflow_uri="file:{tmp_path}/a_file/store"'),
                       tmp_path / "run")
    assert "tracking.mlflow_uri" in message and "a_file is a file" in message
    message = _refused(_config('tracking.backends=["tensorboard"]', f'tracking.tensorboard_dir="{tmp_path}/a_file/tb"'),
                       tmp_path / "run")
    assert message.startswith("tracking.tensorboard_dir")
    message = _refused(_config('tracking.backends=["mlflow"]', 'tracking.mlflow_uri="sqlite://"'), tmp_path / "run")
    assert "sqlite:///FILE" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_a_read_only_store_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ro").mkdir(mode=0o500)
    message = _refused(_config('tracking.backends=["mlflow"]', f'tracking.mlflow_uri="sqlite:///{tmp_path}/ro/m.db"'),
                       tmp_path / "run")
    assert "cannot write in" in message


def test_a_tracker_failing_at_start_is_one_line_and_leaves_no_run_directory(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self, config, run_dir):
        raise RuntimeError("store is locked\nsecond line")

    monkeypatch.setattr(tracking.MlflowTracker, "start", broken)
    message = _refused(_config(*_mlflow(tmp_path)), tmp_path / "run")
    assert message == "tracking.backends: 'mlflow' cannot start: store is locked"


def test_fedlatent_check_runs_the_same_tracker_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "c.toml"
    path.write_text(DIGITS_CONFIG.read_text() + '\n[tracking]\nbackends = ["mlflow"]\n')
    monkeypatch.setitem(sys.modules, "mlflow", None)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedlatent: error: tracking.backends: 'mlflow' cannot start")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


# --- what each tracker's own reader reads back -------------------------------------------------------

def test_tensorboard_event_files_hold_each_round_s_accuracy(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out = tmp_path / "run"
    run(_config('tracking.backends=["tensorboard"]'), out, echo=None)
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    read = {e.step: e.value for e in events.Scalars("test_accuracy")}
    assert read == pytest.approx(_accuracy(out), rel=1e-6)  # float32 in the event files
    assert [e.value for e in events.Scalars("final/accuracy")] == pytest.approx([_accuracy(out)[3]], rel=1e-6)
    assert {"config/text_summary", "status/text_summary"} <= set(events.Tags()["tensors"])
    config_text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "    [tracking]" in config_text and 'backends = ["tensorboard"]' in config_text


def test_mlflow_holds_metrics_parameters_tags_summary_and_files(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    out = tmp_path / "run"
    run(_config(*_mlflow(tmp_path), 'tracking.tags={team = "a"}', 'terms=[{name = "decorrelation", beta = 0.1}]'),
                  out, echo=None)
    client, run_id = _client(tmp_path), _ids(out)["mlflow"]
    history = client.get_metric_history(run_id, "test_accuracy")
    assert {m.step: m.value for m in history} == _accuracy(out) and len(history) == 3
    found = client.get_run(run_id)
    assert found.info.status == "FINISHED" and found.info.run_name == "run"
    params = found.data.params
    assert params["train.rounds"] == "3" and params["model.hidden"] == "[16]" and params["data.dataset"] == "digits"
    assert params["algorithm.name"] == "fedavg" and params["terms.0.beta"] == "0.1"  # resolved method keys too
    assert params["tracking.backends"] == '["mlflow"]'
    assert found.data.tags["team"] == "a" and found.data.tags["status"] == "completed"
    summary = json.loads((out / "summary.json").read_text())
    assert found.data.metrics["final/accuracy"] == summary["final"]["accuracy"]
    files = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.toml", "metrics.jsonl", "summary.json", "partition.txt"} <= files
    assert not files & {"checkpoints", "tracking.json"}


def _wandb_records(path: Path) -> list:
    """The records of an offline W&B run file: a LevelDB-style log (7-byte file header, 32 KiB blocks of
    chunks each with a 7-byte header: CRC, length, type FULL/FIRST/MIDDLE/LAST) of protobuf Records."""
    from wandb.proto import wandb_internal_pb2
    data, block, pos, chunk, records = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or kind == 0:  # block trailer / padding
            pos += left
            continue
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def test_wandb_offline_run_holds_each_round_s_accuracy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": tmp_path / "wandb",
                        "WANDB_CACHE_DIR": tmp_path / "wc", "WANDB_CONFIG_DIR": tmp_path / "wcfg",
                        "WANDB_DATA_DIR": tmp_path / "wdata"}.items():
        monkeypatch.setenv(name, str(value))
    (tmp_path / "wandb").mkdir()
    out = tmp_path / "run"
    run(_config('tracking.backends=["wandb"]', 'tracking.tags={team = "a"}'), out, echo=None)
    import wandb
    wandb.teardown()  # the W&B service writes the run file after finish returns; at the latest when it stops
    files = list((tmp_path / "wandb").glob(f"wandb/offline-run-*-{_ids(out)['wandb']}/run-*.wandb"))
    assert len(files) == 1
    records = _wandb_records(files[0])
    kinds = [r.WhichOneof("record_type") for r in records]
    history = {r.history.step.num: {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"}
    assert {step: values["test_accuracy"] for step, values in history.items()} == _accuracy(out), kinds
    found = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    config = {u.key: json.loads(u.value_json) for u in found.config.update}
    assert found.project == "fedlatent" and list(found.tags) == ["team=a"]
    assert config["train.rounds"] == 3 and config["model.hidden"] == [16] and config["algorithm.name"] == "fedavg"
    summary = {(u.key or "/".join(u.nested_key)): json.loads(u.value_json)
               for r in records if r.WhichOneof("record_type") == "summary" for u in r.summary.update}
    assert summary["final/accuracy"] == json.loads((out / "summary.json").read_text())["final"]["accuracy"]
    artifact = next(r.artifact for r in records if r.WhichOneof("record_type") == "artifact")
    assert {"metrics.jsonl", "summary.json", "config.toml"} <= {c.path for c in artifact.manifest.contents}
    assert kinds[-1] == "exit" and records[-1].exit.exit_code == 0


# --- sweeps, resume, stopped and failed runs --------------------------------------------------------

def test_sweep_tags_each_run_with_the_study_and_its_labels(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    study = tmp_path / "study.toml"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    study.write_text(f'''
title = "tags"
base = "{DIGITS_CONFIG}"
set = {{"train.rounds" = 1, "model.hidden" = [16], "tracking.backends" = ["mlflow"], "tracking.mlflow_uri" = "{uri}"}}
[variants.method]
fedavg = {{algorithm = {{name = "fedavg"}}}}
prox = {{algorithm = {{name = "fedprox", mu = 0.1}}}}
''')
    out = tmp_path / "my-study"
    run_sweep(load_study(study), out, echo=None, figures=False)
    client = _client(tmp_path)
    for cell in json.loads((out / "sweep.json").read_text())["runs"]:
        tags = client.get_run(_ids(out / cell["run"])["mlflow"]).data.tags
        assert tags["study"] == "my-study" and tags["method"] == cell["labels"]["method"]
    assert run_sweep(load_study(study), out, echo=None, figures=False)[0]["status"] == "skipped"  # same configs


OPEN_STORE = """
import sys, time
from pathlib import Path
import mlflow, fedlatent
from fedlatent.experiment.runner import tracking
tmp, name = Path(sys.argv[1]), sys.argv[2]
uri = f"sqlite:///{tmp}/mlflow.db"
config = fedlatent.load_config(None, ['tracking.backends=["mlflow"]', f'tracking.mlflow_uri="{uri}"'])
(tmp / f"ready-{name}").touch()
while not (tmp / "go").exists():
    time.sleep(0.005)
tracker = tracking.MlflowTracker()
tracker.start(config, tmp / name)
print(tracker.run_id)
"""


@pytest.mark.slow  # processes of their own
def test_runs_opening_a_new_sqlite_store_at_once_do_not_break_it(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_STORE, str(tmp_path), name], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for name in ("a", "b")]
    while not all((tmp_path / f"ready-{name}").exists() for name in ("a", "b")):
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)  # not a busy loop: on two cores it would take a core from the processes' imports
    (tmp_path / "go").touch()  # both create and migrate the tables now, unless one waits for the other
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    client = _client(tmp_path)
    assert {client.get_run(out.strip()).info.run_name for out, _ in outputs} == {"a", "b"}


def test_resume_after_a_crash_logs_each_round_once_to_the_same_runs(tmp_path: Path, crash_at_round_2,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    config = _config(*_mlflow(tmp_path), 'tracking.backends=["mlflow", "tensorboard"]', "train.rounds=4")
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run(config, out, echo=None)
    client, run_id = _client(tmp_path), _ids(out)["mlflow"]
    assert client.get_run(run_id).info.status == "KILLED"
    monkeypatch.undo()
    run(config, out, resume=True, echo=None)
    assert _ids(out)["mlflow"] == run_id
    history = client.get_metric_history(run_id, "test_accuracy")
    assert sorted(m.step for m in history) == [1, 2, 3, 4] and {m.step: m.value for m in history} == _accuracy(out)
    assert client.get_run(run_id).info.status == "FINISHED"
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("test_accuracy")] == [1, 2, 3, 4]


class _Recorder:
    def __init__(self) -> None:
        self.run_id, self.rounds, self.finished = "r", [], []

    def start(self, config, run_dir) -> None:
        pass

    def log_round(self, line) -> None:
        self.rounds.append(line["round"])

    def finish(self, summary, run_dir, status) -> None:
        self.finished.append((summary, status))


def test_a_resumed_session_skips_the_rounds_logged_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = _Recorder()
    monkeypatch.setattr(tracking, "trackers", lambda config, ids, logged: [recorder])
    (tmp_path / tracking.STATE).write_text(json.dumps({"ids": {"mlflow": "r"}, "logged_round": 2}))
    with tracking.session(_config(*_mlflow(tmp_path)), tmp_path, resume=True) as session:
        for rnd in (2, 3, 4):
            session.log_round({"round": rnd, "test_accuracy": 0.5})
    assert recorder.rounds == [3, 4] and recorder.finished == [(None, "completed")]
    assert json.loads((tmp_path / tracking.STATE).read_text()) == {"ids": {"mlflow": "r"}, "logged_round": 4}


class _Failing(_Recorder):
    def log_round(self, line) -> None:
        if line["round"] == 2:
            raise OSError("server gone\ndetails")
        super().log_round(line)

    def finish(self, summary, run_dir, status) -> None:
        super().finish(summary, run_dir, status)
        raise OSError("still gone")


def test_a_tracker_failing_during_the_run_is_dropped_with_a_warning_and_the_run_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    failing, recorder = _Failing(), _Recorder()
    monkeypatch.setattr(tracking, "trackers", lambda config, ids, logged: [failing, recorder])
    with tracking.session(_config('tracking.backends=["mlflow", "tensorboard"]'), tmp_path) as session:
        for rnd in (1, 2, 3):
            session.log_round({"round": rnd})
    assert failing.rounds == [1] and failing.finished == [(None, "failed")]
    assert recorder.rounds == [1, 2, 3] and recorder.finished == [(None, "completed")]
    assert capsys.readouterr().err.splitlines() == [
        "fedlatent: warning: tracker 'mlflow' failed at round 2 (server gone); it records no more of this run",
        "fedlatent: warning: tracker 'mlflow' could not finish (still gone)"]


def test_stopped_and_failed_runs_close_their_runs_as_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    from fedlatent.backends import simulation
    from fedlatent.errors import RunStopped
    client = _client(tmp_path)
    stopped = tmp_path / "stopped"
    with pytest.raises(RunStopped):
        run(_config(*_mlflow(tmp_path), "train.lr=1e6", 'backend="simulation"'), stopped, echo=None)
    found = client.get_run(_ids(stopped)["mlflow"])
    assert found.info.status == "FAILED" and found.data.tags["status"] == "stopped"
    assert found.data.tags["stop_reason"] == json.loads((stopped / "summary.json").read_text())["stop_reason"]

    real_round = simulation.run_round

    def failing(s, rnd):
        if rnd == 1:
            raise RuntimeError("a bug")
        return real_round(s, rnd)

    monkeypatch.setattr(simulation, "run_round", failing)
    failed = tmp_path / "failed"
    with pytest.raises(RuntimeError, match="a bug"):
        run(_config(*_mlflow(tmp_path), 'backend="simulation"'), failed, echo=None)
    found = client.get_run(_ids(failed)["mlflow"])
    assert found.info.status == "FAILED" and found.data.tags["status"] == "failed"
    assert [m.step for m in client.get_metric_history(found.info.run_id, "test_accuracy")] == [1]
