"""Experiment trackers (``[tracking]``): each run's rounds, resolved configuration, summary and files
sent to TensorBoard, MLflow and W&B, behind one small interface (:class:`Tracker`).

A run without ``tracking.backends`` imports none of their packages. :func:`check` refuses a tracker
that cannot start (its package missing, its store not writable) before the run directory exists;
a tracker that fails to start all the same is one :class:`~fedlatent.errors.ConfigError` too. One that
fails later (a tracking server gone) is told in one warning line and dropped: the training goes on.
:class:`Session` records in ``<run dir>/tracking.json`` the trackers' run ids and the last round
they logged, so that ``--resume`` continues the same runs without logging a round twice.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import re
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Iterator, Protocol
from urllib.parse import urlparse

from fedlatent.config import RunConfig, show_value, to_toml
from fedlatent.errors import ConfigError, RunStopped
from fedlatent.experiment.runner.writable import check_folder
from fedlatent.federated.state import write_atomically
from fedlatent.methods import flat_settings

__all__ = ["Session", "Tracker", "check", "metrics_of", "session", "trackers"]

STATE = "tracking.json"  # in the run directory: run ids and the last round logged
# the modules each tracker needs, and the extra that installs them
MODULES = {"tensorboard": ("tensorboard", "torch.utils.tensorboard"), "mlflow": ("mlflow",), "wandb": ("wandb",)}
# what a run's files sent as artifacts leave out: the checkpoints (large; for --resume only) and the
# trackers' own records
NOT_ARTIFACTS = ("checkpoints", "tensorboard", "wandb", STATE)


class Tracker(Protocol):
    """One tracker of one run; ``run_id`` (None before :meth:`start` unless resumed) names its run."""

    run_id: str | None

    def start(self, config: RunConfig, run_dir: Path) -> None:
        """Open (or, with ``run_id`` set, reopen) the run and record the configuration."""

    def log_round(self, line: dict[str, Any]) -> None:
        """Record a ``metrics.jsonl`` line's numbers at step ``line["round"]``."""

    def finish(self, summary: dict[str, Any] | None, run_dir: Path, status: str) -> None:
        """Record the summary (None when the run ended without one) and the run's files; close the run
        as ``status`` ("completed", "stopped", "interrupted" or "failed")."""


def metrics_of(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a record, nested tables' as ``outer/inner`` (lists, strings, flags and the step
    ``round`` left out)."""
    found: dict[str, float] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            found.update(metrics_of(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and (prefix or key != "round"):
            found[f"{prefix}{key}"] = float(value)
    return found


def summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The summary's numbers sent at the end: the final evaluation as ``final/...``, the rounds done
    and the wall time."""
    return metrics_of({"final": summary.get("final", {}), "rounds_completed": summary["rounds_completed"],
                       "wall_seconds": summary["wall_seconds"]})


def parameters(config: RunConfig) -> dict[str, Any]:
    """The resolved configuration, one ``section.key`` → value each (``fedlatent check``'s lines)."""
    return flat_settings(config)


def artifact_files(run_dir: Path) -> list[Path]:
    """The run's files sent as artifacts, relative to ``run_dir`` (not :data:`NOT_ARTIFACTS`)."""
    return sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")
                  if p.is_file() and p.relative_to(run_dir).parts[0] not in NOT_ARTIFACTS)


def tensorboard_dir(config: RunConfig, run_dir: Path) -> Path:
    """Where the run's event files go: ``<run dir>/tensorboard``, else ``<tensorboard_dir>/<run dir name>``."""
    given = config.tracking.tensorboard_dir
    return Path(given) / run_dir.name if given else run_dir / "tensorboard"


