"""Run every cell of a study into its own run directory, resumably, ``jobs`` at a time; cells that
train alike stacked into one lockstep stack where ``stack`` allows (:mod:`fedlatent.experiment.studies.stacking`).

A finished run (``summary.json`` present) is skipped; an unfinished one continues from its last
checkpoint (``run(..., resume=True)`` gives the uninterrupted run's numbers). With ``jobs > 1``
the runs go to spawned worker processes; each run keeps its own seed and ``train.threads``, so
``--jobs 2`` gives the numbers of ``--jobs 1``; on a machine with several CUDA devices each worker's
cells train on a device of their own (:mod:`fedlatent.experiment.studies.placement`); on a Ray
cluster each unit is a task (:mod:`fedlatent.experiment.studies.cluster`). After every finished run the sweep rewrites
``results.csv`` and ``results.md`` and prints one progress line; while runs train, every
:data:`HEARTBEAT_S` seconds one line per running cell tells its round and latest test accuracy
(a paper's run can take an hour).
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from fedlatent.config import RunConfig, to_toml
from fedlatent.errors import UserInputError
from fedlatent.experiment.runner.single import as_started
from fedlatent.experiment.studies.executors import Executor, local
from fedlatent.experiment.studies.placement import as_recorded
from fedlatent.experiment.studies.stacking import stacks
from fedlatent.experiment.studies.store import progress, run_row, write_tables
from fedlatent.experiment.studies.study import Cell, Study
from fedlatent.experiment.studies.preflight import validate_study

if TYPE_CHECKING:
    from fedlatent.experiment.studies.cluster import Cluster


HEARTBEAT_S = 60.0  # how often a sweep tells how far its running cells are


class Heartbeat:
    """Every ``interval`` seconds, one line per running cell: the round it reached of the rounds it
    plans and its latest test accuracy, read from the cell's ``metrics.jsonl`` (its run may train in
    a worker process), and how long it has been running."""

    def __init__(self, echo: Callable[[str], None], interval: float | None = None) -> None:
        self.echo, self.interval = echo, HEARTBEAT_S if interval is None else interval
        self.running: dict[str, tuple[Path, int, float]] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="sweep-heartbeat", daemon=True)
        self.thread.start()

    def start(self, name: str, run_dir: Path, rounds: int) -> None:
        self.running[name] = (run_dir, rounds, time.perf_counter())

    def end(self, name: str) -> None:
        self.running.pop(name, None)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()

    def _beat(self) -> None:
        while not self.stopped.wait(self.interval):
            for name, (run_dir, rounds, started) in list(self.running.items()):
                reached = progress(run_dir)
                where = (f"round {reached['latest_round']}/{rounds}, test accuracy {reached['latest_accuracy']:.4f}"
                         if reached else "no round finished yet")
                self.echo(f"    {name}: {where} ({_duration(time.perf_counter() - started)})")


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


def _status(out: Path) -> str:
    if (out / "summary.json").exists():
        return "skipped"
    return "resumed" if (out / "checkpoints").exists() else "ran"


def write_manifest(study: Study, out: Path) -> None:
    """``sweep.json``: the study's axes and each run's labels, which ``report`` groups by."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps({
        "title": study.title, "axes": [a.name for a in study.axes], "select": study.select,
        "metric": study.metric,
        "runs": [{"run": c.name, "labels": c.labels, "unavailable": c.unavailable} for c in study.cells]},
        indent=1) + "\n")


def tagged(config: RunConfig, labels: dict[str, str], study: str) -> RunConfig:
    """``config`` with the study's name and the cell's label on each axis added to ``tracking.tags``
    (tags the study sets itself kept) when it names a tracker; else unchanged."""
    t = config.tracking
    if not t.backends:
        return config
    return dataclasses.replace(config, tracking=dataclasses.replace(t, tags={"study": study, **labels, **t.tags}))


def _say(text: str) -> None:
    print(text, flush=True)


FIRST_NOTE = "; *: its process's first run, the seconds include one-off imports and warm-up"


