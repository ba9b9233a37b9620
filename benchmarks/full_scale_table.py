"""The tables of ``benchmarks/full_scale_cifar10.sh``: for each step's sweep folder (what ``fedlatent
reproduce ... --out`` wrote, finished or stopped by the time budget), ``OUT/<step>.md`` with one line
per table row and ``OUT/<step>.csv`` with every run's per-round metrics.

Per row: the paper's number, fedlatent's value at the last round reached (the spec's metric where
the runs finished, the global model's test accuracy at the last round where they did not), the
mean test accuracy over the last five rounds that **every** row of the step has reached (so the
rows are compared over the same rounds), the rounds reached of the planned, the seeds, and the
status. The study, its rows and each run's state come from ``fedlatent reproduce``'s own record
(``experiment.studies.reproduce.recorded_study`` / ``folder_rows``, ``experiment.studies.store``). Each call also
appends (device, commit, date, rounds reached) to ``OUT/<step>.json``, the step's history across
leases of a device, which the page lists.

    python benchmarks/full_scale_table.py runs/full_scale/feduv_a0.01 [more step folders] --out results/real_images/full_scale
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from fedlatent.analysis.tables import format_mean_std, markdown_table
from fedlatent.experiment.studies.reproduce import folder_rows, recorded_study
from fedlatent.experiment.studies.store import read_metrics, write_csv
from fedlatent.experiment.studies.study import Study
from fedlatent.experiment.tooling.timing import machine

WINDOW = 5  # rounds averaged


def commit() -> str:
    """The checkout's short commit: ``$COMMIT`` where set (a copy of the tree without its git
    folder), else ``git rev-parse --short HEAD``, else ``unknown``."""
    if os.environ.get("COMMIT"):
        return os.environ["COMMIT"]
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def test_accuracies(run_dir: Path) -> dict[int, float]:
    """Round → the global model's test accuracy, for the rounds that evaluated it."""
    return {int(m["round"]): float(m["test_accuracy"]) for m in read_metrics(run_dir) if "test_accuracy" in m}


def step_rows(study: Study, folder: Path) -> list[dict[str, Any]]:
    """One entry per table row (the cells that differ only in seed): its labels, the paper's entry,
    its runs (``store.run_row`` of each) and their per-round test accuracies."""
    axes = [a.name for a in study.axes if a.name != "seed"]
    groups: dict[tuple, dict[str, Any]] = {}
    runs = {row["run"]: row for row in folder_rows(study, folder)}
    for cell in study.cells:
        if cell.unavailable:
            continue
        key = tuple((a, cell.labels[a]) for a in axes)
        group = groups.setdefault(key, {"labels": dict(key), "paper": study.published_for(key) or {},
                                        "planned": cell.config.train.rounds, "runs": []})
        run, curve = runs[cell.name], test_accuracies(folder / cell.name)
        if run["status"] == "not run" and curve:  # stopped by the budget: resumes from its checkpoint
            run["status"] = "unfinished"
        group["runs"].append({**run, "seed": cell.labels.get("seed", str(cell.config.seed)), "curve": curve})
    return list(groups.values())


def window(rows: list[dict[str, Any]]) -> tuple[int, int] | None:
    """The last :data:`WINDOW` rounds that every run which has started has reached (first, last)."""
    reached = [max(r["curve"]) for row in rows for r in row["runs"] if r["curve"]]
    if not reached:
        return None
    last = min(reached)
    return max(1, last - WINDOW + 1), last


def last_value(run: dict[str, Any], metric: str) -> float | None:
    """The spec's metric of a finished run; the test accuracy of the last round of an unfinished one
    whose metric is the global model's accuracy; None otherwise (a personalised metric is only
    computed when a run ends)."""
    if run.get(metric) is not None:
        return float(run[metric])
    if metric == "accuracy" and run["curve"]:
        return run["curve"][max(run["curve"])]
    return None


