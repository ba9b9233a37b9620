"""Verdicts on a reproduced table: per row, whether fedlatent's numbers agree with the paper's.

Two questions, each asked only where it has an answer:

- **value**: is our mean within the paper's ± std, or within :data:`TOLERANCE_PP` percentage
  points where the paper gives a smaller std or none? Asked only on the paper's own data (the full
  tier): a reduced tier runs other data at another budget, whose numbers are not the paper's.
- **direction**: does (row − its baseline row) have the sign of the paper's (row − baseline)?
  Differences within ± :data:`TIE_PP` count as no difference on both sides, so that a 0.02-point
  gap in the paper is not read as a direction. This is what a reduced tier can show.

Pure functions over numbers in percent, so that the rules are tested without runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import mean

TOLERANCE_PP = 1.0  # percentage points: our mean within this of the paper's counts as reproduced
TIE_PP = 0.5  # percentage points: a difference to the baseline row this small has no sign


@dataclass(frozen=True)
class Compared:
    """One row of a reproduced table, in percent: its labels (the seed aside), the paper's number
    (± its std, where given), ours per seed, the majority-class rate per seed (personalised
    tables) and the runs' status."""

    labels: dict[str, str]
    paper: float | None = None
    paper_std: float | None = None
    ours: list[float] = field(default_factory=list)
    majority: list[float] = field(default_factory=list)
    status: str = ""

    @property
    def mean(self) -> float | None:
        """Our mean over seeds; None before any seed finished."""
        return mean(self.ours) if self.ours else None


@dataclass(frozen=True)
class Verdict:
    """A row's two answers (None: not asked, or a number missing) and a short text for each."""

    value: bool | None
    direction: bool | None
    value_text: str
    direction_text: str


def sign(delta: float, tie: float = TIE_PP) -> int:
    """-1, 0 or +1: the sign of ``delta``, 0 within ± ``tie``."""
    return 0 if abs(delta) <= tie else (1 if delta > 0 else -1)


def baseline_label(label: str, labels: list[str]) -> str | None:
    """The row a row is compared with on its axis: the method without its added term
    (``fedavg+decorr`` → ``fedavg``) where the table has that row, else ``fedavg``, else the axis'
    first label; None for the baseline row itself."""
    bare = label.partition("+")[0]
    base = bare if bare != label and bare in labels else "fedavg" if "fedavg" in labels else labels[0]
    return None if base == label else base


def _value(row: Compared, tolerance: float) -> tuple[bool | None, str]:
    if row.paper is None or row.mean is None:
        return None, "-"
    allowed = max(row.paper_std or 0.0, tolerance)
    delta = row.mean - row.paper
    return abs(delta) <= allowed, f"{delta:+.2f} ({'within' if abs(delta) <= allowed else 'outside'} ±{allowed:.2f})"


def _direction(row: Compared, baseline: Compared | None, tie: float) -> tuple[bool | None, str]:
    if baseline is None or row.mean is None or baseline.mean is None or row.paper is None or baseline.paper is None:
        return None, "-"
    ours, paper = row.mean - baseline.mean, row.paper - baseline.paper
    same = sign(ours, tie) == sign(paper, tie)
    return same, f"{'agrees' if same else 'differs'}: ours {ours:+.2f}, paper {paper:+.2f}"


def verdict(row: Compared, baseline: Compared | None, *, same_data: bool, tolerance: float = TOLERANCE_PP,
            tie: float = TIE_PP) -> Verdict:
    """``row``'s verdict against the paper: its value (only when ``same_data``: the run used the
    paper's data) and its direction relative to ``baseline`` (its baseline row, None for none)."""
    value, value_text = _value(row, tolerance) if same_data else (None, "not asked (other data)")
    direction, direction_text = _direction(row, baseline, tie)
    return Verdict(value, direction, value_text, direction_text)
