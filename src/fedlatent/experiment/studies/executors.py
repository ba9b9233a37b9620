"""Where a study's units (a cell, or a stack of cells) run on one machine: in the sweep's own process
(``--jobs 1``) or in ``--jobs N`` spawned worker processes, each unit on a CUDA device of its own
where the machine has several (:mod:`fedlatent.experiment.studies.placement`). A Ray cluster is the
third executor (:mod:`fedlatent.experiment.studies.cluster`); all three run
:func:`~fedlatent.experiment.studies.units.run_unit` and answer the sweep through the same four calls
(:class:`Executor`), so the sweep's folder, lines, tables and resume do not depend on which ran.
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import Executor as Processes
from pathlib import Path
from typing import Protocol

from fedlatent.config import RunConfig
from fedlatent.experiment.studies import units
from fedlatent.experiment.studies.placement import Shares, cuda_count, placeable, placed, settle


class Executor(Protocol):
    """What the sweep asks of the place its units run."""

    def room(self, running: int) -> bool:
        """Whether one more unit may start while ``running`` run."""

    def submit(self, configs: list[RunConfig], outs: list[str], figures: bool) -> Future:
        """Start one unit; its future's result is each cell's "" or error line."""

    def collect(self, future: Future) -> list[str]:
        """A finished unit's cells' "" or error line (whatever ended the unit, its cells' lines)."""

    def close(self) -> None:
        """Stop what the executor started."""


class InProcess:
    """``--jobs 1``: each unit runs in the sweep's process, one at a time (on ``cuda`` = ``cuda:0``)."""

    def room(self, running: int) -> bool:
        return running < 1

    def submit(self, configs: list[RunConfig], outs: list[str], figures: bool) -> Future:
        future: Future = Future()
        future.set_result(units.run_unit(configs, outs, figures))
        return future

    def collect(self, future: Future) -> list[str]:
        return future.result()

    def close(self) -> None:
        pass


def worker_processes(jobs: int) -> Processes:
    """The ``--jobs`` pool: spawned processes (a fresh interpreter each: no state shared with the sweep)."""
    return ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))


class WorkerPool:
    """``--jobs N``: units in N worker processes; on a machine with several CUDA devices each unit of
    placeable cells starts on the device the fewest running units use (:class:`~fedlatent.experiment.studies.placement.Shares`),
    which its cells' ``config.toml`` record."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        count = cuda_count()
        self.shares = Shares(count) if count > 1 else None
        self.pool = worker_processes(jobs)
        self.held: dict[Future, str] = {}

    def room(self, running: int) -> bool:
        return running < self.jobs

    def submit(self, configs: list[RunConfig], outs: list[str], figures: bool) -> Future:
        device = self.shares.take() if self.shares and placeable(configs) else None
        if device:
            configs = [placed(c, device) for c in configs]
            for config, out in zip(configs, outs):
                settle(config, Path(out))
        future = self.pool.submit(units.run_unit, configs, outs, figures)
        if device:
            self.held[future] = device
        return future

    def collect(self, future: Future) -> list[str]:
        if self.shares and future in self.held:
            self.shares.give(self.held.pop(future))
        return future.result()

    def close(self) -> None:
        self.pool.shutdown()


def local(jobs: int) -> Executor:
    """The executor of ``--jobs``: in process for 1, else a :class:`WorkerPool`."""
    return InProcess() if jobs <= 1 else WorkerPool(jobs)
