"""Figures over many runs: a panel per setting with a curve per method and a min–max band over
seeds, the per-client accuracy distribution of personalised runs, and a reproduced table's numbers
beside the paper's. Inputs are plain lists (the experiment layer reads the run directories)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from fedlatent.analysis.compare import Compared
from fedlatent.analysis.plots import fixed_margins, new_figure, save

Series = tuple[list[int], list[float]]  # rounds, values of one run


def _aligned(runs: list[Series]) -> tuple[np.ndarray, np.ndarray]:
    """The rounds every run reports, and a (runs × rounds) array of their values there."""
    common = sorted(set.intersection(*(set(r) for r, _ in runs)))
    values = np.array([[dict(zip(r, v))[x] for x in common] for r, v in runs], dtype=np.float64)
    return np.array(common), values


Panels = dict[str, dict[str, list[Series]]]  # setting → method → its runs (one per seed)
LINE_STYLES = ["-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 3))]  # one per added term ("+term")
PANEL_INCHES = (3.8, 2.9)
MIN_WIDTH = 6.5  # inches: room for a figure's two-line title above a single panel
MAX_COLUMNS = 3  # panels side by side: ~13 in, which a laptop's browser shows at 85 % (report.html)


def split_term(label: str) -> tuple[str, str]:
    """``"fedavg+decorr"`` → ``("fedavg", "+decorr")``: the method and what is added to it."""
    method, plus, term = label.partition("+")
    return method, plus + term


def method_styles(labels: list[str]) -> dict[str, tuple[tuple[float, ...], Any]]:
    """A colour and a line style per label, the same in every panel. Up to ten methods (the part
    before ``+``): each a hue of tab20, dark as such and light with a term added, so that every
    label has a colour of its own and a method's variants read as one family; each added term
    (``+decorr``) a line style. More methods: one colour per label (tab20, or evenly spaced
    turbo beyond 20)."""
    from matplotlib import colormaps
    parts = [split_term(label) for label in labels]
    methods = list(dict.fromkeys(m for m, _ in parts))
    terms = list(dict.fromkeys(["", *(t for _, t in parts)]))
    tab20 = colormaps["tab20"].colors  # type: ignore[attr-defined]  # a ListedColormap
    if len(methods) <= 10:
        colours = [tab20[2 * methods.index(m) + (1 if t else 0)] for m, t in parts]
    elif len(labels) <= 20:
        colours = list(tab20[:len(labels)])
    else:
        colours = [colormaps["turbo"](x) for x in np.linspace(0.05, 0.95, len(labels))]
    return {label: (tuple(colour), LINE_STYLES[terms.index(t) % len(LINE_STYLES)])
            for label, colour, (_, t) in zip(labels, colours, parts)}


def band_figure(panels: Panels, ylabel: str, title: str, *, logy: bool = False):
    """One panel per setting (the axes that are not the method), in each the mean over seeds of
    every method as a line and the min–max over seeds as a band; one legend for all panels, right
    of them, so that it covers no curve however many cells there are."""
    labels = list(dict.fromkeys(m for methods in panels.values() for m in methods))
    styles = method_styles(labels)
    rows = -(-len(panels) // MAX_COLUMNS)
    columns = -(-len(panels) // rows)  # rows as even as they come: 4 panels as 2 × 2, not 3 + 1
    legend_inches = 0.6 + 0.075 * max(len(label) for label in labels) * (1 + (len(labels) > 24))
    fig = new_figure(max(MIN_WIDTH, columns * PANEL_INCHES[0] + legend_inches + 0.3),
                     rows * (PANEL_INCHES[1] + 0.8) + 0.7)
    axes = fig.subplots(rows, columns, squeeze=False, sharex=True)
    seeds: set[int] = set()
    for ax, (setting, methods) in zip(axes.flat, panels.items()):
        seeds |= _draw_panel(ax, methods, styles, setting, logy)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax in axes.flat[max(0, len(panels) - columns):len(panels)]:  # the lowest panel of each column
        ax.tick_params(axis="x", labelbottom=True)
        ax.set_xlabel("communication round")
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel, fontsize=8)
    n = "/".join(str(k) for k in sorted(seeds))
    handles = [Line2D([], [], color=styles[label][0], linestyle=styles[label][1],  # type: ignore[arg-type]
                      linewidth=1.8) for label in labels]
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1 - (legend_inches - 0.1) / fig.get_figwidth(), 0.5),
               fontsize=8, frameon=False, ncols=1 + (len(labels) > 24), title="method")
    _headed(fig, f"{title}\n(line: mean over seeds, n = {n}; band: min–max over seeds)",
            left=0.7, right=legend_inches, bottom=0.5, wspace=0.3)
    fig.subplots_adjust(hspace=0.8 / PANEL_INCHES[1])
    return fig


def _headed(fig, title: str, **margins: float) -> None:
    """A two-line title in the top inch of ``fig`` and the panels below it (margins in inches), so
    that the title meets no panel's title at any figure height."""
    fig.suptitle(title, fontsize=10, y=1 - 0.08 / fig.get_figheight(), va="top")
    fixed_margins(fig, top=0.95, **margins)


