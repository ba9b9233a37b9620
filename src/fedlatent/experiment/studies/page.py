"""``report.html``: ``fedlatent report`` as one self-contained page to open in a browser or mail.

It opens with what was run (the study, the fedlatent version and commit, the machine, the budget),
then, for a folder ``fedlatent reproduce`` wrote, the table beside the paper's with a verdict per
row (:mod:`fedlatent.analysis.compare`) and its figure, then the per-cell table and every figure.
Tables are HTML, figures PNG data URIs, the style one ``<style>`` element: no file or network
access is needed to read it.
"""
from __future__ import annotations

import base64
import html
import json
import subprocess
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedlatent.analysis.compare import (DIRECTION_ONLY, HOLDS, REVERSE_HOLDS, TIE_PP, TOLERANCE_PP, UNRESOLVED,
                                       Verdict)
from fedlatent.config import RunConfig, load_config
from fedlatent.errors import UserInputError
from fedlatent.experiment.studies import reproduce
from fedlatent.experiment.studies.study import Study
from fedlatent.experiment.runner.machine import cpu_model

STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222; margin: 0 auto;
       padding: 1.5em 2em 4em; max-width: 1250px; }
h1 { font-size: 1.6em; margin-bottom: 0.1em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 0.25em 1.2em; }
dt { font-weight: 600; } dd { margin: 0; }
.scroll { overflow-x: auto; margin: 0.8em 0; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.yes { background: #e3f4e1; } td.no { background: #fbe3e1; } td.na { color: #777; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption, .note { color: #555; font-size: 0.9em; }
"""

Cell = str | tuple[str, str]  # a table cell's text, or its text and a CSS class


@dataclass
class Reproduced:
    """A folder ``fedlatent reproduce`` wrote, as ``report`` found it: the study as recorded, its
    rows as the runs stand, and the comparison figure drawn for the page."""

    study: Study
    rows: list[dict[str, Any]]
    figure: Path


def table(header: list[str], body: list[list[Cell]]) -> str:
    """An HTML table in a horizontally scrolling box (a wide table scrolls, the page does not);
    numeric-looking cells right-aligned."""
    def cell(value: Cell) -> str:
        text, css = value if isinstance(value, tuple) else (value, "num" if _numeric(value) else "")
        return f"<td class=\"{css}\">{html.escape(text)}</td>" if css else f"<td>{html.escape(text)}</td>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(cell(c) for c in row) + "</tr>" for row in body)
    return f"<div class=\"scroll\"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>"


def _numeric(text: str) -> bool:
    """Whether a cell reads as a number (``71.85``, ``71.85 ± 0.20``, ``3/3``, ``-``)."""
    return bool(text) and all(ch in "0123456789.±+-/ e" for ch in text)


def image(path: Path, caption: str) -> str:
    """A PNG embedded as a data URI, with its caption."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f"<figure><img src=\"data:image/png;base64,{data}\" alt=\"{html.escape(caption)}\">"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def definitions(facts: list[tuple[str, str]]) -> str:
    """Facts as a two-column list."""
    return "<dl>" + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in facts) + "</dl>"


def _distinct(values: Iterable[str]) -> str:
    """The distinct values in order of first appearance, each with its count when they differ."""
    counts = Counter(values)
    if len(counts) == 1:
        return next(iter(counts))
    return "; ".join(f"{value} ({n} runs)" for value, n in counts.items())


def commit() -> str | None:
    """The short commit of the fedlatent checkout this package is imported from; None for an
    installed package or when git is missing or fails."""
    package = Path(__file__).resolve().parents[2]  # src/fedlatent: studies/ → experiment/ → fedlatent/
    try:
        done = subprocess.run(["git", "-C", str(package), "rev-parse", "--show-prefix", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.split()
    return lines[-1] if len(lines) == 2 and lines[0] == "src/fedlatent/" else None


def _budget(config: RunConfig) -> str:
    train = config.train
    local = f"{train.local_steps} local steps" if train.local_steps else \
        f"{train.local_epochs} local epoch{'s' if train.local_epochs != 1 else ''}"
    return f"{train.rounds} rounds × {local}"


def _data(config: RunConfig) -> str:
    data = config.data
    partition = {"dirichlet": f"Dirichlet α = {data.alpha:g}"}.get(data.partition, data.partition)
    subset = [f"{key} = {getattr(data, key)}" for key in ("train_per_class", "test_per_class") if getattr(data, key)]
    subset += [f"samples_per_client = {data.samples_per_client}"] if data.dataset == "synthetic" else []
    return f"{data.dataset} ({', '.join([partition, *subset])})"


def _clients(config: RunConfig) -> str:
    clients = "the data's own" if config.data.num_clients == "auto" else str(config.data.num_clients)
    share = config.train.participation
    return clients + (f", {share:g} of them per round" if share < 1 else "")


def run_facts(titles: list[str], dirs: list[Path], paths: list[Path]) -> list[tuple[str, str]]:
    """What was run: the studies, the software, the machine and the budget of the runs in
    ``paths``, each line the distinct values over the runs (their configs and summaries)."""
    configs, summaries = [], []
    for path in paths:
        try:
            configs.append(load_config(path / "config.toml"))
        except UserInputError:
            pass  # a run without a readable config: left out of the budget lines
        if (path / "summary.json").is_file():
            summaries.append(json.loads((path / "summary.json").read_text()))
    versions = _distinct(s.get("fedlatent_version", "unknown") for s in summaries) if summaries else "no run finished"
    code = commit()
    facts = [("study", "; ".join(titles) or "run directories"), ("folders", ", ".join(map(str, dirs))),
             ("runs", f"{len(paths)} ({len(summaries)} finished)"),
             ("fedlatent", versions + (f" (report written at commit {code})" if code else ""))]
    if configs:
        devices = _distinct(f"{c.train.device}, {c.train.threads} thread{'s' if c.train.threads != 1 else ''}"
                            for c in configs)
        facts += [("runs' device", devices)]
    facts += [("backend", _distinct(s.get("backend", "?") for s in summaries))] if summaries else []
    machines = [s["machine"] for s in summaries if "machine" in s]
    facts += [("machine", _distinct(machines)) if machines else
              ("report's machine", f"{cpu_model()} (the runs record no machine of theirs)")]
    if configs:
        facts += [("budget", _distinct(_budget(c) for c in configs)), ("clients", _distinct(_clients(c) for c in configs)),
                  ("data", _distinct(_data(c) for c in configs))]
    return facts


def _verdict_cells(found: Verdict) -> list[Cell]:
    """A verdict's two cells, marked and coloured by their answer."""
    css = {True: "yes", False: "no", None: "na"}
    mark = {True: "✓ ", False: "✗ ", None: ""}
    paired = {HOLDS: True, REVERSE_HOLDS: False}.get(found.paired)
    return [(mark[found.value] + found.value_text, css[found.value]),
            (mark[found.direction] + found.direction_text, css[found.direction]),
            (mark[paired] + found.paired_text, css[paired])]


def _count(answers: list[bool | None]) -> str:
    asked = [a for a in answers if a is not None]
    return f"{sum(asked)} of {len(asked)} rows" if asked else "not asked"


def _paired_count(answers: list[str]) -> str:
    counts = Counter(a for a in answers if a)
    return ", ".join(f"{answer} {counts[answer]}" for answer in sorted(counts)) if counts else "not asked"


def comparison_section(found: Reproduced) -> str:
    """A reproduced table: the paper, the budget, the verdict rules and counts, the table with a
    verdict per row, and its figure."""
    study = found.study
    header, body = reproduce.comparison_table(study, found.rows)
    answers = reproduce.verdicts(study, reproduce.compared_rows(study, found.rows))
    axis = reproduce.compared_axis(study)
    header += ["value vs the paper's", f"direction vs the baseline row ({axis or 'none'})",
               "paired verdict on the paper's direction"]
    body = [row + _verdict_cells(answer) for row, answer in zip(body, answers)]
    tier = "" if study.tier == "full" else f" ({study.tier} tier)"
    parts = [f"<h2>Compared with the paper: {html.escape(study.title)}{tier}</h2>",
             f"<p>{html.escape(study.paper)}</p>" if study.paper else "",
             f"<p><strong>Budget:</strong> {html.escape(study.budget)}</p>" if study.budget else "",
             f"<p class=\"note\">{html.escape(study.note)}</p>" if study.tier != "full" and study.note else "",
             "<p class=\"note\">Value: our mean within the paper's ± std, or within ±"
             f"{TOLERANCE_PP:g} points where its std is smaller or not given (asked on the paper's data only). "
             "Direction: the sign of (row − its baseline row: the method without its added term, else fedavg, "
             f"else the first row), ours against the paper's; differences within ±{TIE_PP:g} points count as none. "
             "Paired verdict (fedlatent.analysis.compare.paired_verdict): (row − baseline row) seed by seed; "
             f"{HOLDS} when every seed has the paper's sign and |mean| exceeds the std, {DIRECTION_ONLY} when "
             f"only the mean has it, {REVERSE_HOLDS} when every seed has the other sign and |mean| exceeds the std, "
             f"{UNRESOLVED} otherwise (one seed among them: it neither holds nor refutes).</p>",
             f"<p><strong>Value within:</strong> {_count([a.value for a in answers])}; "
             f"<strong>direction agrees:</strong> {_count([a.direction for a in answers])}; "
             f"<strong>paired:</strong> {_paired_count([a.paired for a in answers])}.</p>",
             table(header, body), image(found.figure, f"{found.figure.name}: the paper's numbers and ours per row")]
    return "".join(parts)


def write_page(path: Path, facts: list[tuple[str, str]], reproduced: list[Reproduced],
               cells: tuple[list[str], list[list[Any]]], caption: str, figures: list[Path]) -> Path:
    """``report.html`` at ``path``: what was run, each reproduced table, the per-cell table (with
    its caption) and the figures."""
    header, body = cells
    sections = ["<h1>fedlatent report</h1><h2>What was run</h2>" + definitions(facts),
                *(comparison_section(r) for r in reproduced),
                f"<h2>Results per cell</h2><p class=\"note\">{html.escape(caption)}.</p>"
                + table(header, [[str(c) for c in row] for row in body]),
                "<h2>Figures</h2>" + "".join(image(f, f.name) for f in figures)]
    text = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>fedlatent report: {html.escape(facts[0][1])}</title><style>{STYLE}</style></head>"
            f"<body>{''.join(sections)}</body></html>\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
