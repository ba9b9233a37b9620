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


# up to this many clients the terminal shows every client's row; beyond, a summary (the full
# table stays in the run directory's partition.txt / partition.json)
FULL_TABLE_CLIENTS = 20
WORST_SHOWN = 5  # the clients a per-client summary names


def partition_table(counts: np.ndarray) -> str:
    """Samples per client × class with row and column totals; the first header cell names both
    axes (``client\\class``: a client per row, a class per column)."""
    header = ["client\\class"] + [str(c) for c in range(counts.shape[1])] + ["total"]
    rows = [[i, *row.tolist(), int(row.sum())] for i, row in enumerate(counts)]
    rows.append(["total", *counts.sum(0).tolist(), int(counts.sum())])
    return format_table(header, rows)


def partition_summary(counts: np.ndarray) -> str:
    """The partition in a few lines for any number of clients: samples and classes per client
    (min / median / max) and the skew, the mean over clients of the largest class's share of the
    client's samples (1/classes: every client balanced; 1: every client holds one class)."""
    samples = counts.sum(1)
    classes = (counts > 0).sum(1)
    held = samples > 0
    share = counts[held].max(1) / samples[held] if held.any() else np.zeros(0)
    rows = [["samples per client", *_spread(samples)], ["classes per client", *_spread(classes)]]
    skew = (f"skew: largest class share per client, mean {share.mean():.2f} "
            f"(balanced {1 / counts.shape[1]:.2f}, one class each 1.00)" if share.size else "skew: -")
    empty = int((~held).sum())
    return "\n".join([f"{len(counts)} clients, {counts.shape[1]} classes, {int(samples.sum())} training samples",
                      format_table(["", "min", "median", "max"], rows), skew]
                     + ([f"{empty} client(s) hold no training sample"] if empty else []))


def _spread(values: np.ndarray) -> list[Any]:
    """Min, median and max of per-client counts (a median halfway between two counts as ``x.5``)."""
    return [int(values.min()), f"{float(np.median(values)):g}", int(values.max())]


def partition_overview(counts: np.ndarray, full: str = "partition.txt and partition.json") -> str:
    """What the terminal shows of a partition: every client's row up to :data:`FULL_TABLE_CLIENTS`
    clients, else :func:`partition_summary` and where the full table is (``full``)."""
    if len(counts) <= FULL_TABLE_CLIENTS:
        return partition_table(counts)
    return f"{partition_summary(counts)}\nfull table (client × class): {full}"


def per_client_table(rows: list[dict[str, Any]]) -> str:
    """A personalised run's per-client results: every client up to :data:`FULL_TABLE_CLIENTS`
    clients; beyond, the distribution over clients (mean, std, quartiles, deciles) and the
    :data:`WORST_SHOWN` clients of lowest accuracy, so that 1,000 clients stay a screenful."""
    keys = [k for k in ("accuracy", "balanced_accuracy", "majority_baseline", "val_accuracy")
            if all(k in r for r in rows)]
    def clients(shown: list[dict[str, Any]]) -> str:
        return format_table(["client", *keys], [[r["client"], *(float(r[k]) for k in keys)] for r in shown])
    if len(rows) <= FULL_TABLE_CLIENTS:
        return clients(rows)
    values = np.array([[float(r[k]) for k in keys] for r in rows])
    # over the clients themselves (ddof = 0, as personalized_accuracy_std); nan (no such value) left out
    stats = [["mean", *np.nanmean(values, 0)], ["std", *np.nanstd(values, 0)], ["min", *np.nanmin(values, 0)]]
    stats += [[name, *np.nanquantile(values, q, axis=0)] for name, q in
              (("p10", 0.1), ("p25", 0.25), ("median", 0.5), ("p75", 0.75), ("p90", 0.9))]
    stats.append(["max", *np.nanmax(values, 0)])
    worst = sorted(rows, key=lambda r: r["accuracy"])[:WORST_SHOWN]
    return "\n".join([f"over {len(rows)} clients:",
                      format_table(["", *keys], [[s[0], *map(float, s[1:])] for s in stats]),
                      f"the {len(worst)} clients of lowest accuracy:",
                      clients(worst)])


# a run that does not personalise fills the per-client keys of summary.json with the global model on
# each client's test split: the table prints the keys as they are, and this line says what they hold
GLOBAL_ON_CLIENTS = ("this method does not personalise: personalized_* and new_client_personal_* hold the global "
                     "model on each client's test split")


