"""The run's figures, drawn beside the training instead of after it.

On the digits workload the two figures cost about as much as all 20 rounds of training
(matplotlib's import, ~100 cell labels and PNG encoding: ~0.25 s against ~0.3 s of training, warm).
A figure process, forked at this process' first run and kept for its later ones
(:class:`FigureProcess`: later runs pay no fork, nor the copy-on-write page faults it causes,
and find matplotlib's caches warm), draws the partition heatmap on the other core while the run
trains, then keeps the learning curves current: the run asks for them after its first metrics
line, then at most every :data:`CURVES_SECONDS`, after the last round and once more when it ends
(:class:`CurvesPacing`), and the process draws only the new points (:class:`fedlatent.analysis.plots.LearningCurves`,
~1 ms; a run planning as many rounds as the process' previous one starts on that one's curves,
whose background serves it when the axes' limits agree), writing ``curves.png`` (~8 ms) when it shows the last round and every
:data:`REWRITE_SECONDS` before (a killed run keeps recent curves). Requests that queued while the
process was busy are drawn once (the curves read the whole metrics file anyway), so it never
falls behind by more than one drawing, and what is left on the run's path after its last round
is the wait for that last drawing and its PNG. Requests travel one JSON line each through a pipe,
and the process answers one line when a run's figures are on disk; it ends at the end of input,
i.e. when this process ends or is killed. Where ``fork`` is unavailable, or the figure process
fails or has died, the run's figures are drawn in this process, so nothing is lost (and the next
run forks a new one). The figure process touches no torch state, ignores Ctrl-C (this process
waits for the figures) and leaves through ``os._exit``.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from fedlatent.analysis import render

REWRITE_SECONDS = 2.0  # how stale the figure process lets curves.png get while a run trains
CURVES_SECONDS = 0.5  # the most wall time between two requests for the curves while a run trains


class FigureProcess:
    """A forked process drawing the figures of this process' runs, one run after another."""

    def __init__(self) -> None:
        _warm_matplotlib()  # imported once, before the fork
        requests_read, requests_write = os.pipe()
        replies_read, replies_write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the figure process
            os.close(requests_write)
            os.close(replies_read)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            os._exit(_serve(requests_read, replies_write))
        os.close(requests_read)
        os.close(replies_write)
        self.pid, self.owner, self.runs = pid, os.getpid(), 0
        self.requests, self.replies = os.fdopen(requests_write, "w"), os.fdopen(replies_read)

    def start_run(self, run_dir: Path) -> int:
        """Mark the start of a run's requests; its number, for :meth:`finish_run`."""
        self.runs += 1
        self.send({"run": str(run_dir)})
        return self.runs

    def send(self, message: dict[str, Any]) -> None:
        """One message; a process that has gone is found by :meth:`finish_run`."""
        try:
            self.requests.write(json.dumps(message) + "\n")
            self.requests.flush()
        except OSError:
            pass

    def finish_run(self, run: int) -> bool:
        """Wait until the figures of run number ``run`` are on disk; False if the process failed
        or died. An earlier run's answer left unread (its wait was interrupted) is skipped."""
        self.send({"end": run})
        try:
            while answer := self.replies.readline():
                if answer == f"drawn {run}\n":
                    return True
        except OSError:
            pass
        return False

    def exited(self) -> bool:
        try:
            return os.waitpid(self.pid, os.WNOHANG)[0] != 0
        except ChildProcessError:  # reaped already
            return True

    def close_pipes(self) -> None:
        """This end of both pipes closed: the figure process sees the end of its input."""
        for pipe in (self.requests, self.replies):
            try:
                pipe.close()
            except OSError:
                pass

    def stop(self) -> None:
        """End of input: the process ends (or has ended); reap it."""
        self.close_pipes()
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:  # reaped already
            pass


_process: FigureProcess | None = None
_IN_PROCESS = threading.Lock()  # one run's figures drawn in this process at a time


def shared_process() -> FigureProcess:
    """This process' figure process, forked now if there is none yet, or it has exited, or it
    belongs to the process this one was forked from."""
    global _process
    if _process is not None and _process.owner != os.getpid():
        _process.close_pipes()  # the parent's: let its process see its end
        _process = None
    if _process is not None and _process.exited():
        _process.stop()
        _process = None
    if _process is None:
        _process = FigureProcess()
    return _process


def start_process() -> None:
    """Fork this process' figure process now if there is none: before a run loads its data, so that
    the figure process, which keeps this process' memory as it was when forked (copy-on-write),
    does not hold a first run's data set after that run has freed it."""
    if sys.platform.startswith("linux"):
        shared_process()


def _discard(process: FigureProcess) -> None:
    global _process
    if _process is process:
        _process = None
    process.stop()


