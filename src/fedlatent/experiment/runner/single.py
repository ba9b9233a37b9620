"""One run end to end: resolve the method, build the federation (on Flower: the server's view of the
data), hand the loop to a backend, and write the run directory (config.toml, partition table,
metrics.jsonl, summary.json, plots/).

Bad input — the output folder, the configuration, the data — is found before any training and
before the run directory is created; a run the failure policy stops still writes its summary.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import shutil
import time
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fedlatent.analysis.tables import partition_overview, partition_table
from fedlatent.backends import auto, capabilities, simulation, vectorized
from fedlatent.backends.simulation import Trainer
from fedlatent.config import RunConfig, to_toml
from fedlatent.data.federation import build_federation, counts_table, declared_view, server_view
from fedlatent.data.registry import DATASETS
from fedlatent.data.types import Federation, ServerView
from fedlatent.errors import ConfigError, UserInputError
from fedlatent.experiment.runner.figures import CurvesPacing, FigureWorker, NoFigures, start_process
from fedlatent.experiment.runner import privacy_report, tracking
from fedlatent.experiment.runner.folders import TERMS, check_same_config, completed, default_out, extension_note
from fedlatent.experiment.runner.machine import cpu_model
from fedlatent.experiment.runner.progress import progress as show_progress
from fedlatent.experiment.runner.trace import TermTrace
from fedlatent.experiment.runner.notes import setup_notes
from fedlatent.experiment.runner.validation import check_fit, validate
from fedlatent.experiment.runner.writable import check_folder, nearest_existing
from fedlatent.federated import precision
from fedlatent.federated.failures import RunStopped
from fedlatent.federated.state import write_atomically
from fedlatent.methods import resolved_keys
from fedlatent.methods.parts import MethodSpec



def _flower(*args: Any, **kwargs: Any) -> tuple[dict[str, Any], float]:
    """``backend = "flower"`` (the optional extra ``fedlatent[flower]``, imported only when used)."""
    from fedlatent.backends.flower import engine
    return engine.run(*args, **kwargs)


_RUNS_IN_PROCESS = itertools.count()  # the first run of a process pays its one-off imports in its set-up

BACKENDS = {"simulation": simulation.run, "vectorized": vectorized.run, "flower": _flower}
TRAINERS = {"simulation": simulation.train_in_turn, "vectorized": vectorized.trainer}  # the embedded backends' clients


@functools.cache  # the installed version does not change while a process runs (~2 ms a lookup)
def fedlatent_version() -> str:
    """The installed package's version, recorded in every run's summary."""
    try:
        return version("fedlatent")
    except PackageNotFoundError:
        return "0+unknown"


def identity(config: RunConfig) -> dict[str, Any]:
    """What identifies a run beside its seed: the partition's keys and the method's resolved keys."""
    d = config.data
    return {"partition": {"dataset": d.dataset, "partition": d.partition, "alpha": d.alpha,
                          "num_clients": d.num_clients, "classes_per_client": d.classes_per_client,
                          "data_seed": config.data_seed},
            "method": resolved_keys(config.algorithm, config.terms)}


def prepare(config: RunConfig) -> tuple[Federation | ServerView, MethodSpec]:
    """Check everything that needs no data (:func:`fedlatent.experiment.runner.validation.validate`), then
    build the federation — on Flower only the server's view of the data, from the configuration alone
    (:func:`~fedlatent.data.federation.declared_view`; the nodes build their clients and evaluate the
    global model) or, with ``flower.server_reads_data``, read from the data set
    (:func:`~fedlatent.data.federation.server_view`) — and check what needs it
    (:func:`~fedlatent.experiment.runner.validation.check_fit`): what ``fedlatent check`` checks. The
    federation is built in one pass, its held-out clients (``data.holdout_clients``) set apart there
    (a view of the same partition, :mod:`fedlatent.data.holdout`), and builds no client's splits
    (they are built when a round reads them: :mod:`fedlatent.data.clients`); the checks read the
    clients' sample counts. What a Flower server learns only from its census is checked then
    (:func:`_run_in`)."""
    spec = validate(config)
    if config.backend != "flower":
        data: Federation | ServerView = build_federation(config.data, config.data_seed)
    elif config.flower.server_reads_data:
        data = server_view(config.data, config.data_seed)
    else:  # the server opens no data: the rest of check_fit follows the nodes' census (_run_in)
        data = declared_view(config.data)
    check_fit(config, spec, data)
    return data, spec


def resolve_backend(config: RunConfig, federation: Federation, spec: MethodSpec, echo=None) -> RunConfig:
    """``config`` with ``backend = "auto"`` replaced by the backend :func:`fedlatent.backends.auto.choose`
    picks (told to ``echo`` in one line); any other backend unchanged."""
    if config.backend != "auto":
        return config
    backend, why = auto.choose(config, federation, spec)
    if echo:
        echo(f"backend = 'auto': {backend} ({why})")
    return dataclasses.replace(config, backend=backend)


def resolve_precision(config: RunConfig) -> RunConfig:
    """``config`` with ``train.precision = "auto"`` replaced by what it means on ``train.device``
    (:func:`fedlatent.federated.precision.resolve`), for the run's ``config.toml`` to record. On
    Flower with a device other than the CPU it stays ``"auto"``: the nodes may see devices this
    process does not, and each resolves it on the device it trains on."""
    t = config.train
    if t.precision != "auto" or (config.backend == "flower" and t.device.split(":")[0] != "cpu"):
        return config
    return dataclasses.replace(config, train=dataclasses.replace(t, precision=precision.resolve(t.precision, t.device)))


def as_started(config: RunConfig, config_toml: Path) -> RunConfig:
    """``config`` with ``backend = "auto"`` and ``train.precision = "auto"`` replaced by the choices
    the run whose ``config.toml`` this is started with (the file records them resolved), so that a
    resumed run continues on them whatever ``auto`` would pick today."""
    if (config.backend != "auto" and config.train.precision != "auto") or not config_toml.is_file():
        return config
    try:
        started = tomllib.loads(config_toml.read_text())
    except tomllib.TOMLDecodeError:
        return config  # the caller's comparison of the two files names the difference
    backend = started.get("backend", "auto") if config.backend == "auto" else config.backend
    train = started.get("train")
    chosen = train.get("precision", "auto") if isinstance(train, dict) and config.train.precision == "auto" \
        else config.train.precision
    if not isinstance(backend, str) or chosen not in precision.PRECISIONS:
        return config
    return dataclasses.replace(config, backend=backend, train=dataclasses.replace(config.train, precision=chosen))


def check_out(out: Path, *, resume: bool, create_parents: bool = False) -> None:
    """Refuse an output folder the run cannot use, before any work: a file, a run already there
    (without ``resume``), nothing to resume (with it), a missing parent folder (a mistyped path
    should not grow a tree; folders under the project's ``runs/`` are created), or a place that
    cannot be written."""
    t = TERMS.get()  # the CLI's flags or the Python arguments, as the caller knows them
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{t.out} {out}: is a file, not a folder")
    if resume and not (out / "config.toml").is_file():
        raise ConfigError(f"{t.out} {out}: {t.resume} found no run there (no config.toml); start it without {t.resume}")
    if not resume and (out / "checkpoints").exists():
        raise ConfigError(f"{t.out} {out}: holds a run already; pass {t.resume} to continue it (with a larger "
                          f"train.rounds: to extend it) or choose another {t.out}")
    existing = nearest_existing(out)
    if existing != out and existing != out.parent and not create_parents:
        raise ConfigError(f"{t.out} {out}: its parent folder {out.parent} does not exist")
    check_folder(out, f"{t.out} {out}")


def write_partition(counts: np.ndarray, out: Path) -> str:
    """Write the full client × class table of training samples ``counts`` (``partition.txt``,
    ``partition.json``) and return what the terminal shows of it (the table for few clients, a
    summary for many)."""
    (out / "partition.txt").write_text(partition_table(counts) + "\n")
    (out / "partition.json").write_text(json.dumps({"counts": counts.tolist()}))
    return partition_overview(counts, full=f"{out / 'partition.txt'}, {out / 'partition.json'}")


def partition_teller(config: RunConfig, out: Path, name: str, figures: FigureWorker | NoFigures,
                     echo) -> Callable[[np.ndarray], None]:
    """What the run does with its partition table: write it, ask for its figure, show it to ``echo``."""
    def tell(counts: np.ndarray) -> None:
        table = write_partition(counts, out)
        figures.draw("partition", title=f"{name}: samples per client and class")
        if echo:
            echo(f"partition ({config.data.partition}, {len(counts)} clients):\n{table}")
    return tell


def run(config: RunConfig, out: str | Path | None = None, *, resume: bool = False, progress: bool | str = False,
        echo=print, figures: bool = True, figures_in_background: bool = True, grid: Any = None,
        trainer: Trainer | None = None) -> dict[str, Any]:
    """Run ``config`` and return the summary (the content of ``summary.json``); the figures are
    drawn by the figure process while the run trains (:mod:`fedlatent.experiment.runner.figures`;
    ``figures_in_background=False``: in-process;
    ``figures=False``: none, e.g. for the runs of a sweep, whose report draws its own; the run's
    files are the same, less ``plots/``; ``fedlatent report`` draws curves from them).
    ``grid``: a Flower deployment's grid for ``backend = "flower"`` (else its simulation engine);
    ``trainer``: who trains the clients of an embedded run (the stack of a study's runs,
    :class:`fedlatent.backends.stacked.Cohort`), instead of its backend's own.
    ``progress``: True or ``"bar"``, ``"lines"``, ``"auto"`` (:func:`fedlatent.experiment.runner.progress.progress`).
    Resuming a run that completed every round returns its summary and leaves its folder as it is."""
    started = time.perf_counter()
    first = next(_RUNS_IN_PROCESS) == 0
    out = Path(out) if out is not None else default_out(config)
    check_out(out, resume=resume, create_parents=not out.is_absolute() and out.parts[:1] == ("runs",))
    if resume:
        config = as_started(config, out / "config.toml")
        extended = check_same_config(config, out / "config.toml")
        if extended is not None and echo:
            echo(extension_note(extended, config.train.rounds))
        done = completed(config, out)
        if done is not None:  # nothing to train: the run is left as it is
            if echo:
                echo(f"already complete: {done['rounds_completed']} rounds; summary at {out / 'summary.json'}")
            return done
    if figures and figures_in_background:
        start_process()  # before the data are loaded
    data, spec = prepare(config)
    config = resolve_precision(config)
    if isinstance(data, Federation):  # not on Flower (its view has no clients to choose a backend by)
        config = resolve_backend(config, data, spec, echo)
        for note in setup_notes(config, spec, data.input_shape, data.num_classes) if echo else ():
            echo(note)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with tracking.session(config, out, resume=resume) as tracked:  # closed after the figures are drawn
            return _run_in(config, out, data, spec, Clock(started, first), resume=resume, progress=progress,
                           echo=echo,
                           figures=FigureWorker(out, background=figures_in_background) if figures else NoFigures(),
                           backend_args=_backend_args(config, grid, trainer), track=tracked.log_round)
    except UserInputError:
        if created and not (out / "metrics.jsonl").is_file():  # found before training: leave nothing behind
            shutil.rmtree(out, ignore_errors=True)
        raise


def _backend_args(config: RunConfig, grid: Any, trainer: Trainer | None) -> dict[str, Any]:
    """The backend's own arguments: Flower's grid, or the trainer of an embedded run."""
    reason = capabilities.refusal(capabilities.BY_KEY["stacked cells"], config.backend)
    if trainer is not None and reason:
        raise ConfigError(reason)
    return {**({"grid": grid} if grid is not None else {}), **({"trainer": trainer} if trainer is not None else {})}


def _run_in(config: RunConfig, out: Path, data: Federation | ServerView, spec: MethodSpec, clock: Clock, *,
            resume: bool, progress: bool | str, echo, figures: FigureWorker | NoFigures, backend_args: dict[str, Any],
            track: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The run in its (existing) directory: partition, training, summary; the figures are on disk
    when it returns or raises. ``track``: told each metrics line (the experiment trackers). The
    partition table is the federation's, or on Flower the nodes' (told by the backend after its census,
    which it first has checked)."""
    try:
        write_atomically(out / "config.toml", to_toml(config))
        tell = partition_teller(config, out, data.name, figures, echo)
        if isinstance(data, Federation):
            tell(counts_table(data))
        else:  # the census's classes, input shape and clients checked as the data's are (still exit 2)
            backend_args = {**backend_args, "partition": tell, "check": lambda seen: check_fit(config, spec, seen)}
        return _train(config, out, data, spec, clock, resume=resume, progress=progress, echo=echo,
                      figures=figures, backend_args=backend_args, track=track)
    finally:
        figures.close()


def _train(config: RunConfig, out: Path, data: Federation | ServerView, spec: MethodSpec, clock: Clock, *,
           resume: bool, progress: bool | str, echo, figures: FigureWorker | NoFigures,
           backend_args: dict[str, Any], track: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Hand the rounds to the backend; summarise how they ended (a stopped run too)."""
    bar = show_progress(progress, config.train.rounds, f"{config.algorithm['name']} on {config.data.dataset}")
    curves = CurvesPacing(figures, config.train.rounds)  # kept current while the run trains

    def on_line(line: dict[str, Any]) -> None:
        track(line)
        if bar:
            bar.update_line(line)
        curves.line(line["round"])

    backend_started = time.perf_counter()
    try:
        traced = {}  # the backend's own trainer unless a stack's, or the trace, wraps it
        trainer = backend_args.pop("trainer", None)
        if spec.trace and config.backend not in TRAINERS:  # Flower: the uploads bring the nodes' traces
            traced["trace"] = TermTrace(None, out).record
        elif spec.trace:
            traced["trainer"] = TermTrace(trainer or TRAINERS[config.backend], out)
        elif trainer is not None:
            traced["trainer"] = trainer
        final, wall = BACKENDS[config.backend](config, data, spec, out, resume=resume, progress=on_line,
                                               rounds_start=clock.rounds_start, **traced, **backend_args)
    except RunStopped as stop:
        if bar:
            bar.close()
        _summarize(config, spec, out, {"status": "stopped", "stop_reason": stop.reason},
                   time.perf_counter() - clock.started, clock, curves)
        raise
    except BaseException:  # Ctrl-C, a bug: no summary, but the curves show every line written
        curves.finish(curves.newest)
        raise
    backend_seconds = time.perf_counter() - backend_started
    if bar:
        bar.close()
    if config.diagnostics.which:
        figures.draw("diagnostics")
    return _summarize(config, spec, out, {"status": "completed", "final": final},
                      wall + time.perf_counter() - clock.started - backend_seconds, clock, curves)


@dataclasses.dataclass
class Clock:
    """When a run started in this process, whether it is the process's first run, and when its
    rounds started (told by the backend): its set-up and training seconds."""

    started: float
    first_in_process: bool
    rounds_started: float | None = None

    def rounds_start(self) -> None:
        self.rounds_started = time.perf_counter()

    def split(self, metrics: list[dict[str, Any]]) -> dict[str, Any]:
        """``setup_seconds``: from the run's start in this process to its first round (the data, the
        model, the process's one-off imports when ``first_in_process``; a resumed run: its last
        start's); ``train_seconds``: the rounds' own seconds (``time_round_s`` summed, rounds before
        a resume included)."""
        setup = None if self.rounds_started is None else self.rounds_started - self.started
        return {"setup_seconds": setup, "train_seconds": sum(m.get("time_round_s", 0.0) for m in metrics),
                "first_in_process": self.first_in_process}


def _summarize(config: RunConfig, spec: MethodSpec, out: Path, ending: dict[str, Any],
               wall: float, clock: Clock, curves: CurvesPacing) -> dict[str, Any]:
    """Ask for the curves (unless they show the newest line already) and write ``summary.json``
    (how the run ended, the final evaluation when it completed, the clients the failure policy
    dropped, the wall seconds in total and split into set-up and training) and return the summary."""
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curves.finish(metrics[-1]["round"] if metrics else 0)
    summary = {**ending, "rounds_completed": len(metrics),
               "clients_dropped": [dict(d, round=m["round"]) for m in metrics for d in m.get("dropped", [])],
               "seed": config.seed, "method": spec.name, "personalized": spec.personalizes,
               "backend": config.backend, "dataset": config.data.dataset,
               "headline": headline_metric(config.data.dataset),
               "identity": identity(config),
               "wall_seconds": wall, **clock.split(metrics), "fedlatent_version": fedlatent_version(),
               "machine": cpu_model()}
    final = ending.get("final", {})
    if "privacy_epsilon" in final:  # DP-FedAvg's ε after the final calibration's release, at privacy.delta
        summary.update(privacy_epsilon=final["privacy_epsilon"], privacy_delta=config.privacy.delta)
    elif metrics and "privacy_epsilon" in metrics[-1]:  # DP-FedAvg's ε after the last round, at privacy.delta
        summary.update(privacy_epsilon=metrics[-1]["privacy_epsilon"], privacy_delta=config.privacy.delta)
    if metrics and "sample_level_epsilon" in metrics[-1]:  # sample-level DP-SGD's, the worst client's
        summary.update(sample_level_epsilon=metrics[-1]["sample_level_epsilon"],
                       sample_level_delta=config.privacy.delta)
    summary.update(privacy_report.summary_fields(config, summary))  # for whom ε holds (privacy.randomness)
    if "classifier_clients" in ending.get("final", {}):
        summary.update(classifier_columns(metrics, ending["final"]))
    write_atomically(out / "summary.json", json.dumps(summary, indent=1))
    return summary


def classifier_columns(metrics: list[dict[str, Any]], final: dict[str, Any]) -> dict[str, float]:
    """SphereFed Table 1's columns for this run (``diagnostics.which`` holding ``flops``): the
    classifier's communication per client in MB (10⁶ bytes) and its FLOPs in G, the rounds' and
    the final calibration's (:mod:`fedlatent.analysis.classifier_cost`)."""
    sent = final["classifier_calibration_bytes"] + sum(m.get("classifier_bytes", 0) for m in metrics)
    flops = final["classifier_calibration_flops"] + sum(m.get("classifier_flops", 0) for m in metrics)
    return {"classifier_megabytes_per_client": sent / final["classifier_clients"] / 1e6,
            "classifier_gflops": flops / 1e9}


def headline_metric(dataset: str) -> str:
    """The metric a data set reports and compares by: its ``headline`` trait (Fed-ISIC2019:
    ``balanced_accuracy``, FLamby's metric), else ``accuracy``."""
    return DATASETS.get(dataset).traits.get("headline", "accuracy")


def run_on_grid(grid: Any, config_path: str, overrides: list[str], out: str | None, resume: bool) -> dict[str, Any]:
    """A run on a Flower deployment's grid (the ServerApp ``flwr run`` starts on a SuperLink)."""
    from fedlatent.config import load_config
    return run(load_config(config_path, overrides), out, resume=resume, grid=grid)


# what this module offers; ``flower_server_app`` is built on first access (below), and is listed so
# that ``flwr build`` finds it in the source
__all__ = ["BACKENDS", "default_out", "flower_server_app", "fedlatent_version", "prepare", "run", "run_on_grid",  # noqa: F822
           "write_partition"]


def __getattr__(name: str) -> Any:
    """``flower_server_app``: the ServerApp ``flwr run`` starts (``[tool.flwr.app.components]``),
    built on first access so that importing this module needs no Flower."""
    if name == "flower_server_app":
        from fedlatent.backends.flower.server_app import deployment_app
        return deployment_app(run_on_grid)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
