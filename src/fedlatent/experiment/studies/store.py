"""The result store of a study: one tidy row per run (``results.csv``) and mean ± std over seeds
per cell (``results.md``, and for ``report`` the same table as CSV and LaTeX).

Accuracy is the last round's (the run's ``final``), never the best over rounds. With
``select = "val"`` the selected accuracy is the test accuracy of the round with the best mean
validation accuracy (the first such round): it needs ``val_accuracy`` and ``test_accuracy`` in
the same ``metrics.jsonl`` line, i.e. ``data.val_fraction > 0`` and ``eval.every = 1``.
"""
from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from fedlatent.analysis.tables import format_mean_std, latex_table, markdown_table

FINAL_KEYS = ("accuracy", "balanced_accuracy", "loss", "uncalibrated_accuracy", "personalized_accuracy",
              "personalized_accuracy_std", "personalized_accuracy_worst", "personalized_balanced_accuracy",
              "majority_baseline_accuracy", "new_client_accuracy", "new_client_personal_mean",
              "new_client_personal_std", "new_client_personal_worst")
DIAGNOSTIC_KEYS = ("significant", "effective_rank", "uniformity", "layer_alignment_top")  # scalar diagnostics of the global model
STD_CAPTION = ("mean ± sample standard deviation (ddof = 1) over seeds; accuracies of the last round "
               "(never the best round)")


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []


def last_global_diagnostics(run_dir: Path) -> dict[str, float]:
    """The scalar diagnostics of the global model at the last round that computed them
    (``diag_significant``, ``diag_effective_rank``, ``diag_uniformity``); empty without diagnostics."""
    path = run_dir / "diagnostics.jsonl"
    if not path.exists():
        return {}
    found: dict[str, float] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("model") == "global":
            found.update({f"diag_{k}": record[k] for k in DIAGNOSTIC_KEYS if record.get(k) is not None})
    return found


# SphereFed Table 1's columns in a run's summary (``diagnostics.which`` holding ``flops``)
COST_KEYS = ("classifier_megabytes_per_client", "classifier_gflops")


def selected_accuracy(metrics: list[dict[str, Any]]) -> tuple[float, int]:
    """Test accuracy and round of the round with the best validation accuracy (nan, 0 when the
    metrics lack per-round validation and test accuracy)."""
    rounds = [m for m in metrics if "val_accuracy" in m and "test_accuracy" in m]
    if not rounds:
        return float("nan"), 0
    best = max(rounds, key=lambda m: (m["val_accuracy"], -m["round"]))
    return float(best["test_accuracy"]), int(best["round"])


def run_row(run: str, labels: dict[str, str], status: str, run_dir: Path, select: str = "last",
            error: str = "") -> dict[str, Any]:
    """One tidy row: the run's name and labels, its status, final metrics, wall seconds and their
    split into set-up and training (with whether the run was its process's first)."""
    row: dict[str, Any] = {"run": run, **labels, "status": status}
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        final = summary.get("final", {})
        row.update({(f"final_{k}" if k in labels else k): final[k] for k in FINAL_KEYS if k in final})
        row["headline"] = summary.get("headline", "accuracy")
        row["rounds_completed"] = summary.get("rounds_completed")
        row["wall_seconds"] = summary.get("wall_seconds")
        row.update({k: summary[k] for k in ("setup_seconds", "train_seconds", "first_in_process", *COST_KEYS)
                    if k in summary})
        if summary.get("status") == "stopped":  # the failure policy ended it: no final metrics
            row["status"], error = "stopped", error or summary.get("stop_reason", "")
        if select == "val":
            row["selected_accuracy"], row["selected_round"] = selected_accuracy(read_metrics(run_dir))
        row.update(last_global_diagnostics(run_dir))
    else:
        row.update(progress(run_dir))
    if error:
        row["error"] = error
    return row


