"""``fedlatent report``: tables (markdown, CSV, LaTeX), plots and one page (``report.html``) over
run and sweep directories.

Runs that differ only in seed form a group (a sweep's cells, from its ``sweep.json``; for loose
run directories, the same method, data set and partition in ``summary.json``). Tables give mean ±
std over seeds per group; plots show each group's mean over seeds with a min–max band, a panel per
setting (the axes other than the method) and a colour per method. A folder ``fedlatent reproduce``
wrote is also compared with the paper, row by row (:mod:`fedlatent.experiment.studies.page`).
"""
from __future__ import annotations

import json
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedlatent.analysis.diagnostic_plots import plot_diagnostics
from fedlatent.analysis.study_plots import band_plot, per_client_plot
from fedlatent.errors import UserInputError
from fedlatent.experiment.studies import reproduce
from fedlatent.experiment.studies.page import Reproduced, run_facts, write_page
from fedlatent.experiment.studies.store import cell_table, read_metrics, run_row, table_caption, write_tables


@dataclass
class RunDir:
    path: Path
    labels: dict[str, str]  # the group's labels and "seed"

    def setting(self, method_axis: str | None) -> str:
        """The run's labels on the axes that are neither the method nor the seed (a figure's panel)."""
        return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in self.labels.items()
                         if k not in (method_axis, "seed"))

    def method(self, method_axis: str | None) -> str:
        """The run's label on the method axis (a curve's colour and line style)."""
        return self.labels.get(method_axis, "run") if method_axis else "run"


METHOD_AXES = ("method", "algorithm.name", "algorithm", "terms")  # the first present names the method


def method_axis(axes: list[str]) -> str | None:
    """The axis a figure draws as curves: the first of :data:`METHOD_AXES` the runs have, else their
    first axis other than the seed; the other axes make the panels."""
    return next((a for a in METHOD_AXES if a in axes), next((a for a in axes if a != "seed"), None))


def _loose_labels(path: Path) -> dict[str, str]:
    """Labels of a run outside a sweep, from what its summary (or config) says identifies it."""
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").exists() else {}
    ident = summary.get("identity", {}).get("partition")
    if ident is None and (path / "config.toml").exists():
        config = tomllib.loads((path / "config.toml").read_text())
        ident = {**config.get("data", {}), "data_seed": config.get("seed")}
        summary.setdefault("method", config.get("algorithm", {}).get("name", "?"))
        summary.setdefault("seed", config.get("seed"))
    ident = ident or {}
    part = ident.get("partition", "?")
    part += f"{ident.get('alpha'):g}" if part == "dirichlet" and ident.get("alpha") is not None else ""
    return {"method": str(summary.get("method", path.name)), "data": f"{ident.get('dataset', '?')}-{part}",
            "seed": str(summary.get("seed", "?"))}


def collect_runs(dirs: list[Path]) -> tuple[list[RunDir], list[str]]:
    """Every run under ``dirs`` (sweep directories, run directories, or folders of runs) and the axes."""
    runs, axes = [], []
    for d in dirs:
        if (d / "sweep.json").exists():
            manifest = json.loads((d / "sweep.json").read_text())
            axes += [a for a in manifest["axes"] if a not in axes]
            runs += [RunDir(d / r["run"], r["labels"]) for r in manifest["runs"] if (d / r["run"] / "metrics.jsonl").exists()]
        elif (d / "metrics.jsonl").exists():
            runs.append(RunDir(d, _loose_labels(d)))
        elif d.is_dir():
            runs += [RunDir(m.parent, _loose_labels(m.parent)) for m in sorted(d.glob("*/metrics.jsonl"))]
        else:
            raise UserInputError(f"report: {d} is not a directory")
    if any(a not in axes for r in runs for a in r.labels):
        axes += [a for a in ("method", "data", "seed") if a not in axes]
    if not runs:
        raise UserInputError(f"report: no run directories (with metrics.jsonl) under {', '.join(map(str, dirs))}")
    return runs, axes


def _series(metrics: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(m["round"], float(m[key])) for m in metrics if key in m]
    return [p[0] for p in points], [p[1] for p in points]


def collect_plots(runs: list[RunDir], axes: list[str], out: Path) -> list[Path]:
    """Every figure of the report; a new kind of figure over run directories is one more call here."""
    by_method = method_axis(axes)
    panels: dict[str, dict[str, list[list[dict[str, Any]]]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        panels[r.setting(by_method)][r.method(by_method)].append(read_metrics(r.path))
    plots = []
    for key, ylabel, title, name, logy in [
            ("test_accuracy", "test accuracy of the global model (0–1)", "Global test accuracy per round",
             "accuracy.png", False),
            ("train_loss", "mean local training loss (nats, log scale)", "Training loss per round", "loss.png", True),
            ("time_train_s", "local training time per round (s, all clients)", "Local training wall time per round",
             "time_train.png", False)]:
        series = {setting: {method: [_series(m, key) for m in ms] for method, ms in methods.items()}
                  for setting, methods in panels.items()}
        if any(s[0] for methods in series.values() for runs_ in methods.values() for s in runs_):
            plots.append(band_plot(series, ylabel, title, out / name, logy=logy))
    per_client: dict[str, dict[str, tuple[list[float], list[float]]]] = defaultdict(dict)
    for r in runs:
        summary = json.loads((r.path / "summary.json").read_text()) if (r.path / "summary.json").exists() else {}
        rows = summary.get("final", {}).get("per_client", [])
        if rows:
            accs, base = per_client[r.setting(by_method)].setdefault(r.method(by_method), ([], []))
            accs += [c["accuracy"] for c in rows]
            base += [c["majority_baseline"] for c in rows if "majority_baseline" in c]
    if per_client:
        plots.append(per_client_plot(per_client, out / "per_client.png"))
    with_diagnostics = [r.path for r in runs if (r.path / "diagnostics.jsonl").exists()]
    if with_diagnostics:
        plots += plot_diagnostics(with_diagnostics, out)
    return plots


def reproduced(dirs: list[Path], out: Path) -> list[Reproduced]:
    """The folders among ``dirs`` that ``fedlatent reproduce`` wrote, each with its rows as its
    runs stand and its comparison figure drawn into ``out`` (``comparison.png``, then
    ``comparison_2.png``, ...)."""
    found = []
    for d in dirs:
        study = reproduce.recorded_study(d)
        if study is not None:
            rows = reproduce.folder_rows(study, d)
            name = "comparison.png" if not found else f"comparison_{len(found) + 1}.png"
            found.append(Reproduced(study, rows, reproduce.comparison_plot(study, rows, out / name)))
    return found


def report(dirs: list[Path], out: Path) -> list[Path]:
    """Write ``report.md``/``.tex``/``_cells.csv`` (per group), ``report.csv`` (per run), the plots
    (with a comparison figure per reproduced table) and ``report.html``, which holds them all."""
    runs, axes = collect_runs(dirs)
    rows = [run_row(str(r.path), r.labels, "finished" if (r.path / "summary.json").exists() else "unfinished", r.path)
            for r in runs]
    tables = write_tables(rows, axes, out, title="fedlatent report", stem="report", formats=("md", "csv", "tex"))
    compared = reproduced(dirs, out)
    plots = collect_plots(runs, axes, out)
    titles = [json.loads((d / "sweep.json").read_text()).get("title", "") for d in dirs if (d / "sweep.json").is_file()]
    facts = run_facts([t for t in titles if t], dirs, [r.path for r in runs])
    page = write_page(out / "report.html", facts, compared, cell_table(rows, axes), table_caption(rows), plots)
    return tables + [c.figure for c in compared] + plots + [page]
