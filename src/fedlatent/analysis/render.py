"""Draw one of a run's figures from the files the run has written (``partition.json``,
``metrics.jsonl``, ``diagnostics.jsonl``), so that any process can draw it: the run itself, or the
child process that draws its figures beside the training (``fedlatent.experiment.figures``)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedlatent.analysis.diagnostic_plots import plot_diagnostics
from fedlatent.analysis.plots import learning_curves, partition_heatmap

FIGURES = ("partition", "curves", "diagnostics")


def draw(run_dir: Path, figure: str, options: dict) -> Path | list[Path]:
    """Draw ``figure`` (one of :data:`FIGURES`) of the run in ``run_dir`` into its ``plots/``."""
    if figure == "partition":
        counts = np.asarray(json.loads((run_dir / "partition.json").read_text())["counts"])
        return partition_heatmap(counts, run_dir / "plots" / "partition.png", options.get("title", ""))
    if figure == "curves":
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return learning_curves([json.loads(line) for line in lines if line], run_dir / "plots" / "curves.png")
    if figure == "diagnostics":
        return plot_diagnostics([run_dir], run_dir / "plots")
    raise ValueError(f"unknown figure {figure!r}; known: {', '.join(FIGURES)}")