class TensorBoardTracker:
    """Scalars per round, the final ones at the last step, the resolved configuration and tags as text."""

    def __init__(self, run_id: str | None = None, logged_round: int = 0) -> None:
        self.run_id, self.logged_round = run_id, logged_round

    def start(self, config: RunConfig, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter
        log_dir = tensorboard_dir(config, run_dir)
        resumed = self.run_id is not None  # drop what a killed session wrote after its last round logged
        self.writer = SummaryWriter(str(log_dir), purge_step=self.logged_round + 1 if resumed else None)
        self.run_id = str(log_dir)
        if not resumed:
            self.writer.add_text("config", _code(to_toml(config)))
            if config.tracking.tags:
                self.writer.add_text("tags", "\n".join(f"- {k}: {v}" for k, v in config.tracking.tags.items()))

    def log_round(self, line: dict[str, Any]) -> None:
        for key, value in metrics_of(line).items():
            self.writer.add_scalar(key, value, line["round"])
        self.writer.flush()

    def finish(self, summary: dict[str, Any] | None, run_dir: Path, status: str) -> None:
        if summary is not None:
            for key, value in summary_metrics(summary).items():
                self.writer.add_scalar(key, value, summary["rounds_completed"])
        reason = (summary or {}).get("stop_reason")
        self.writer.add_text("status", status + (f": {reason}" if reason else ""))
        self.writer.close()


def _code(text: str) -> str:
    """``text`` as a Markdown code block (TensorBoard renders its text summaries as Markdown)."""
    return "\n".join("    " + line for line in text.splitlines())


class MlflowTracker:
    """A run in ``tracking.experiment`` of the store ``tracking.mlflow_uri``: the resolved configuration as
    parameters, the tags, metrics per round (step = round), the summary's numbers, the files as artifacts."""

    STATUS = {"completed": "FINISHED", "interrupted": "KILLED"}  # else FAILED

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id

    def start(self, config: RunConfig, run_dir: Path) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        t = config.tracking
        self.artifacts = t.artifacts
        db = _sqlite_file(t.mlflow_uri)
        with _only_opener(db):
            self.client = MlflowClient(tracking_uri=t.mlflow_uri)
            if self.run_id is not None:
                self.client.update_run(self.run_id, status="RUNNING")
                return
            artifacts = (db.parent / "mlartifacts").resolve().as_uri() if db is not None else None
            run = self.client.create_run(self._experiment(t.experiment, artifacts), run_name=run_dir.name,
                                         tags={**t.tags, "fedlatent.run_dir": str(run_dir.resolve())})
        self.run_id = run.info.run_id
        params = [Param(_mlflow_key(k), show_value(v)) for k, v in parameters(config).items()]
        self.client.log_batch(self.run_id, params=params)

    def _experiment(self, name: str, artifact_location: str | None) -> str:
        """The experiment's id, created on first use (by another run at the same time: its)."""
        from mlflow.exceptions import MlflowException
        found = self.client.get_experiment_by_name(name)
        if found is None:
            try:
                return self.client.create_experiment(name, artifact_location=artifact_location)
            except MlflowException:
                found = self.client.get_experiment_by_name(name)
                if found is None:
                    raise
        if found.lifecycle_stage != "active":
            raise ConfigError(f"tracking.experiment = {name!r}: deleted in the MLflow store; restore it "
                              f"(mlflow experiments restore) or choose another name")
        return found.experiment_id

    def _metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(_mlflow_key(k), v, now, step) for k, v in values.items()])

    def log_round(self, line: dict[str, Any]) -> None:
        self._metrics(metrics_of(line), line["round"])

    def finish(self, summary: dict[str, Any] | None, run_dir: Path, status: str) -> None:
        if summary is not None:
            self._metrics(summary_metrics(summary), summary["rounds_completed"])
            if summary.get("stop_reason"):
                self.client.set_tag(self.run_id, "stop_reason", summary["stop_reason"])
        self.client.set_tag(self.run_id, "status", status)
        if self.artifacts:
            for path in artifact_files(run_dir):
                folder = path.parent.as_posix()
                self.client.log_artifact(self.run_id, str(run_dir / path), None if folder == "." else folder)
        self.client.set_terminated(self.run_id, self.STATUS.get(status, "FAILED"))


