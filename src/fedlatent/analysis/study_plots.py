"""Figures over many runs: a curve per method with a min–max band over seeds, and the per-client
accuracy distribution of personalised runs. Inputs are plain lists (the experiment layer reads the
run directories)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import MaxNLocator

from fedlatent.analysis.plots import new_figure, save

Series = tuple[list[int], list[float]]  # rounds, values of one run


def _aligned(runs: list[Series]) -> tuple[np.ndarray, np.ndarray]:
    """The rounds every run reports, and a (runs × rounds) array of their values there."""
    common = sorted(set.intersection(*(set(r) for r, _ in runs)))
    values = np.array([[dict(zip(r, v))[x] for x in common] for r, v in runs], dtype=np.float64)
    return np.array(common), values


def band_plot(groups: dict[str, list[Series]], ylabel: str, title: str, path: Path, *,
              logy: bool = False) -> Path:
    """Mean over seeds per group as a line, min–max over seeds as a shaded band."""
    fig = new_figure(7.5, 4.2)
    ax = fig.add_subplot()
    for label, runs in groups.items():
        runs = [r for r in runs if r[0]]
        if not runs:
            continue
        rounds, values = _aligned(runs)
        line, = ax.plot(rounds, values.mean(0), marker="." if len(rounds) < 30 else None,
                        label=f"{label} (n={len(runs)})")
        if len(runs) > 1:
            ax.fill_between(rounds, values.min(0), values.max(0), color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("communication round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.set_title(f"{title}\n(line: mean over seeds; band: min–max over seeds; n = seeds)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.13, top=0.85)
    return save(fig, path)


def per_client_plot(groups: dict[str, tuple[list[float], list[float]]], path: Path) -> Path:
    """Box plot of each client's personalised test accuracy (pooled over seeds) per group, with
    each group's mean majority-class rate as a red bar."""
    labels = list(groups)
    fig = new_figure(max(5.0, 1.1 * len(labels) + 2.5), 4.4)
    ax = fig.add_subplot()
    ax.boxplot([groups[l][0] for l in labels], showmeans=True)
    for i, label in enumerate(labels, start=1):
        accs, base = groups[label]
        ax.scatter(np.full(len(accs), i) + np.linspace(-0.12, 0.12, len(accs)), accs, s=9, color="k", alpha=0.5,
                   zorder=3)
        if base:
            ax.hlines(float(np.mean(base)), i - 0.3, i + 0.3, color="tab:red", linewidth=2,
                      label="majority-class baseline (mean)" if i == 1 else None)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("personalised test accuracy per client (0–1)")
    ax.set_xlabel("method")
    ax.set_title("Per-client accuracy (dots: clients of every seed; box: quartiles; triangle: mean)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    if any(b for _, b in groups.values()):
        ax.legend(fontsize=8, loc="lower right")
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.28, top=0.9)
    return save(fig, path)
