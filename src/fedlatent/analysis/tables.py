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
            "personalized_accuracy_std", "personalized_accuracy_worst", "majority_baseline_accuracy"]
    rows = [[k, final[k]] for k in keys if k in final]
    rows += [["rounds_completed", summary.get("rounds_completed")],
             ["wall_seconds", float(summary.get("wall_seconds", 0.0))]]
    return format_table(["metric", "value"], rows)
