"""Figures saved with a run: the partition heatmap (as in FedUV's supplement) and learning curves.

Drawn on :class:`matplotlib.figure.Figure` objects with the Agg canvas, not through pyplot: no
global figure registry (safe in a forked child, nothing to close) and no ``tight_layout`` pass
(margins are fixed in inches instead, which costs nothing and keeps labels inside the canvas).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

DPI = 110


def new_figure(width: float, height: float):
    """An Agg figure of ``width`` × ``height`` inches."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def fixed_margins(fig, *, left: float = 0.75, right: float = 0.2, bottom: float = 0.55, top: float = 0.35,
                  wspace: float = 0.35) -> None:
    """Margins in inches (room for tick labels, axis labels and a title), without a layout pass."""
    width, height = fig.get_size_inches()
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height,
                        top=1 - top / height, wspace=wspace)


def save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def partition_heatmap(counts: np.ndarray, path: Path, title: str = "") -> Path:
    """Client × class sample counts as a heatmap with the counts written in the cells."""
    clients, classes = counts.shape
    fig = new_figure(max(4.5, 0.5 * classes + 2.5), max(3.0, 0.35 * clients + 1.5))
    ax = fig.add_subplot()
    image = ax.imshow(counts, aspect="auto", cmap="Blues")
    if clients * classes <= 400:
        for (i, j), v in np.ndenumerate(counts):
            ax.text(j, i, str(int(v)), ha="center", va="center", fontsize=6,
                    color="white" if v > counts.max() / 2 else "black")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title or "samples per client and class", fontsize=10)
    fig.colorbar(image, ax=ax, label="training samples (count)")
    fixed_margins(fig, right=0.1)
    return save(fig, path)


def learning_curves(metrics: list[dict[str, Any]], path: Path) -> Path:
    """Test accuracy and training loss over rounds."""
    fig = new_figure(9, 3.2)
    left, right = fig.subplots(1, 2)
    evaluated = [m for m in metrics if "test_accuracy" in m]
    left.plot([m["round"] for m in evaluated], [m["test_accuracy"] for m in evaluated], marker=".")
    left.set_xlabel("round")
    left.set_ylabel("test accuracy (global model)")
    right.plot([m["round"] for m in metrics], [m["train_loss"] for m in metrics], marker=".")
    right.set_xlabel("round")
    right.set_ylabel("mean local training loss")
    from matplotlib.ticker import MaxNLocator
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fixed_margins(fig, top=0.15)
    return save(fig, path)