@contextlib.contextmanager
def _only_opener(db: Path | None) -> Iterator[None]:
    """Hold ``<db>.lock`` while this process opens the SQLite store ``db`` (None: no lock): MLflow creates
    and migrates its tables on first use, which two runs starting at once (a sweep's jobs) would
    both do, and break the database. Also makes the database's folder (SQLite makes only the file)."""
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with db.with_name(db.name + ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield


def _mlflow_key(key: str) -> str:
    """A key MLflow accepts (letters, digits, ``_ - . / :`` and spaces): ``terms[0].beta`` → ``terms.0.beta``."""
    return re.sub(r"[^\w\-./: ]", "_", re.sub(r"\[(\d+)\]", r".\1", key))


class WandbTracker:
    """A W&B run in project ``tracking.experiment`` (offline unless ``wandb_mode = "online"``): the resolved
    configuration as its config, the tags as ``name=value`` tags, metrics per round (step = round), the
    summary's numbers in its summary, the files as an artifact."""

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id

    def start(self, config: RunConfig, run_dir: Path) -> None:
        import wandb
        t = config.tracking
        self.artifacts = t.artifacts
        self.run = wandb.init(project=t.experiment, name=run_dir.name, config=parameters(config),
                              tags=[f"{k}={v}"[:64] for k, v in t.tags.items()],
                              mode="online" if t.wandb_mode == "online" else "offline",
                              id=self.run_id, resume="allow" if self.run_id else None,
                              dir=None if os.environ.get("WANDB_DIR") else str(run_dir),  # beside the run's files
                              settings=wandb.Settings(console="off", save_code=False))
        self.run_id = self.run.id

    def log_round(self, line: dict[str, Any]) -> None:
        self.run.log(metrics_of(line), step=line["round"])

    def finish(self, summary: dict[str, Any] | None, run_dir: Path, status: str) -> None:
        import wandb
        if summary is not None:
            self.run.summary.update({**summary_metrics(summary), "stop_reason": summary.get("stop_reason", "")})
        self.run.summary["status"] = status
        files = artifact_files(run_dir) if self.artifacts else []
        if files:
            artifact = wandb.Artifact(f"run-{self.run_id}", type="run")
            for path in files:
                artifact.add_file(str(run_dir / path), name=path.as_posix())
            self.run.log_artifact(artifact)
        self.run.finish(exit_code=0 if status == "completed" else 1)


TRACKERS = {"tensorboard": TensorBoardTracker, "mlflow": MlflowTracker, "wandb": WandbTracker}


def check(config: RunConfig) -> None:
    """Refuse, in one line, a tracker that cannot start: its package not importable, its store or folder
    not writable (a tracking server's address is not checked: that needs the network)."""
    for name in config.tracking.backends:
        for module in MODULES[name]:
            try:
                importlib.import_module(module)
            except ImportError as err:
                raise ConfigError(f"tracking.backends: {name!r} cannot start: {err}; pip install "
                                  f"'fedlatent[{name}]'") from None
    t = config.tracking
    if "mlflow" in t.backends:
        if not t.mlflow_uri:
            raise ConfigError("tracking.mlflow_uri is empty: give sqlite:///FILE, file:FOLDER or a server's address")
        db = _sqlite_file(t.mlflow_uri)
        if db is not None:
            _check_file(db, f"tracking.mlflow_uri = {t.mlflow_uri!r}")
        elif (folder := _file_store(t.mlflow_uri)) is not None:
            check_folder(folder, f"tracking.mlflow_uri = {t.mlflow_uri!r}")
    if "tensorboard" in t.backends and t.tensorboard_dir:
        check_folder(Path(t.tensorboard_dir), f"tracking.tensorboard_dir = {t.tensorboard_dir!r}")
    if "wandb" in t.backends and os.environ.get("WANDB_DIR"):
        check_folder(Path(os.environ["WANDB_DIR"]), f"WANDB_DIR = {os.environ['WANDB_DIR']!r}")


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///FILE`` store (``sqlite:////ABSOLUTE``), else None."""
    if not uri.startswith("sqlite:"):
        return None
    if not uri.startswith("sqlite:///") or len(uri) == len("sqlite:///"):
        raise ConfigError(f"tracking.mlflow_uri = {uri!r}: a SQLite store is sqlite:///FILE (relative to the "
                          f"working folder) or sqlite:////ABSOLUTE/FILE")
    return Path(uri[len("sqlite:///"):])


def _file_store(uri: str) -> Path | None:
    """The folder of a local file store (``file:FOLDER``, ``file:///FOLDER`` or a plain path), else None."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(parsed.path)
    return Path(uri) if not parsed.scheme else None


def _check_file(path: Path, what: str) -> None:
    """Refuse a file that cannot be opened for writing (or, when it does not exist, made)."""
    if not path.exists():
        check_folder(path.parent, what)
        return
    try:
        with path.open("r+b"):
            pass
    except OSError as err:
        raise ConfigError(f"{what}: cannot write {path} ({err.strerror or err})") from None


def trackers(config: RunConfig, ids: dict[str, str] | None = None, logged_round: int = 0) -> list[Tracker]:
    """The run's trackers, unstarted (none without ``tracking.backends``); ``ids``: the runs to reopen."""
    ids = ids or {}
    made: list[Tracker] = []
    for name in config.tracking.backends:
        made.append(TensorBoardTracker(ids.get(name), logged_round) if name == "tensorboard"
                    else TRACKERS[name](ids.get(name)))
    return made


class Session:
    """A run's trackers from start to finish: started on entry, told each round once (a resumed run's
    rounds logged before are skipped), finished on exit with the run's status — "completed", "stopped"
    (the failure policy), "interrupted" (Ctrl-C) or "failed" (an error) — and its summary."""

    def __init__(self, config: RunConfig, run_dir: Path, *, resume: bool = False) -> None:
        self.config, self.run_dir = config, run_dir
        state = self._state() if resume and config.tracking.backends else {}
        self.logged_round = state.get("logged_round", 0)
        self.trackers = trackers(config, state.get("ids"), self.logged_round)
        self.names = list(config.tracking.backends)
        self.active = list(self.trackers)  # less those that failed while the run went on

    def _state(self) -> dict[str, Any]:
        path = self.run_dir / STATE
        try:
            return json.loads(path.read_text()) if path.is_file() else {}
        except ValueError:
            return {}  # torn: start new runs rather than stop the resume

    def _save(self) -> None:
        ids = {name: t.run_id for name, t in zip(self.names, self.trackers)}
        write_atomically(self.run_dir / STATE, json.dumps({"ids": ids, "logged_round": self.logged_round}))

    def __enter__(self) -> Session:
        for i, (name, tracker) in enumerate(zip(self.names, self.trackers)):
            try:
                tracker.start(self.config, self.run_dir)
            except Exception as err:  # noqa: BLE001 - any tracker's failure to start is one line
                self._finish(self.trackers[:i], "failed")
                if isinstance(err, ConfigError):
                    raise
                raise ConfigError(f"tracking.backends: {name!r} cannot start: {_first_line(err)}") from None
        if self.trackers:
            self._save()
        return self

    def log_round(self, line: dict[str, Any]) -> None:
        """Send a ``metrics.jsonl`` line to every tracker, unless its round was sent already."""
        if not self.trackers or line["round"] <= self.logged_round:
            return
        for name, tracker in zip(self.names, self.trackers):
            if tracker not in self.active:
                continue
            try:
                tracker.log_round(line)
            except Exception as err:  # noqa: BLE001 - a tracker's failure (a server gone) must not end the training
                print(f"fedlatent: warning: tracker {name!r} failed at round {line['round']} ({_first_line(err)}); "
                      f"it records no more of this run", file=sys.stderr, flush=True)
                self.active.remove(tracker)
                self._finish([tracker], "failed")
        self.logged_round = line["round"]
        self._save()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        status = ("completed" if kind is None else "stopped" if issubclass(kind, RunStopped)
                  else "interrupted" if issubclass(kind, KeyboardInterrupt) else "failed")
        self._finish(self.active, status)

    def _finish(self, started: list[Tracker], status: str) -> None:
        """Finish every tracker in ``started``, each whatever the others do; one that fails is told on
        stderr in one line (the run's own files are written, its own error matters more)."""
        if not started:
            return
        path = self.run_dir / "summary.json"
        summary = json.loads(path.read_text()) if status in ("completed", "stopped") and path.is_file() else None
        for tracker in started:
            try:
                tracker.finish(summary, self.run_dir, status)
            except Exception as err:  # noqa: BLE001 - the other trackers still finish
                name = self.names[self.trackers.index(tracker)]
                print(f"fedlatent: warning: tracker {name!r} could not finish ({_first_line(err)})",
                      file=sys.stderr, flush=True)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def session(config: RunConfig, run_dir: Path, *, resume: bool = False) -> Session:
    """The trackers of the run in ``run_dir``, as a context manager (see :class:`Session`)."""
    return Session(config, run_dir, resume=resume)

