"""What a run shows while it trains: a tqdm bar on a terminal, plain lines on a pipe or a file.

A bar redraws its line with carriage returns, which a log file keeps as one line of dozens of
frames; where stderr is not a terminal the run prints one ordinary line every tenth of its rounds
instead (``fedlatent run --progress`` forces the bar, ``--no-progress`` shows neither).
"""
from __future__ import annotations

import math
import sys
from typing import Any, Protocol

LINES_PER_RUN = 10  # plain lines: one every ceil(rounds / 10) rounds, and the last round


class Progress(Protocol):
    def update_line(self, line: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def shown(line: dict[str, Any]) -> dict[str, str]:
    """A metrics line's training loss (of the clients' local steps), the global model's test accuracy
    and, in a private run, ε at δ so far (client-level ``eps``, sample-level ``sample_eps``)."""
    out = {"train_loss": f"{line['train_loss']:.3f}" if line.get("train_loss") is not None else "-"}
    if "test_accuracy" in line:
        out["test_acc"] = f"{line['test_accuracy']:.3f}"
    for key, label in (("privacy_epsilon", "eps"), ("sample_level_epsilon", "sample_eps")):  # a private run's ε so far
        if line.get(key) is not None:
            out[label] = f"{line[key]:.3g}" if line[key] < 1e4 else f"{line[key]:.2e}"
    return out


class Bar:
    """A tqdm bar over rounds showing the latest training loss and test accuracy."""

    def __init__(self, total: int, desc: str) -> None:
        from tqdm.auto import tqdm
        self.bar = tqdm(total=total, desc=desc, unit="round", dynamic_ncols=True)

    def update_line(self, line: dict[str, Any]) -> None:
        self.bar.n = line["round"]
        self.bar.set_postfix(shown(line))
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


class Lines:
    """One plain line on stderr every ``ceil(total / LINES_PER_RUN)`` rounds and at the last round."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc = total, desc
        self.every = math.ceil(total / LINES_PER_RUN)

    def update_line(self, line: dict[str, Any]) -> None:
        rnd = line["round"]
        if rnd % self.every == 0 or rnd == self.total:
            values = ", ".join(f"{k} {v}" for k, v in shown(line).items())
            print(f"{self.desc}: round {rnd}/{self.total}, {values}", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def progress(mode: bool | str | None, total: int, desc: str) -> Progress | None:
    """The display for ``mode``: ``"bar"`` (or True), ``"lines"``, ``"auto"`` (the bar when stderr is
    a terminal, else lines), or none (False, None)."""
    if mode == "auto":
        mode = "bar" if sys.stderr.isatty() else "lines"
    if mode is True or mode == "bar":
        return Bar(total, desc)
    if mode == "lines":
        return Lines(total, desc)
    return None
