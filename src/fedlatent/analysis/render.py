"""Draw one of a run's figures from the files the run has written (``partition.json``,
``metrics.jsonl``, ``diagnostics.jsonl``), so that any process can draw it: the run itself, or the
child process that draws its figures beside the training (``fedlatent.experiment.runner.figures``), which
keeps one :class:`Renderer` for the whole run so that the learning curves, redrawn as the run
asks for them, stay open between drawings."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedlatent.analysis.diagnostic_plots import plot_diagnostics
from fedlatent.analysis.plots import LearningCurves, partition_heatmap

FIGURES = ("partition", "curves", "diagnostics")


def draw(run_dir: Path, figure: str, options: dict) -> Path | list[Path]:
    """Draw ``figure`` (one of :data:`FIGURES`) of the run in ``run_dir`` into its ``plots/``."""
    return Renderer(run_dir).draw(figure, options)


class Renderer:
    """Draws the figures of the run in ``run_dir``; the learning curves stay open between drawings,
    so that drawing them again after one more round costs the new points and the PNG
    (:class:`fedlatent.analysis.plots.LearningCurves`)."""

    def __init__(self, run_dir: Path, curves: LearningCurves | None = None) -> None:
        """``curves``: an earlier run's learning curves to draw this run's on (a process drawing
        run after run, :mod:`fedlatent.experiment.runner.figures`): with the same planned rounds and
        axis limits, this run's first drawing is a blit onto their background, not a full draw
        (~30 ms of text layout); the pixels are the same either way."""
        self.run_dir = run_dir
        self.curves = curves

    def draw(self, figure: str, options: dict) -> Path | list[Path]:
        """Draw ``figure`` (one of :data:`FIGURES`) into the run's ``plots/``; ``curves`` take the
        option ``rounds`` (the planned number of rounds: the x-axis' extent)."""
        plots = self.run_dir / "plots"
        if figure == "partition":
            counts = np.asarray(json.loads((self.run_dir / "partition.json").read_text())["counts"])
            return partition_heatmap(counts, plots / "partition.png", options.get("title", ""))
        if figure == "curves":
            self.keep_curves(options)
            return self.write_curves()
        if figure == "diagnostics":
            return plot_diagnostics([self.run_dir], plots)
        raise ValueError(f"unknown figure {figure!r}; known: {', '.join(FIGURES)}")

    def keep_curves(self, options: dict) -> bool:
        """Bring the learning curves on their canvas up to date with ``metrics.jsonl`` without
        writing them (options as for :meth:`draw`); True once they show the planned last round."""
        if self.curves is None or self.curves.rounds != options.get("rounds"):
            self.curves = LearningCurves(options.get("rounds"))
        metrics = self._metrics()
        self.curves.update(metrics)
        self.curves.render()
        return bool(metrics) and metrics[-1]["round"] == options.get("rounds")

    def write_curves(self) -> Path:
        """Write the curves as :meth:`keep_curves` last drew them to ``plots/curves.png``."""
        if self.curves is None:
            raise RuntimeError("write_curves before keep_curves: no curves drawn")
        return self.curves.write(self.run_dir / "plots" / "curves.png")

    def _metrics(self) -> list[dict]:
        """The complete lines of ``metrics.jsonl``: the run may be writing the next one right now
        (the curves are drawn while it trains), so a last line without its newline is left out."""
        path = self.run_dir / "metrics.jsonl"
        text = path.read_text() if path.is_file() else ""
        complete = text[:text.rfind("\n") + 1]
        return [json.loads(line) for line in complete.splitlines() if line]
