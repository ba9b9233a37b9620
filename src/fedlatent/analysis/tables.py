"""Plain-text tables for the terminal."""
from __future__ import annotations

from typing import Any

import numpy as np


def format_table(header: list[str], rows: list[list[Any]]) -> str:
    """Columns padded to their widest cell; floats with 4 decimals."""
    cells = [[f"{c:.4f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in cells])


def partition_table(counts: np.ndarray) -> str:
    """Samples per client × class with row and column totals."""
    header = ["client"] + [str(c) for c in range(counts.shape[1])] + ["total"]
    rows = [[i, *row.tolist(), int(row.sum())] for i, row in enumerate(counts)]
    rows.append(["total", *counts.sum(0).tolist(), int(counts.sum())])
    return format_table(header, rows)


def summary_table(summary: dict[str, Any]) -> str:
    """The final result of one run as a two-column table."""
    final = summary.get("final", {})
    keys = ["accuracy", "balanced_accuracy", "loss", "uncalibrated_accuracy", "personalized_accuracy",
            "personalized_accuracy_std", "personalized_accuracy_worst", "personalized_balanced_accuracy",
            "majority_baseline_accuracy"]
    rows = [[k, final[k]] for k in keys if k in final]
    rows += [["headline", summary.get("headline", "accuracy")],  # the metric the data set is compared by
             ["rounds_completed", summary.get("rounds_completed")],
             ["wall_seconds", float(summary.get("wall_seconds", 0.0))]]
    return format_table(["metric", "value"], rows)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1, as papers report over seeds); std is nan for one value."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else float("nan")


def format_mean_std(values: list[float], scale: float = 1.0, digits: int = 4) -> str:
    """``mean ± std`` of ``values`` × ``scale``; the mean alone for one value, ``-`` for none."""
    if not values:
        return "-"
    mean, std = mean_std([scale * v for v in values])
    return f"{mean:.{digits}f}" + ("" if np.isnan(std) else f" ± {std:.{digits}f}")


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A GitHub markdown table; floats with 4 decimals."""
    cells = [[f"{c:.4f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in cells])


def latex_table(header: list[str], rows: list[list[Any]], caption: str = "") -> str:
    """A booktabs LaTeX table; ``±``, ``_``, ``%`` and ``&`` are escaped."""
    def esc(c: Any) -> str:
        text = f"{c:.4f}" if isinstance(c, float) else str(c)
        for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                     ("±", r"$\pm$")):
            text = text.replace(a, b)
        return text
    lines = [r"\begin{table}[t]", r"\centering", r"\begin{tabular}{" + "l" * len(header) + "}", r"\toprule",
             " & ".join(esc(h) for h in header) + r" \\", r"\midrule"]
    lines += [" & ".join(esc(c) for c in row) + r" \\" for row in rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    if caption:
        lines.append(r"\caption{" + esc(caption) + "}")
    return "\n".join(lines + [r"\end{table}"]) + "\n"
