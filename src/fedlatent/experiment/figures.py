"""The run's figures, drawn beside the training instead of after it.

On the digits workload the two figures cost about as much as all 20 rounds of training
(matplotlib's import, ~100 cell labels and PNG encoding: ~0.25 s against ~0.3 s of training, warm).
:class:`FigureWorker` forks a child when the run starts; the child draws the partition heatmap on
the other core while the run trains, then keeps the learning curves current: the run asks for
them after every metrics line, and the child draws only the new points
(:class:`fedlatent.analysis.plots.LearningCurves`, ~1 ms), writing ``curves.png`` (~8 ms) when it
shows the last round and every :data:`REWRITE_SECONDS` before (a killed run keeps recent curves).
Requests that queued while the child was busy are drawn once (the curves read the whole metrics
file anyway), so the child never falls behind by more than one drawing, and what is left on the
run's path after its last round is the wait for that last drawing and its PNG. Requests travel one JSON line each through
a pipe; the child ends at the end of input, also when the run is killed. Where ``fork`` is
unavailable, or the child fails, the figures are drawn in this process, so nothing is lost. The
child touches no torch state and leaves through ``os._exit``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from fedlatent.analysis import render

REWRITE_SECONDS = 2.0  # how stale the child lets curves.png get while a run trains



class FigureWorker:
    """Draws the figures of the run in ``run_dir``: in a forked child, or in-process as a fallback."""

    def __init__(self, run_dir: Path, *, background: bool = True) -> None:
        self.run_dir = run_dir
        self.requests: list[dict[str, Any]] = []
        self.child_pid = 0
        self.pipe: Any = None
        if background and sys.platform.startswith("linux"):
            _warm_matplotlib()  # once per process: every later child starts with it imported
            read_end, write_end = os.pipe()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child
                os.close(write_end)
                os._exit(_serve(run_dir, read_end))
            os.close(read_end)
            self.child_pid, self.pipe = pid, os.fdopen(write_end, "w")

    def draw(self, figure: str, **options: Any) -> None:
        """Ask for ``figure`` (see :data:`fedlatent.analysis.render.FIGURES`) once the files it
        reads are written."""
        request = {"figure": figure, "options": options}
        self.requests.append(request)
        if self.pipe is not None:
            try:
                self.pipe.write(json.dumps(request) + "\n")
                self.pipe.flush()
            except OSError:  # the child has gone: close() draws in-process
                pass

    def close(self) -> None:
        """Wait until every requested figure is on disk; draw in-process whatever the child could not
        (each distinct request once)."""
        if self.pipe is not None:
            try:
                self.pipe.close()
            except OSError:
                pass
            _, status = os.waitpid(self.child_pid, 0)
            self.pipe = None
            if os.waitstatus_to_exitcode(status) == 0:
                return
            print("fedlatent: the figure process failed; drawing the figures in-process", file=sys.stderr)
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


def _warm_matplotlib() -> None:
    """Import matplotlib and load its font list, the parts of a first figure that do not depend on it."""
    from matplotlib import font_manager

    from fedlatent.analysis.plots import new_figure
    new_figure(1, 1)
    font_manager.findfont("DejaVu Sans")


def distinct(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``requests`` with each repeated one kept once, where it first came: drawing a figure again
    from the same files draws the same thing, and the curves read every metrics line written."""
    return list({json.dumps(r, sort_keys=True): r for r in requests}.values())


def _serve(run_dir: Path, read_end: int) -> int:
    """The child's loop: draw the requests that arrived since the last drawing, each once; the
    curves are brought up to date at every request but their PNG is written only when they show
    the last round, every :data:`REWRITE_SECONDS` before that, and at the end of input; 0 when all
    were drawn."""
    renderer = render.Renderer(run_dir)
    pending, unwritten, written_at = b"", False, time.monotonic()
    try:
        while chunk := os.read(read_end, 1 << 16):  # blocks until at least one byte; b"" at the end
            *lines, pending = (pending + chunk).split(b"\n")
            for request in distinct([json.loads(line) for line in lines if line]):
                if request["figure"] != "curves":
                    renderer.draw(request["figure"], request["options"])
                    continue
                complete = renderer.keep_curves(request["options"])
                unwritten = not (complete or time.monotonic() - written_at > REWRITE_SECONDS)
                if not unwritten:
                    renderer.write_curves()
                    written_at = time.monotonic()
        if unwritten:
            renderer.write_curves()
        return 0
    except BaseException as err:  # noqa: BLE001 - reported by the exit status; the parent redraws
        print(f"fedlatent figure process: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
