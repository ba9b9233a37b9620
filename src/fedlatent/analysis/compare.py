"""Verdicts on a reproduced table: per row, whether fedlatent's numbers agree with the paper's.

Two questions, each asked only where it has an answer:

- **value**: is our mean within the paper's ± std, or within :data:`TOLERANCE_PP` percentage
  points where the paper gives a smaller std or none? Asked only on the paper's own data (the full
  tier): a reduced tier runs other data at another budget, whose numbers are not the paper's.
- **direction**: does (row − its baseline row) have the sign of the paper's (row − baseline)?
  Differences within ± :data:`TIE_PP` count as no difference on both sides, so that a 0.02-point
  gap in the paper is not read as a direction. This is what a reduced tier can show.
- **paired**: how strongly the per-seed paired differences (row − baseline row, cells of one seed
  sharing the data) carry a claimed direction, by :func:`paired_verdict` — the one rule every
  verdict of ``results/`` and the paired column of ``fedlatent report`` follow.

Pure functions over numbers in percent, so that the rules are tested without runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence
from statistics import mean, stdev

TOLERANCE_PP = 1.0  # percentage points: our mean within this of the paper's counts as reproduced
TIE_PP = 0.5  # percentage points: a difference to the baseline row this small has no sign


HOLDS = "holds"
DIRECTION_ONLY = "direction only"
UNRESOLVED = "unresolved"
REVERSE_HOLDS = "the reverse holds"
DID_NOT_TRAIN = "did not train at this budget"
VERDICTS = (HOLDS, DIRECTION_ONLY, UNRESOLVED, REVERSE_HOLDS, DID_NOT_TRAIN)
NOT_JUDGED = "not judged"  # the paired column where the paper itself shows no direction: no claim to judge


def did_train(ends: Sequence[float], floor: float) -> bool:
    """Whether every run a claim compares left its floor: ``ends`` are their final accuracies,
    ``floor`` the higher of chance and the clients' majority-class rate (same unit). A run that ends
    at or below it did not train at this budget, and a difference against it is evidence for nothing."""
    return all(end > floor for end in ends)


def paired_verdict(differences: Sequence[float], direction: int = 1, *, trained: bool = True) -> str:
    """The verdict on a claim that a method moves a metric in ``direction`` (+1 up, −1 down)
    against its baseline, from the per-seed paired differences (method − baseline, one per seed):

    - ``holds``: every difference has the claimed sign (a zero has none) and |mean| exceeds the
      sample standard deviation (ddof = 1): the mean is more than one spread away from zero;
    - ``the reverse holds``: the same, in the other direction: every seed has the opposite sign and
      |mean| exceeds the spread;
    - ``direction only``: the mean has the claimed sign, but a seed disagrees (or ties at zero)
      or the spread covers zero (|mean| ≤ std);
    - ``unresolved``: anything else: a mean of the other sign without every seed agreeing, a zero
      mean, a single seed (no spread) or none;
    - ``did not train at this budget``: ``trained`` is False (see :func:`did_train`), whatever the
      differences say.

    There is no significance test: three seeds, the usual count here, give a t-test little power,
    and "mean beyond one std with every seed agreeing" is a rule a reader can check by eye.
    """
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, not {direction!r}")
    if not trained:
        return DID_NOT_TRAIN
    if len(differences) < 2:
        return UNRESOLVED
    signed = [direction * d for d in differences]
    centre, spread = mean(signed), stdev(signed)
    if min(signed) > 0 and centre > spread:
        return HOLDS
    if max(signed) < 0 and -centre > spread:
        return REVERSE_HOLDS
    return DIRECTION_ONLY if centre > 0 else UNRESOLVED


def paired_text(differences: Sequence[float], direction: int = 1) -> str:
    """The verdict with its numbers: ``holds: +4.00 ± 0.50, 3/3 seeds +``."""
    found = paired_verdict(differences, direction)
    if not differences:
        return f"{found}: no paired seeds"
    spread = f" ± {stdev(differences):.2f}" if len(differences) > 1 else ""
    agree = sum(direction * d > 0 for d in differences)
    return (f"{found}: {mean(differences):+.2f}{spread}, {agree}/{len(differences)} seeds "
            f"{'+' if direction > 0 else '−'}")


@dataclass(frozen=True)
class Compared:
    """One row of a reproduced table, in percent: its labels (the seed aside), the paper's number
    (± its std, where given), ours per seed, the majority-class rate per seed (personalised
    tables), the runs' status and the seed of each of ``ours`` (for pairing with the baseline row;
    empty where not known)."""

    labels: dict[str, str]
    paper: float | None = None
    paper_std: float | None = None
    ours: list[float] = field(default_factory=list)
    majority: list[float] = field(default_factory=list)
    status: str = ""
    seeds: list[str] = field(default_factory=list)

    @property
    def mean(self) -> float | None:
        """Our mean over seeds; None before any seed finished."""
        return mean(self.ours) if self.ours else None


@dataclass(frozen=True)
class Verdict:
    """A row's answers (None: not asked, or a number missing) and a short text for each; ``paired``
    is :func:`paired_verdict` in the paper's direction ("" where not asked)."""

    value: bool | None
    direction: bool | None
    value_text: str
    direction_text: str
    paired: str = ""
    paired_text: str = "-"


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


def paired_differences(row: Compared, baseline: Compared) -> list[float]:
    """(row − baseline) per seed, over the seeds both rows finished, in seed order."""
    base = dict(zip(baseline.seeds, baseline.ours))
    return [value - base[seed] for seed, value in sorted(zip(row.seeds, row.ours)) if seed in base]


def _paired(row: Compared, baseline: Compared | None, tie: float) -> tuple[str, str]:
    if baseline is None or row.paper is None or baseline.paper is None:
        return "", "-"
    claimed = sign(row.paper - baseline.paper, tie)
    if claimed == 0:
        return NOT_JUDGED, f"{NOT_JUDGED}: the paper shows no difference (within ±{tie:g})"
    differences = paired_differences(row, baseline)
    return paired_verdict(differences, claimed), paired_text(differences, claimed)


def verdict(row: Compared, baseline: Compared | None, *, same_data: bool, tolerance: float = TOLERANCE_PP,
            tie: float = TIE_PP) -> Verdict:
    """``row``'s verdict against the paper: its value (only when ``same_data``: the run used the
    paper's data), its direction relative to ``baseline`` (its baseline row, None for none) and the
    paired verdict on the paper's direction."""
    value, value_text = _value(row, tolerance) if same_data else (None, "not asked (other data)")
    direction, direction_text = _direction(row, baseline, tie)
    return Verdict(value, direction, value_text, direction_text, *_paired(row, baseline, tie))