def run_sweep(study: Study, out: str | Path, *, jobs: int = 1, echo: Callable[[str], None] | None = _say,
              figures: bool = True, stack: int | str = "auto", cluster: Cluster | None = None) -> list[dict[str, Any]]:
    """Run the study's available cells under ``out/<cell name>``; return the tidy rows. Every cell is
    first validated as its run would validate it (:func:`~fedlatent.experiment.studies.preflight.validate_study`),
    so that a bad cell stops the sweep before any folder or training (``figures=False``: the runs
    draw no figures of their own, see ``fedlatent sweep --no-figures``). Cells that may train as
    one lockstep stack do so as ``stack`` allows (:mod:`fedlatent.experiment.studies.stacking`); ``jobs``
    stacks (or lone cells) run at once, in worker processes (:mod:`fedlatent.experiment.studies.executors`)
    or, with ``cluster``, as Ray tasks on a cluster (:mod:`fedlatent.experiment.studies.cluster`)."""
    out = Path(out)
    configs = {cell.name: tagged(cell.config, cell.labels, out.name) for cell in study.cells}
    # every runnable cell as its run checks it, before any folder or training (on a cluster, as a driver
    # without the nodes' GPUs can)
    validate_study(study if cluster is None else cluster.driver_view(study))
    if cluster is not None:  # the cluster reachable and able to run every cell, before any folder
        cluster.admit([configs[c.name] for c in study.cells if not c.unavailable], jobs)
    write_manifest(study, out)
    for cell in study.cells:
        existing = out / cell.name / "config.toml"
        started = as_started(as_recorded(configs[cell.name], existing), existing)  # placed on a device: as recorded
        if existing.exists() and existing.read_text() != to_toml(started):
            raise UserInputError(f"{existing}: holds another configuration than the study's cell {cell.name}; "
                                 f"choose another --out")
    rows: dict[str, dict[str, Any]] = {}
    todo: list[Cell] = []
    for cell in study.cells:
        if cell.unavailable:
            rows[cell.name] = run_row(cell.name, cell.labels, "unavailable", out / cell.name, error=cell.unavailable)
        elif _status(out / cell.name) == "skipped":
            rows[cell.name] = run_row(cell.name, cell.labels, "skipped", out / cell.name, study.select)
        else:
            todo.append(cell)
    axes = [a.name for a in study.axes]
    ordered = lambda: [rows[c.name] for c in study.cells if c.name in rows]  # noqa: E731
    total, done = len(study.cells), len(rows)

    def finish(cell: Cell, status: str, error: str, started: float) -> None:
        nonlocal done
        done += 1
        rows[cell.name] = run_row(cell.name, cell.labels, "failed" if error else status, out / cell.name,
                                  study.select, error)
        write_tables(ordered(), axes, out, title=study.title, select=study.select)
        if echo:
            acc = rows[cell.name].get("accuracy")
            result = f"FAILED: {error}" if error else f"accuracy {acc:.4f}" if acc is not None else status
            first = rows[cell.name].get("first_in_process") is True  # the table's "*": its seconds hold the warm-up
            echo(f"[{done}/{total}] {cell.name}: {result} ({time.perf_counter() - started:.1f} s{' *' if first else ''}, "
                 f"{status}){FIRST_NOTE if first else ''}")

    if echo and done:
        echo(f"{done} of {total} runs finished already or not runnable; running {len(todo)}")
    beat = Heartbeat(echo) if echo and todo else None

    def starting(cell: Cell) -> tuple[str, float]:
        if beat:
            beat.start(cell.name, out / cell.name, configs[cell.name].train.rounds)
        return _status(out / cell.name), time.perf_counter()

    def ending(cell: Cell, status: str, error: str, started: float) -> None:
        if beat:
            beat.end(cell.name)
        finish(cell, status, error, started)

    by_name = {cell.name: cell for cell in todo}
    units = [[by_name[name] for name in unit] for unit in stacks({c.name: configs[c.name] for c in todo}, stack)]
    if echo and any(len(unit) > 1 for unit in units):
        echo("stacked: " + "; ".join(", ".join(c.name for c in unit) for unit in units if len(unit) > 1))

    def arguments(unit: list[Cell]) -> tuple[list[RunConfig], list[str], bool]:
        return [configs[c.name] for c in unit], [str(out / c.name) for c in unit], figures

    def begin(unit: list[Cell]) -> list[tuple[Cell, str, float]]:
        return [(cell, *starting(cell)) for cell in unit]

    def end(begun: list[tuple[Cell, str, float]], errors: list[str]) -> None:
        for (cell, status, started), error in zip(begun, errors):
            ending(cell, status, error, started)

    executor: Executor = cluster.executor(out, echo) if cluster is not None else local(jobs)
    try:
        pending: dict[Future, list[tuple[Cell, str, float]]] = {}
        queue = list(units)
        while queue or pending:
            while queue and executor.room(len(pending)):
                unit = queue.pop(0)
                begun = begin(unit)
                pending[executor.submit(*arguments(unit))] = begun
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                end(pending.pop(future), executor.collect(future))
    finally:
        executor.close()
        if beat:
            beat.close()
    write_tables(ordered(), axes, out, title=study.title, select=study.select)
    return ordered()
