"""Figures saved with a run: the partition heatmap (as in FedUV's supplement) and learning curves.

Drawn on :class:`matplotlib.figure.Figure` objects with the Agg canvas, not through pyplot: no
global figure registry (safe in a forked child, nothing to close) and no ``tight_layout`` pass
(margins are fixed in inches instead, which costs nothing and keeps labels inside the canvas).
The run's own two figures are drawn at :data:`DPI` and their PNG is encoded from the canvas'
pixels (:func:`write_png`), not through ``savefig``, which would draw everything again.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from fedlatent.analysis import png

DPI = 110
TEXT_CELLS = 400  # up to this many heatmap cells carry their count as text
PLAIN_HEATMAP_INCHES = (9.0, 6.0)  # at most this wide and tall when the cells carry no text


def new_figure(width: float, height: float):
    """An Agg figure of ``width`` × ``height`` inches, drawn at :data:`DPI`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def fixed_margins(fig, *, left: float = 0.75, right: float = 0.2, bottom: float = 0.55, top: float = 0.35,
                  wspace: float = 0.35) -> None:
    """Margins in inches (room for tick labels, axis labels and a title), without a layout pass."""
    width, height = fig.get_size_inches()
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height,
                        top=1 - top / height, wspace=wspace)


def save(fig, path: Path) -> Path:
    """PNG at :data:`DPI`; zlib level 1, not Pillow's default 6: the same pixels (PNG is lossless) in
    a file ~15 % larger, ~15 ms less per figure of a run (a fifth of the heatmap's encoding)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, pil_kwargs={"compress_level": 1})
    return path


def write_png(fig, path: Path) -> Path:
    """The pixels now on ``fig``'s canvas as a PNG (:func:`fedlatent.analysis.png.encode`), written to
    a temporary file and renamed, so that ``path`` always holds a whole image (the curves are
    rewritten every round, and a run may be killed at any moment)."""
    pixels = np.asarray(fig.canvas.buffer_rgba())
    return _write_atomically(path, png.encode(pixels, DPI))


def _write_atomically(path: Path, data: bytes) -> Path:
    """``data`` to ``path`` through a temporary file renamed into place (as :func:`write_png`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)
    return path


HEATMAPS_KEPT = 8  # the last heatmaps' PNG bytes a process keeps (runs of a sweep share partitions)
_heatmaps: dict[tuple, bytes] = {}


def partition_heatmap(counts: np.ndarray, path: Path, title: str = "") -> Path:
    """Client × class sample counts as a heatmap, the counts written in the cells up to
    :data:`TEXT_CELLS` cells. Without text a cell needs no room for it: the figure is at most
    :data:`PLAIN_HEATMAP_INCHES` (100 clients: 6 in, not 36.5 in, i.e. ~6 pixel rows a client), which
    keeps every client visible and the tick labels at their size, at a sixth of the pixels to encode.

    A heatmap of the same counts and title as one of the last :data:`HEATMAPS_KEPT` this process drew
    is written from that one's PNG bytes (the same pixels: the drawing is deterministic), not drawn
    again: the runs of a sweep that differ in the method share their partition, and the ~90 ms of
    text layout of a 10 × 10 heatmap is longer than a whole digits run's training."""
    key = (counts.shape, counts.dtype.str, counts.tobytes(), title)
    if key in _heatmaps:
        return _write_atomically(path, _heatmaps[key])
    clients, classes = counts.shape
    texts = clients * classes <= TEXT_CELLS
    width, height = max(4.5, 0.5 * classes + 2.5), max(3.0, 0.35 * clients + 1.5)
    if not texts:
        width, height = min(width, PLAIN_HEATMAP_INCHES[0]), min(height, PLAIN_HEATMAP_INCHES[1])
    fig = new_figure(width, height)
    ax = fig.add_subplot()
    image = ax.imshow(counts, aspect="auto", cmap="Blues")
    if texts:
        for (i, j), v in np.ndenumerate(counts):
            ax.text(j, i, str(int(v)), ha="center", va="center", fontsize=6,
                    color="white" if v > counts.max() / 2 else "black")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title or "samples per client and class", fontsize=10)
    fig.colorbar(image, ax=ax, label="training samples (count)")
    fixed_margins(fig, right=0.1)
    fig.canvas.draw()
    write_png(fig, path)
    _heatmaps[key] = path.read_bytes()
    while len(_heatmaps) > HEATMAPS_KEPT:
        del _heatmaps[next(iter(_heatmaps))]  # the oldest
    return path


