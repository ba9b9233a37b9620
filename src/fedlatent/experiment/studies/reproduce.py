"""``fedlatent reproduce``: the seed papers' tables as named study files (``specs/*.toml``).

Each spec records the paper's setting as configuration keys and its published numbers; rows
that need a piece fedlatent lacks are marked unavailable with the reason. ``--quick`` runs the
spec's reduced version on offline data; ``--tier cpu`` its real-data tier (the paper's data set under
``--data-root``, at a budget two CPU cores finish, stated beside the table); the output puts the
paper's number, fedlatent's mean ± std over seeds and, for personalised tables, the majority-class
baseline side by side.

Variant labels ``{config = "feduv/cifar100_a0.01.toml"}`` take a shipped configuration's sections
(``fedlatent.experiment.studies.study.with_configs``), so a table's settings are written once, in the configs.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedlatent.analysis.compare import Compared, Verdict, baseline_label, verdict
from fedlatent.analysis.tables import format_mean_std, markdown_table
from fedlatent.config import apply_overrides, from_dict, read_toml, to_dict
from fedlatent.errors import UserInputError
from fedlatent.experiment.studies.store import COST_KEYS, run_row
from fedlatent.experiment.studies.study import CONFIGS, TIERS, Study, load_study
from fedlatent.experiment.studies.sweep import run_sweep

if TYPE_CHECKING:
    from fedlatent.experiment.studies.cluster import Cluster

SPECS = Path(__file__).resolve().parent / "specs"


def spec_names() -> list[str]:
    return sorted(p.stem for p in SPECS.glob("*.toml"))


def spec_path(name: str) -> Path:
    path = SPECS / f"{name}.toml"
    if not path.is_file():
        raise UserInputError(f"reproduce: unknown spec {name!r}; known: {', '.join(spec_names())}")
    return path


def load_spec(name: str, *, tier: str = "full", data_root: str | None = None,
              only: dict[str, list[str]] | None = None, overrides: Sequence[str] = ()) -> Study:
    """A spec's study (its ``config = ...`` labels expanded), full or a reduced tier. ``data_root``
    replaces every cell's ``data.root``, ``only`` (axis → labels) keeps the matching cells and
    ``overrides`` (``--set`` texts, e.g. ``train.device="cuda"``) apply to every cell last."""
    study = load_study(spec_path(name), tier=tier)
    for axis, labels in (only or {}).items():
        known = next((a.labels for a in study.axes if a.name == axis), None)
        if known is None:
            raise UserInputError(f"reproduce {name}: --only {axis}=...: no such axis (axes: "
                                 f"{', '.join(a.name for a in study.axes)})")
        unknown = [label for label in labels if label not in known]
        if unknown:
            raise UserInputError(f"reproduce {name}: --only {axis}={unknown[0]}: no such label (labels: {', '.join(known)})")
        study.cells = [c for c in study.cells if c.labels[axis] in labels]
    extra = [*([f"data.root={json.dumps(data_root)}"] if data_root is not None else []), *overrides]
    if extra:
        for cell in study.cells:
            cell.config = from_dict(apply_overrides(to_dict(cell.config), extra))
    return study


def parse_only(texts: Sequence[str]) -> dict[str, list[str]]:
    """``["method=fedavg,feduv", "seed=0"]`` → ``{"method": ["fedavg", "feduv"], "seed": ["0"]}``."""
    only: dict[str, list[str]] = {}
    for text in texts:
        axis, sep, labels = text.partition("=")
        if not sep or not axis or not labels:
            raise UserInputError(f"--only {text!r}: expected AXIS=LABEL[,LABEL...], e.g. method=fedavg,feduv")
        only.setdefault(axis, []).extend(label for label in labels.split(",") if label)
    return only


def tiers(name: str) -> list[str]:
    """The reduced tiers a spec carries."""
    return [t for t in TIERS if t in read_toml(spec_path(name), "spec")]


def missing_data(study: Study) -> list[str]:
    """The data folders or files the study's runnable cells read that are not here, each as
    ``data.root = 'data' (cifar10)``: what keeps the spec from running on this machine as it stands."""
    from fedlatent.data.registry import DATASETS
    missing: dict[str, set[str]] = defaultdict(set)
    for cell in study.cells:
        data = cell.config.data
        for key in ("root", "path"):
            value = getattr(data, key, "")
            if not cell.unavailable and key in DATASETS.get(data.dataset).reads and not Path(value).exists():
                missing[f"data.{key} = {value!r}"].add(data.dataset)
    return [f"{where} ({', '.join(sorted(datasets))})" for where, datasets in missing.items()]


def listing() -> str:
    """One line per spec (runnable cells of all), whether its data are here and, where not, how to
    point the spec at them (``--data-root``) or which reduced tier runs without them; then the
    reasons rows cannot run yet."""
    lines = []
    for name in spec_names():
        study = load_spec(name)
        blocked = [c for c in study.cells if c.unavailable]
        reasons = sorted({c.unavailable for c in blocked})
        reduced = "; ".join(f"--tier {t} available" for t in tiers(name))
        lines.append(f"{name:20s} {study.title}  [{len(study.cells) - len(blocked)}/{len(study.cells)} runs "
                     f"runnable; {reduced}]")
        missing = missing_data(study)
        if missing:
            offline = [t for t in tiers(name) if not missing_data(load_spec(name, tier=t))]
            fallback = f", or --tier {offline[0]} (its data need no files)" if offline else ""
            lines.append(f"{'':20s}   data not here: {', '.join(missing)}: pass --data-root DIR{fallback}")
        lines += [f"{'':20s}   not runnable yet: {r}" for r in reasons]
    lines += [f"{'out of scope':20s} {row}" for row in not_runnable_rows()]
    return "\n".join(lines)


def not_runnable_rows(audit: Path = CONFIGS / "AUDIT.md") -> list[str]:
    """The papers' rows that the audit (``configs/AUDIT.md``) marks "not runnable", each as
    "paper, row: what it is — why", the paper read from the section heading above it."""
    rows, paper = [], ""
    for line in audit.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            paper = line[3:].split(" (")[0]
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 4 and cells[-1].startswith("not runnable"):
            rows.append(f"{paper} {cells[0]}: {cells[1]} — {cells[-1]}")
    return rows


def _value(row: dict, metric: str) -> float | None:
    """``row[metric]``, or its balanced form for a data set whose headline is balanced accuracy
    (Fed-ISIC2019: FLamby's metric)."""
    if row.get("headline") == "balanced_accuracy" and metric in ("accuracy", "personalized_accuracy"):
        metric = metric.replace("accuracy", "balanced_accuracy")
    return row.get(metric)


# data sets by the names papers give them; one not here is named by its folder (data.root)
DATA_NAMES = {"digits": "digits", "synthetic": "Synthetic", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100",
              "stl10": "STL-10", "tinyimagenet": "Tiny ImageNet", "fed_isic2019": "Fed-ISIC2019", "rxrx1": "RxRx1",
              "ham10000": "HAM10000"}


def data_label(study: Study) -> str:
    """The data a reduced tier's cells ran on, for the column of our numbers: ``digits``, ``real
    CIFAR-10 (subset)``; empty for the full tier, which runs on the paper's data. So that a reader
    of the table alone does not take a quick tier's numbers for the paper's data set's."""
    if study.tier == "full":
        return ""
    data = [c.config.data for c in study.cells]
    names = ", ".join(dict.fromkeys(DATA_NAMES.get(d.dataset, Path(d.root).name or d.dataset) for d in data))
    real = "real " if study.tier == "cpu" else ""
    subset = " (subset)" if any(d.train_per_class for d in data) else ""
    return f"{real}{names}{subset}"


def _metric(study: Study) -> str:
    """The row key our numbers are read from: the spec's metric, or the validation-selected accuracy."""
    return "selected_accuracy" if study.select == "val" else study.metric


def compared_rows(study: Study, rows: list[dict]) -> list[Compared]:
    """The run rows grouped per table row (all labels but the seed), in percent, each beside the
    paper's number and, for personalised metrics, the majority-class rate."""
    metric = _metric(study)
    personal = study.metric == "personalized_accuracy"
    keys = [a.name for a in study.axes if a.name != "seed"]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[tuple((k, r[k]) for k in keys)].append(r)
    compared = []
    for group, members in groups.items():
        entry = study.published_for(group) or {}
        done = [r for r in members if _value(r, metric) is not None]
        numbered = [r for r in done if _value(r, metric) == _value(r, metric)]  # NaN aside
        values = [_value(r, metric) for r in numbered]
        status = members[0].get("error", "") if members[0]["status"] == "unavailable" else \
            ", ".join(sorted({r["status"] for r in members}))
        majority = [100 * r["majority_baseline_accuracy"] for r in done if "majority_baseline_accuracy" in r]
        compared.append(Compared(dict(group), entry.get("value"), entry.get("std"), [100 * v for v in values],
                                 majority if personal else [], status, [str(r.get("seed", "")) for r in numbered]))
    return compared


def ours_header(study: Study, rows: list[dict]) -> str:
    """The column header of our numbers: the metric, and the data a reduced tier ran on."""
    balanced = " (balanced where the data set's headline)" if any(r.get("headline") == "balanced_accuracy"
                                                                  for r in rows) else ""
    data = data_label(study)
    return f"fedlatent {_metric(study)}{balanced}" + (f" on {data}" if data else "") + " (%)"


def comparison_table(study: Study, rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Paper vs fedlatent per table row (percent), with the majority baseline for personalised
    metrics: the header and the rows, for markdown and the report page alike."""
    personal = study.metric == "personalized_accuracy"
    keys = [a.name for a in study.axes if a.name != "seed"]
    header = keys + ["paper (%)", ours_header(study, rows)] + (["majority baseline (%)"] if personal else []) \
        + ["seeds", "status"]
    costs = [(key, name, run_key) for (key, name), run_key in zip(COST_COLUMNS, COST_KEYS)
             if any(key in e for e in study.published)]
    for _, name, _ in costs:
        header[-2:-2] = [f"paper {name}", f"fedlatent {name}"]
    body = []
    for row in compared_rows(study, rows):
        paper = "-" if row.paper is None else f"{row.paper:.2f}" + (f" ± {row.paper_std:.2f}"
                                                                     if row.paper_std is not None else "")
        entry = study.published_for(tuple(row.labels.items())) or {}
        members = [r for r in rows if all(r.get(k) == v for k, v in row.labels.items())]
        measured = [[f"{entry[key]:.3g}" if key in entry else "-", _cost(members, run_key)] for key, _, run_key in costs]
        body.append([*row.labels.values(), paper, format_mean_std(row.ours, 1, 2)]
                    + ([format_mean_std(row.majority, 1, 2)] if personal else [])
                    + [cell for pair in measured for cell in pair] + [str(len(row.ours)), row.status])
    return header, body


# SphereFed Table 1's cost columns: the [[published]] key and its header, read from the runs' COST_KEYS
COST_COLUMNS = (("megabytes", "MB per client"), ("gflops", "GFLOPs"))


def _cost(rows: list[dict], key: str) -> str:
    """The runs' mean of a cost column (the same for every seed: a count, not a measurement)."""
    values = [r[key] for r in rows if r.get(key) is not None]
    return f"{sum(values) / len(values):.3g}" if values else "-"


def comparison(study: Study, rows: list[dict]) -> str:
    """:func:`comparison_table` as markdown."""
    return markdown_table(*comparison_table(study, rows))


def compared_axis(study: Study) -> str | None:
    """The axis along which a row is compared with its baseline row: ``method`` where the spec has
    it, else the first axis of two labels or more that is neither the setting nor the seed."""
    axes = [a.name for a in study.axes if a.name not in ("setting", "seed") and len(a.labels) > 1]
    return "method" if "method" in axes else next(iter(axes), None)


def verdicts(study: Study, compared: list[Compared]) -> list[Verdict]:
    """Each row's verdict (:func:`fedlatent.analysis.compare.verdict`) against its baseline row: the
    row with the same labels but the baseline's on :func:`compared_axis`, paired seed by seed for
    the paired verdict. Values are compared on the full tier only, which runs on the paper's data."""
    axis = compared_axis(study)
    labels = next((a.labels for a in study.axes if a.name == axis), [])
    by_labels = {tuple(row.labels.items()): row for row in compared}
    found = []
    for row in compared:
        base = baseline_label(row.labels[axis], labels) if axis else None
        baseline = by_labels.get(tuple({**row.labels, axis: base}.items())) if base else None
        found.append(verdict(row, baseline, same_data=study.tier == "full"))
    return found


def figure_title(study: Study) -> str:
    """The comparison figure's title: the table, the tier and, for a reduced tier, the data ours ran on."""
    tier = "" if study.tier == "full" else f" ({study.tier} tier)"
    data = data_label(study)
    return f"{study.title}{tier}\npaper as published vs fedlatent" + (f" on {data}" if data else "")


def comparison_plot(study: Study, rows: list[dict], path: Path) -> Path:
    """:func:`fedlatent.analysis.study_plots.comparison_figure` of the table, saved at ``path``."""
    from fedlatent.analysis.study_plots import comparison_plot as draw  # matplotlib only when drawing
    metric = "personalised accuracy (mean over clients)" if study.metric == "personalized_accuracy" else _metric(study)
    data = data_label(study)
    return draw(compared_rows(study, rows), figure_title(study), f"{metric.replace('_', ' ')} (%)",
                "fedlatent" + (f" on {data}" if data else ""), "paper" + (" (on its own data)" if data else ""), path)


RECORD = "reproduce.json"  # in the sweep folder: which spec and options reproduce ran, for report


def write_record(out: Path, name: str, tier: str, data_root: str | None, only: dict[str, list[str]] | None,
                 overrides: Sequence[str]) -> Path:
    """``out/reproduce.json``: the spec and the options of the run, so that ``fedlatent report`` on
    the folder loads the same study (:func:`recorded_study`) and compares it with the paper."""
    out.mkdir(parents=True, exist_ok=True)
    record = {"spec": name, "tier": tier, "data_root": data_root, "only": only or {}, "overrides": list(overrides)}
    (out / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return out / RECORD


def recorded_study(folder: Path) -> Study | None:
    """The study ``fedlatent reproduce`` ran into ``folder`` (None for a folder it did not write);
    a spec that no longer loads as recorded (renamed, edited) raises :class:`UserInputError`."""
    path = folder / RECORD
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    try:
        return load_spec(record["spec"], tier=record["tier"], data_root=record["data_root"], only=record["only"],
                         overrides=record["overrides"])
    except UserInputError as err:
        raise UserInputError(f"{path}: spec {record['spec']} no longer loads as recorded: {err}") from None


def folder_rows(study: Study, folder: Path) -> list[dict]:
    """The study's rows as the runs in ``folder`` stand now (what :func:`run_sweep` returns, with
    ``finished`` or ``not run`` for the runs' status), without running anything."""
    rows = []
    for cell in study.cells:
        status = "unavailable" if cell.unavailable else \
            "finished" if (folder / cell.name / "summary.json").is_file() else "not run"
        rows.append(run_row(cell.name, cell.labels, status, folder / cell.name, study.select, cell.unavailable))
    return rows


def reproduce(name: str, out: Path, *, tier: str = "full", jobs: int = 1, stack: int | str = "auto",
              data_root: str | None = None, only: dict[str, list[str]] | None = None, overrides: Sequence[str] = (),
              cluster: Cluster | None = None) -> str:
    """Run a spec (its available cells; see :func:`load_spec` for the options) into ``out`` and write
    ``out/comparison.md`` and its figure ``out/comparison.png``; return the text. With ``cluster``
    the cells run as Ray tasks (:mod:`fedlatent.experiment.studies.cluster`)."""
    study = load_spec(name, tier=tier, data_root=data_root, only=only, overrides=overrides)
    if cluster is not None:  # reachable and able to run every cell, before the folder exists
        cluster.admit([c.config for c in study.cells if not c.unavailable], jobs)
    fresh = not out.exists()
    write_record(out, name, tier, data_root, only, overrides)
    try:
        rows = run_sweep(study, out, jobs=jobs, stack=stack, cluster=cluster)
    except UserInputError:  # refused before any run (the sweep validates first): leave no folder behind
        if fresh and [p.name for p in out.iterdir()] == [RECORD]:
            (out / RECORD).unlink()
            out.rmdir()
        raise
    caption = ("fedlatent: mean ± sample std (ddof = 1) over seeds, last round"
               + (", model selected by validation accuracy" if study.select == "val" else "")
               + "; paper: as published (± its std where given).")
    text = f"## {study.title}{'' if tier == 'full' else f' ({tier} tier)'}\n\n{study.paper}\n\n"
    if study.budget:
        text += (f"**Budget: {study.budget}.** This is not the paper's budget: the numbers show whether the "
                 f"paper's direction holds at this budget, not its published values.\n\n")
    if tier != "full" and study.note:
        text += f"{tier.capitalize()} version: {study.note}\n\n"
    text += caption + "\n\n" + comparison(study, rows) + "\n"
    (out / "comparison.md").write_text(text)
    comparison_plot(study, rows, out / "comparison.png")
    return text
