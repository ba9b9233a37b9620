"""Draw one of a run's figures from the files the run has written (``partition.json``,
``metrics.jsonl``, ``diagnostics.jsonl``), so that any process can draw it: the run itself, or the
child process that draws its figures beside the training (``fedlatent.experiment.figures``), which
keeps a :class:`Renderer` to prepare the learning curves before the run's last round."""
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
    """Draws the figures of the run in ``run_dir``; the learning curves, once prepared, stay open,
    so that drawing them after the last round costs one redraw."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.curves: LearningCurves | None = None

    def prepare_curves(self) -> None:
        """Build the learning curves from the rounds written so far (none yet is fine) and draw
        them once off-screen, while the run still trains."""
        self.curves = self.curves or LearningCurves()
        self.curves.update(self._metrics())
        self.curves.render()

    def draw(self, figure: str, options: dict) -> Path | list[Path]:
        """Draw ``figure`` (one of :data:`FIGURES`) into the run's ``plots/``."""
        plots = self.run_dir / "plots"
        if figure == "partition":
            counts = np.asarray(json.loads((self.run_dir / "partition.json").read_text())["counts"])
            return partition_heatmap(counts, plots / "partition.png", options.get("title", ""))
        if figure == "curves":
            curves = self.curves or LearningCurves()
            curves.update(self._metrics())
            return curves.save(plots / "curves.png")
        if figure == "diagnostics":
            return plot_diagnostics([self.run_dir], plots)
        raise ValueError(f"unknown figure {figure!r}; known: {', '.join(FIGURES)}")

    def _metrics(self) -> list[dict]:
        """The complete lines of ``metrics.jsonl``: the run may be writing the next one right now
        (curves are prepared while it trains), so a last line without its newline is left out."""
        path = self.run_dir / "metrics.jsonl"
        text = path.read_text() if path.is_file() else ""
        complete = text[:text.rfind("\n") + 1]
        return [json.loads(line) for line in complete.splitlines() if line]