ACCURACY_LIMITS = (-0.03, 1.03)  # [0, 1] and room for a marker at either end (clear of the spines)


class LearningCurves:
    """The learning-curves figure (test accuracy and training loss over rounds), kept open and
    redrawn as rounds arrive, so that after the last round only the new points are left to draw.

    The axes change only when the data leave them, which a training run rarely does: the x-axis
    spans the planned ``rounds`` from the start, accuracy the whole [0, 1] and the loss runs from 0
    to its largest value so far (usually the first round's) snapped up to a tick value
    (matplotlib's ``axes.autolimit_mode = "round_numbers"``). Fitted to the data instead, a slowly
    improving run changed its limits at 18 of 20 rounds (the 100-client digits workload). The two
    lines are animated artists: a full draw (:meth:`render` when the limits changed, ~30 ms of text
    layout on the digits workload) paints everything else and keeps it as a background; otherwise the background is restored and only the lines are drawn on it
    (blitting, ~1 ms). Either way the pixels are those of a full draw of the same data (tested)."""

    def __init__(self, rounds: int | None = None) -> None:
        from matplotlib.ticker import MaxNLocator
        self.rounds = rounds
        self.fig = new_figure(9, 3.2)
        left, right = self.axes = tuple(self.fig.subplots(1, 2))
        (self.accuracy,) = left.plot([], [], marker=".", animated=True)
        left.set_xlabel("round")
        left.set_ylabel("test accuracy (global model)")
        (self.loss,) = right.plot([], [], marker=".", animated=True)
        right.set_xlabel("round")
        right.set_ylabel("mean local training loss")
        for ax in self.axes:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fixed_margins(self.fig, top=0.15)
        self.background: Any = None
        self.drawn_limits: tuple = ()

    def update(self, metrics: list[dict[str, Any]]) -> None:
        """Show ``metrics`` (the metrics lines so far): x over the planned rounds (or the rounds
        shown, if more), accuracy over [0, 1], the loss from 0 (or its least value, if negative)
        to a tick value above its largest."""
        import matplotlib
        evaluated = [m for m in metrics if "test_accuracy" in m]
        self.accuracy.set_data(_floats(m["round"] for m in evaluated), _floats(m["test_accuracy"] for m in evaluated))
        self.loss.set_data(_floats(m["round"] for m in metrics), _floats(m["train_loss"] for m in metrics))
        last = max([self.rounds or 1, *(m["round"] for m in metrics)])
        pad = max(0.5, 0.05 * (last - 1))  # matplotlib's default 5 % margin, half a round at least
        for ax in self.axes:
            ax.set_xlim(1 - pad, last + pad)
        self.axes[0].set_ylim(*ACCURACY_LIMITS)
        loss_axes = self.axes[1]
        loss_axes.relim()
        loss_axes.update_datalim([(1.0, 0.0)])  # the loss axis starts at 0
        with matplotlib.rc_context({"axes.autolimit_mode": "round_numbers"}):
            loss_axes.autoscale_view(scalex=False)
        losses = self.loss.get_ydata()
        if not np.any(np.asarray(losses) < 0):  # the margin below 0 shows nothing
            loss_axes.set_ylim(bottom=0.0, auto=None)  # still autoscaled at the next update

    def render(self) -> None:
        """Bring the canvas up to date: a full draw when the axes' limits differ from the last
        one's, else the lines blitted onto its background."""
        canvas = self.fig.canvas
        limits = tuple((ax.get_xlim(), ax.get_ylim()) for ax in self.axes)
        if self.background is None or limits != self.drawn_limits:
            canvas.draw()  # all but the animated lines
            self.background, self.drawn_limits = canvas.copy_from_bbox(self.fig.bbox), limits
        else:
            canvas.restore_region(self.background)
        for line in (self.accuracy, self.loss):
            line.axes.draw_artist(line)

    def write(self, path: Path) -> Path:
        """The PNG of the canvas as :meth:`render` left it."""
        return write_png(self.fig, path)

    def save(self, path: Path) -> Path:
        """Render and write the PNG."""
        self.render()
        return self.write(path)


def _floats(values) -> np.ndarray:
    """Values as floats, a missing one (a round that kept no client has no loss) as NaN: a gap."""
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