def progress(run_dir: Path) -> dict[str, Any]:
    """How far a run without a summary got (killed, or out of a time budget: it resumes from its
    checkpoint): ``latest_round`` and ``latest_accuracy``, its last metrics line's round and test
    accuracy, where it has one; a last line the kill cut short is skipped."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    for line in reversed([line for line in lines if line.strip()]):
        try:
            last = json.loads(line)
        except json.JSONDecodeError:
            continue
        if last.get("test_accuracy") is None:
            return {}
        return {"latest_round": last["round"], "latest_accuracy": last["test_accuracy"]}
    return {}


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _has(row: dict[str, Any], key: str) -> bool:
    return row.get(key) not in (None, "")


def _numbers(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if _has(r, key) and not math.isnan(float(r[key]))]


def cell_table(rows: list[dict[str, Any]], axes: list[str], select: str = "last") -> tuple[list[str], list[list[Any]]]:
    """Mean ± std over seeds per cell (runs sharing every label but ``seed``); finished runs only."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    keys = [a for a in axes if a != "seed"]
    for r in rows:
        groups[tuple(r.get(k, "") for k in keys)].append(r)
    balanced = any(r.get("headline") == "balanced_accuracy" for r in rows)  # the data set's headline first
    metrics = (["balanced_accuracy"] if balanced else []) + ["accuracy"] + (["selected_accuracy"] if select == "val" else [])
    personal = any(_has(r, "personalized_accuracy") for r in rows)
    if personal:
        metrics += (["personalized_balanced_accuracy"] if balanced else []) + ["personalized_accuracy",
                                                                              "majority_baseline_accuracy"]
    # the clients that never trained (data.holdout_clients): the global model, and the method's new-client rule
    metrics += [k for k in ("new_client_accuracy", "new_client_personal_mean") if any(_has(r, k) for r in rows)]
    if any(_has(r, "uncalibrated_accuracy") for r in rows):
        metrics.append("uncalibrated_accuracy")
    metrics += [f"diag_{k}" for k in DIAGNOSTIC_KEYS if any(_has(r, f"diag_{k}") for r in rows)]
    unfinished = any(_has(r, "latest_accuracy") for r in rows)
    header = keys + ["seeds"] + metrics + [TRAIN, WALL] + ([UNFINISHED] if unfinished else [])
    body = []
    for group, members in groups.items():
        done = [r for r in members if _has(r, "accuracy")]
        body.append([*group, f"{len(done)}/{len(members)}", *(format_mean_std(_numbers(done, m), digits=2 if m.startswith("diag_") else 4) for m in metrics),
                     _mean(done, "train_seconds", 2), _mean(done, "wall_seconds", 1) + (FIRST if _first(done) else "")]
                    + ([_latest(members)] if unfinished else []))
    return header, body


TRAIN, WALL = "train s (mean)", "wall s (mean)"
FIRST = " *"  # marks a wall time that holds a process's one-off start-up
TIME_CAPTION = "train s: the rounds' own seconds (train_seconds); wall s: the whole run, its set-up included"
FIRST_CAPTION = ("*: a process's first run (in a sweep, a worker's first) among the seeds, whose set-up holds the "
                 "process's one-off imports and warm-up, seconds its later runs do not pay")


def _mean(rows: list[dict[str, Any]], key: str, digits: int) -> str:
    values = _numbers(rows, key)
    return f"{sum(values) / len(values):.{digits}f}" if values else "-"


def _first(rows: list[dict[str, Any]]) -> bool:
    """Whether a run among ``rows`` was the first of its process."""
    return any(r.get("first_in_process") is True for r in rows)


UNFINISHED = "unfinished runs: accuracy at their last round"


def _latest(members: list[dict[str, Any]]) -> str:
    """The unfinished runs' latest test accuracy (mean ± std) and the rounds they reached, or ``-``."""
    runs = [r for r in members if _has(r, "latest_accuracy")]
    if not runs:
        return "-"
    reached = sorted({int(r["latest_round"]) for r in runs})
    rounds = str(reached[0]) if len(reached) == 1 else f"{reached[0]}–{reached[-1]}"
    return f"{format_mean_std(_numbers(runs, 'latest_accuracy'))} (round {rounds})"


def table_caption(rows: list[dict[str, Any]], select: str = "last") -> str:
    """What the per-cell table's numbers are (:func:`cell_table`), without a final full stop."""
    caption = STD_CAPTION + ("; selected accuracy: test accuracy at the round of best validation "
                             "accuracy" if select == "val" else "")
    caption += "; " + TIME_CAPTION
    if _first([r for r in rows if _has(r, "accuracy")]):
        caption += "; " + FIRST_CAPTION
    if any(r.get("headline") == "balanced_accuracy" for r in rows):
        caption += "; headline metric: balanced accuracy (mean recall over the classes, FLamby's metric)"
    if any(_has(r, "latest_accuracy") for r in rows):
        caption += ("; unfinished runs (no summary yet: killed or out of time, they resume from their "
                    "checkpoints) are shown apart, at the last round they reached")
    return caption


def write_tables(rows: list[dict[str, Any]], axes: list[str], out: Path, *, title: str = "",
                 select: str = "last", stem: str = "results", formats: tuple[str, ...] = ("md",)) -> list[Path]:
    """``<stem>.csv`` (one row per run) and the per-cell table as markdown (and csv/tex when asked)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [write_csv(rows, out / f"{stem}.csv")]
    header, body = cell_table(rows, axes, select)
    caption = table_caption(rows, select)
    if "md" in formats:
        text = (f"## {title}\n\n" if title else "") + f"{caption}.\n\n" + markdown_table(header, body) + "\n"
        (out / f"{stem}.md").write_text(text)
        paths.append(out / f"{stem}.md")
    if "csv" in formats:
        paths.append(write_csv([dict(zip(header, r)) for r in body], out / f"{stem}_cells.csv"))
    if "tex" in formats:
        (out / f"{stem}.tex").write_text(latex_table(header, body, caption))
        paths.append(out / f"{stem}.tex")
    return paths