def table(study: Study, rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    span = window(rows)
    metric = study.metric
    personal = metric == "personalized_accuracy"  # beside it, as fedlatent reproduce shows it: the majority-class rate
    header = [*rows[0]["labels"], "paper (%)", f"fedlatent {metric}, last round reached (%)",
              *(["majority baseline (%)"] if personal else []),
              "test accuracy, mean of rounds " + (f"{span[0]}-{span[1]}" if span else "-") + " (%)",
              "rounds reached / planned", "seeds", "status"]
    body = []
    for row in rows:
        paper = row["paper"].get("value")
        paper_text = "-" if paper is None else f"{paper:.2f}" + (f" ± {row['paper']['std']:.2f}"
                                                                 if row["paper"].get("std") is not None else "")
        lasts = [v for v in (last_value(r, metric) for r in row["runs"]) if v is not None]
        means = []
        for r in row["runs"]:
            values = [v for rnd, v in r["curve"].items() if span and span[0] <= rnd <= span[1]]
            if values:
                means.append(sum(values) / len(values))
        reached = sorted(max(r["curve"], default=0) for r in row["runs"])
        rounds = str(reached[0]) if reached[0] == reached[-1] else f"{reached[0]}-{reached[-1]}"
        majority = [r["majority_baseline_accuracy"] for r in row["runs"] if r.get("majority_baseline_accuracy") is not None]
        body.append([*row["labels"].values(), paper_text, format_mean_std(lasts, 100, 2),
                     *([format_mean_std(majority, 100, 2)] if personal else []), format_mean_std(means, 100, 2),
                     f"{rounds} / {row['planned']}", ", ".join(r["seed"] for r in row["runs"]),
                     ", ".join(sorted({r["status"] for r in row["runs"]}))])
    return header, body


def per_round_rows(study: Study, folder: Path) -> list[dict[str, Any]]:
    """Every run's metrics lines, each with the run's name and labels first."""
    out = []
    for cell in study.cells:
        for line in read_metrics(folder / cell.name):
            out.append({"run": cell.name, **cell.labels,
                        **{k: v for k, v in line.items() if isinstance(v, (int, float, str))}})
    return out


def write_step(folder: Path, out: Path, when: str, revision: str) -> Path:
    """``out/<step>.md``, ``.csv`` and ``.json`` (the history) for the sweep in ``folder``."""
    study = recorded_study(folder)
    if study is None:
        raise SystemExit(f"{folder}: no reproduce.json (not a folder fedlatent reproduce wrote)")
    device = device_name(study)
    rows = step_rows(study, folder)
    step = folder.name
    out.mkdir(parents=True, exist_ok=True)
    history_path = out / f"{step}.json"
    history = json.loads(history_path.read_text()) if history_path.is_file() else []
    reached = {"/".join(row["labels"].values()): [max(r["curve"], default=0) for r in row["runs"]] for row in rows}
    history.append({"date": when, "commit": revision, "device": device, "rounds_reached": reached})
    history_path.write_text("[\n" + ",\n".join(json.dumps(h) for h in history) + "\n]\n")
    per_round = per_round_rows(study, folder)
    if per_round:
        write_csv(per_round, out / f"{step}.csv")
    record = json.loads((folder / "reproduce.json").read_text())
    lines = [f"# {study.title}: step `{step}` of benchmarks/full_scale_cifar10.sh", "", study.paper, "",
             f"Spec `{record['spec']}`, tier `{record['tier']}`, cells `{record['only']}`, extra keys "
             f"`{record['overrides']}`. Updated {when} on commit {revision}, {device}.", "",
             "fedlatent: mean ± sample std over seeds; paper: as published. The window of the mean is the last "
             f"{WINDOW} rounds every started run has reached, the same for every row; a run still short of the "
             "planned rounds resumes from its checkpoint when the script runs again.", "",
             markdown_table(*table(study, rows)), "",
             f"Per-round metrics of every run: `{step}.csv`.", "", "Updates (device, commit, rounds reached per row):", ""]
    lines += [f"- {h['date']}, {h['commit']}, {h['device']}: "
              + "; ".join(f"{row} {', '.join(map(str, r))}" for row, r in h["rounds_reached"].items()) for h in history]
    path = out / f"{step}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def device_name(study: Study) -> str:
    """The device the step's runs train on (with its model, for CUDA), from the first run's config."""
    return machine(study.cells[0].config.train.device if study.cells else "cpu")["device"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("steps", nargs="+", type=Path, help="sweep folders of fedlatent reproduce ... --out")
    parser.add_argument("--out", type=Path, default=Path("results/real_images/full_scale"))
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    args = parser.parse_args(argv)
    revision = commit()
    for folder in args.steps:
        if not (folder / "reproduce.json").is_file():
            print(f"{folder}: not started, no table", file=sys.stderr)
            continue
        print(f"wrote {write_step(folder, args.out, args.date, revision)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