def _draw_panel(ax, methods: dict[str, list[Series]], styles, setting: str, logy: bool) -> set[int]:
    """One setting's curves; returns the numbers of seeds its curves are over."""
    seeds = set()
    for label, runs in methods.items():
        runs = [r for r in runs if r[0]]
        if not runs:
            continue
        rounds, values = _aligned(runs)
        colour, style = styles[label]
        ax.plot(rounds, values.mean(0), color=colour, linestyle=style, linewidth=1.6, label=label,
                marker="." if len(rounds) < 30 else None, markersize=4)
        if len(runs) > 1:
            ax.fill_between(rounds, values.min(0), values.max(0), color=colour, alpha=0.15, linewidth=0)
        seeds.add(len(runs))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if logy:
        ax.set_yscale("log")
    ax.set_title(setting, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    return seeds


def band_plot(panels: Panels, ylabel: str, title: str, path: Path, *, logy: bool = False) -> Path:
    """:func:`band_figure` saved as a PNG at ``path``."""
    return save(band_figure(panels, ylabel, title, logy=logy), path)


ClientPanels = dict[str, dict[str, tuple[list[float], list[float]]]]  # setting → method → (accuracies, baselines)
FIGURE_INCHES = 13.0  # the widest a figure of panels side by side grows before it wraps (as MAX_COLUMNS)


def per_client_figure(panels: ClientPanels):
    """One panel per setting: per method a box of its clients' personalised test accuracy (pooled
    over seeds) in the method's colour (:func:`method_styles`), the clients as dots and the mean
    majority-class rate as a red bar; the method names under each panel."""
    labels = list(dict.fromkeys(m for methods in panels.values() for m in methods))
    styles = method_styles(labels)
    widest = max(len(methods) for methods in panels.values())
    panel_width = max(3.0, 0.5 * widest + 1.0)
    columns = max(1, min(len(panels), int(FIGURE_INCHES // panel_width)))
    rows = -(-len(panels) // columns)
    bottom = 0.3 + 0.045 * max(len(label) for label in labels)  # the rotated method names
    fig = new_figure(max(MIN_WIDTH, columns * panel_width + 0.5), rows * (PANEL_INCHES[1] + bottom + 0.3) + 0.7)
    axes = fig.subplots(rows, columns, squeeze=False, sharey=True)
    for ax, (setting, methods) in zip(axes.flat, panels.items()):
        _client_panel(ax, methods, styles, setting)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("personalised test accuracy\nper client (0–1)", fontsize=8)
    _headed(fig, "Per-client accuracy (dots: clients of every seed; box: quartiles; triangle: mean;\n"
            "red bar: mean majority-class rate)", left=0.8, right=0.2, bottom=bottom, wspace=0.1)
    fig.subplots_adjust(hspace=(bottom + 0.35) / PANEL_INCHES[1])
    return fig


def _client_panel(ax, methods: dict[str, tuple[list[float], list[float]]], styles, setting: str) -> None:
    """One setting's boxes, one per method."""
    labels = list(methods)
    boxes = ax.boxplot([methods[m][0] for m in labels], showmeans=True, patch_artist=True, widths=0.6,
                       medianprops={"color": "k"})
    for box, label in zip(boxes["boxes"], labels):
        box.set_facecolor((*styles[label][0][:3], 0.35))
    for i, label in enumerate(labels, start=1):
        accs, base = methods[label]
        ax.scatter(np.full(len(accs), i) + np.linspace(-0.12, 0.12, len(accs)), accs, s=6, color="k",
                   alpha=min(0.5, 50 / max(len(accs), 1)), zorder=3)
        if base:
            ax.hlines(float(np.mean(base)), i - 0.3, i + 0.3, color="tab:red", linewidth=2)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=45, ha="right", fontsize=7)
    ax.set_title(setting, fontsize=9)
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(axis="y", alpha=0.3)


def per_client_plot(panels: ClientPanels, path: Path) -> Path:
    """:func:`per_client_figure` saved as a PNG at ``path``."""
    return save(per_client_figure(panels), path)


ROW_INCHES = 0.34  # per row of a reproduced table: its two bars and their labels at 8 pt
PAPER_COLOUR, OURS_COLOUR, MAJORITY_COLOUR = "0.62", "tab:blue", "tab:red"


def comparison_figure(rows: list[Compared], title: str, xlabel: str, ours_label: str, paper_label: str = "paper"):
    """A reproduced table as a horizontal bar chart: per row the paper's number (grey) and ours
    (blue), each with its ± std as an error bar, and for personalised tables the majority-class
    rate as a red mark on our bar; a line between settings (the rows' first label). Rows read top
    to bottom in the table's order, labelled by all their labels but the seed."""
    names = [", ".join(row.labels.values()) for row in rows]
    left = 0.4 + 0.062 * max(len(name) for name in names)
    fig = new_figure(max(9.0, left + 6.0), ROW_INCHES * len(rows) + 1.9)
    ax = fig.subplots()
    y = np.arange(len(rows), dtype=float)
    paper = [i for i, row in enumerate(rows) if row.paper is not None]
    ours = [i for i, row in enumerate(rows) if row.ours]
    ax.barh(y[paper] - 0.2, [rows[i].paper for i in paper], 0.38, xerr=[rows[i].paper_std or 0 for i in paper],
            color=PAPER_COLOUR, error_kw={"elinewidth": 1, "capsize": 2}, label=f"{paper_label}, as published (± its std)")
    ax.barh(y[ours] + 0.2, [rows[i].mean for i in ours], 0.38, xerr=[_std(rows[i].ours) for i in ours],
            color=OURS_COLOUR, error_kw={"elinewidth": 1, "capsize": 2}, label=f"{ours_label} (mean ± std over seeds)")
    majority = [i for i in ours if rows[i].majority]
    if majority:
        ax.plot([float(np.mean(rows[i].majority)) for i in majority], y[majority] + 0.2, linestyle="", marker="|",
                markersize=11, markeredgewidth=2.2, color=MAJORITY_COLOUR, label="majority-class rate (mean over seeds)")
    for i, row in enumerate(rows):
        if not row.ours:
            ax.text(1, i + 0.2, f"no result ({row.status})" if row.status else "no result", va="center", fontsize=7,
                    color="0.35")
        if i and next(iter(row.labels.values())) != next(iter(rows[i - 1].labels.values())):
            ax.axhline(i - 0.5, color="0.75", linewidth=0.8)
    ax.set_yticks(y, names, fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, 100)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()  # the bars first, the majority mark last
    order = sorted(range(len(handles)), key=lambda i: isinstance(handles[i], Line2D))
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper center", bbox_to_anchor=(0.5, 1 - 0.62 / fig.get_figheight()), ncols=3, fontsize=8,
               frameon=False)
    _headed(fig, title, left=left, right=0.3, bottom=0.55)
    fig.subplots_adjust(top=1 - 1.0 / fig.get_figheight())
    return fig


def _std(values: list[float]) -> float:
    """The sample std (ddof = 1) of ``values``; 0 for fewer than two, which draws no error bar."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def comparison_plot(rows: list[Compared], title: str, xlabel: str, ours_label: str, paper_label: str,
                    path: Path) -> Path:
    """:func:`comparison_figure` saved as a PNG at ``path``."""
    return save(comparison_figure(rows, title, xlabel, ours_label, paper_label), path)