class FigureWorker:
    """Draws the figures of the run in ``run_dir``: in the figure process, or in-process as a fallback."""

    def __init__(self, run_dir: Path, *, background: bool = True) -> None:
        self.run_dir = run_dir
        self.requests: list[dict[str, Any]] = []
        self.process: FigureProcess | None = None
        self.run = 0  # the run's number in the figure process
        if background and sys.platform.startswith("linux"):
            self.process = shared_process()
            self.run = self.process.start_run(run_dir)

    def draw(self, figure: str, **options: Any) -> None:
        """Ask for ``figure`` (see :data:`fedlatent.analysis.render.FIGURES`) once the files it
        reads are written."""
        request = {"figure": figure, "options": options}
        self.requests.append(request)
        if self.process is not None:
            self.process.send(request)

    def close(self) -> None:
        """Wait until every requested figure is on disk; draw in-process whatever the figure
        process could not (each distinct request once)."""
        if self.process is not None:
            process, self.process = self.process, None
            if process.finish_run(self.run):
                return
            _discard(process)
            print("fedlatent: the figure process failed; drawing the figures in-process", file=sys.stderr)
        with _IN_PROCESS:  # the runs of a stack close in threads of their own; matplotlib's state is shared
            renderer = render.Renderer(self.run_dir)
            for request in distinct(self.requests):
                renderer.draw(request["figure"], request["options"])


class NoFigures:
    """The figure worker of a run without figures (``run(..., figures=False)``, ``--no-figures``):
    asked for figures, draws none."""

    def draw(self, figure: str, **options: Any) -> None:
        pass

    def close(self) -> None:
        pass


def now() -> float:
    """The clock :class:`CurvesPacing` paces its requests by (its own function: tests replace it)."""
    return time.monotonic()


class CurvesPacing:
    """When a run asks ``figures`` for its learning curves: after its first metrics line (the
    figure process builds the figure and draws its axes while the run trains, so that after the
    last round a blit and the PNG are left), then when the last request is ``interval`` seconds
    old (:data:`CURVES_SECONDS` by default) or the line is the planned last round, and at the
    run's end (:meth:`finish`) when its newest line was not shown. Every request costs the figure
    process a redraw on the cores the training shares (a round of the digits workload is a few
    ms); the curves read the whole metrics file, so the figure after the last request is the same
    whichever lines were asked for before."""

    def __init__(self, figures: FigureWorker | NoFigures, rounds: int, interval: float | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.figures, self.rounds = figures, rounds
        self.interval = CURVES_SECONDS if interval is None else interval
        self.clock = clock or now
        self.asked_at = self.clock()
        self.newest = self.shown = 0  # the newest round written, the newest asked for

    def line(self, rnd: int) -> None:
        """Round ``rnd``'s metrics line is written: ask for the curves if it is due."""
        self.newest = rnd
        if not self.shown or rnd == self.rounds or self.clock() - self.asked_at >= self.interval:
            self.ask(rnd)

    def finish(self, newest: int) -> None:
        """The run has ended with ``newest`` rounds in its metrics (0: none): ask for the curves
        unless they were asked for with that round already."""
        if newest and newest != self.shown:
            self.ask(newest)

    def ask(self, rnd: int) -> None:
        self.figures.draw("curves", rounds=self.rounds)
        self.shown, self.asked_at = rnd, self.clock()


def _warm_matplotlib() -> None:
    """Import matplotlib and load its font list, the parts of a first figure that do not depend on it."""
    from matplotlib import font_manager

    from fedlatent.analysis.plots import new_figure
    new_figure(1, 1)
    font_manager.findfont("DejaVu Sans")


def distinct(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each figure request repeated within one run kept once, where it first
    came: drawing a figure again from the same files draws the same thing, and the curves read
    every metrics line written."""
    kept: list[dict[str, Any]] = []
    seen: set[str] = set()
    for message in messages:
        key = json.dumps(message, sort_keys=True)
        if "figure" not in message:
            seen = set()
        elif key in seen:
            continue
        seen.add(key)
        kept.append(message)
    return kept


def _serve(requests: int, replies: int) -> int:
    """The figure process' loop over its runs (``{"run": folder}``, figure requests,
    ``{"end": n}``, answered by ``drawn n``): draw the requests that arrived since the last drawing, each
    once; the curves are brought up to date at every request but their PNG is written only when
    they show the last round, every :data:`REWRITE_SECONDS` before that, and at the run's end.
    0 at the end of input; 1, without an answer, when a figure fails (the run draws it)."""
    renderer: render.Renderer | None = None  # set by each run's first message
    pending, unwritten, written_at = b"", False, time.monotonic()
    try:
        with os.fdopen(replies, "w") as answers:
            while chunk := os.read(requests, 1 << 16):  # blocks until at least one byte; b"" at the end
                *lines, pending = (pending + chunk).split(b"\n")
                for message in distinct([json.loads(line) for line in lines if line]):
                    if "run" in message:
                        renderer = render.Renderer(Path(message["run"]), renderer.curves if renderer else None)
                        unwritten, written_at = False, time.monotonic()
                    elif "end" in message:
                        if unwritten:
                            renderer.write_curves()
                        answers.write(f"drawn {message['end']}\n")
                        answers.flush()
                    elif message["figure"] != "curves":
                        renderer.draw(message["figure"], message["options"])
                    else:
                        complete = renderer.keep_curves(message["options"])
                        unwritten = not (complete or time.monotonic() - written_at > REWRITE_SECONDS)
                        if not unwritten:
                            renderer.write_curves()
                            written_at = time.monotonic()
        return 0
    except BaseException as err:  # noqa: BLE001 - the run finds no answer and draws its figures itself
        print(f"fedlatent figure process: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