PRIVACY_ROWS = ("privacy_epsilon", "privacy_delta", "sample_level_epsilon", "sample_level_delta", "privacy_randomness")


def summary_table(summary: dict[str, Any]) -> str:
    """The final result of one run as a two-column table; a note when the clients' mean accuracy is
    below the majority-class baseline (:func:`majority_note`); a personalised run's per-client
    results below it (:func:`per_client_table`), and the clients that never trained
    (``data.holdout_clients``) beside them. A run that does not personalise
    (``summary["personalized"]`` false) labels the per-client values as the global model's."""
    final = summary.get("final", {})
    personal = summary.get("personalized", True)  # summaries written before the key: as they were printed
    keys = ["accuracy", "balanced_accuracy", "loss", "uncalibrated_accuracy", "personalized_accuracy",
            "personalized_accuracy_std", "personalized_accuracy_worst", "personalized_balanced_accuracy",
            "majority_baseline_accuracy", "new_client_accuracy", "new_client_personal_mean", "new_client_personal_std",
            "new_client_personal_worst", "new_client_majority_baseline"]
    rows = [[k, final[k]] for k in keys if k in final]  # summary.json's keys, as the file has them
    rows += [["headline", summary.get("headline", "accuracy")],  # the metric the data set is compared by
             ["rounds_completed", summary.get("rounds_completed")],
             ["wall_seconds", float(summary.get("wall_seconds", 0.0))]]
    rows += [[k, float(summary[k])] for k in ("setup_seconds", "train_seconds") if summary.get(k) is not None]
    rows += [[k, f"{summary[k]:.4g}" if isinstance(summary[k], float) else summary[k]]  # a private run's guarantee
             for k in PRIVACY_ROWS if summary.get(k) is not None]
    table = format_table(["metric", "value"], rows)
    if not personal and any(k.startswith(("personalized_", "new_client_personal_")) for k in final):
        table += f"\n({GLOBAL_ON_CLIENTS})"
    for note in (majority_note(final, personal), *(personal_notes(final) if personal else ())):
        if note:
            table += f"\n{note}"
    model = "its personalised model" if personal else "the global model"
    if final.get("per_client"):
        table += f"\n\nper client ({model} on its test split):\n{per_client_table(final['per_client'])}"
    if final.get("new_per_client"):  # the clients that never trained (data.holdout_clients)
        rule = "its method's new-client rule" if personal else "the global model"
        table += f"\n\nper new client ({rule} on its test split):\n{per_client_table(final['new_per_client'])}"
    return table


def personal_notes(final: dict[str, Any]) -> list[str]:
    """A personalising run's notes where its personal models end below the global model: the
    trained clients' mean (``personalized_accuracy``) below the global model's ``accuracy`` (on the
    global test split: not the same samples, but the model a client could have used instead), and the
    new clients' rule (``new_client_personal_mean``) below the global model on the same splits
    (``new_client_accuracy``)."""
    notes = []
    pairs = [("personalized_accuracy", "accuracy", "the trained clients' personal models",
              "the global model's accuracy on the global test split"),
             ("new_client_personal_mean", "new_client_accuracy", "the new clients' rule", "the global model's on the same splits")]
    for mine, theirs, who, against in pairs:
        if final.get(mine) is not None and final.get(theirs) is not None and final[mine] < final[theirs]:
            notes.append(f"note: {who} score {final[mine]:.4f} ({mine}), below {against} {final[theirs]:.4f} "
                         f"({theirs}): at this budget the global model is the better one to use; the method's page "
                         "(docs/methods/) lists the keys its personal step depends on")
    return notes


def majority_note(final: dict[str, Any], personal: bool) -> str:
    """One line when the clients' mean accuracy is below their majority-class baseline (each client
    always answering its most frequent training class, scored on its test split), saying why that
    can happen; else ``""``."""
    accuracy, baseline = final.get("personalized_accuracy"), final.get("majority_baseline_accuracy")
    if accuracy is None or baseline is None or accuracy >= baseline:
        return ""
    why = ("the personal models have not yet learned past the clients' label skew (more rounds or local "
           "epochs, another train.lr)" if personal else
           "one global model cannot follow each client's own label skew, which the baseline uses; a "
           "personalising method (fedlatent methods: ditto, fedrep, ...) can")
    return (f"note: the clients' mean accuracy {accuracy:.4f} is below their majority-class baseline {baseline:.4f} "
            f"(each client always answering its most frequent training class): {why}")


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
