"""Figures saved with a run: the partition heatmap (as in FedUV's supplement) and learning curves."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def partition_heatmap(counts: np.ndarray, path: Path, title: str = "") -> Path:
    """Client × class sample counts as a heatmap with the counts written in the cells."""
    plt = _pyplot()
    clients, classes = counts.shape
    fig, ax = plt.subplots(figsize=(max(4, 0.5 * classes + 2), max(3, 0.35 * clients + 1.5)))
    image = ax.imshow(counts, aspect="auto", cmap="Blues")
    if clients * classes <= 400:
        for (i, j), v in np.ndenumerate(counts):
            ax.text(j, i, str(int(v)), ha="center", va="center", fontsize=6,
                    color="white" if v > counts.max() / 2 else "black")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title or "samples per client and class")
    fig.colorbar(image, ax=ax, label="samples (count)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def learning_curves(metrics: list[dict[str, Any]], path: Path) -> Path:
    """Test accuracy and training loss over rounds."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    evaluated = [m for m in metrics if "test_accuracy" in m]
    left.plot([m["round"] for m in evaluated], [m["test_accuracy"] for m in evaluated], marker=".")
    left.set_xlabel("round")
    left.set_ylabel("test accuracy (global model)")
    right.plot([m["round"] for m in metrics], [m["train_loss"] for m in metrics], marker=".")
    right.set_xlabel("round")
    right.set_ylabel("mean local training loss")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
