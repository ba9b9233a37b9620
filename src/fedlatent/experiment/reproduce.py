"""``fedlatent reproduce``: the seed papers' tables as named study files (``specs/*.toml``).

Each spec records the paper's setting as configuration keys and its published numbers; rows
that need a piece fedlatent lacks are marked unavailable with the reason. ``--quick`` runs the
spec's reduced version on offline data; ``--tier cpu`` its real-data tier (the paper's data set under
``--data-root``, at a budget two CPU cores finish, stated beside the table); the output puts the
paper's number, fedlatent's mean ± std over seeds and, for personalised tables, the majority-class
baseline side by side.

Variant labels ``{config = "feduv/cifar100_a0.01.toml"}`` take a shipped configuration's sections
(``fedlatent.experiment.study.with_configs``), so a table's settings are written once, in the configs.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from fedlatent.analysis.tables import format_mean_std, markdown_table
from fedlatent.config import apply_overrides, from_dict, to_dict
from fedlatent.errors import UserInputError
from fedlatent.experiment.study import TIERS, Study, load_study
from fedlatent.experiment.sweep import run_sweep

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
    import tomllib
    raw = tomllib.loads(spec_path(name).read_text(encoding="utf-8"))
    return [t for t in TIERS if t in raw]


def listing() -> str:
    """One line per spec (runnable cells of all), then the reasons rows cannot run yet."""
    lines = []
    for name in spec_names():
        study = load_spec(name)
        blocked = [c for c in study.cells if c.unavailable]
        reasons = sorted({c.unavailable for c in blocked})
        reduced = "; ".join(f"--tier {t} available" for t in tiers(name))
        lines.append(f"{name:20s} {study.title}  [{len(study.cells) - len(blocked)}/{len(study.cells)} runs "
                     f"runnable; {reduced}]")
        lines += [f"{'':20s}   not runnable yet: {r}" for r in reasons]
    return "\n".join(lines)


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


def comparison(study: Study, rows: list[dict]) -> str:
    """Paper vs fedlatent per cell (percent), with the majority baseline for personalised metrics."""
    metric = "selected_accuracy" if study.select == "val" else study.metric
    personal = study.metric == "personalized_accuracy"
    keys = [a.name for a in study.axes if a.name != "seed"]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[tuple((k, r[k]) for k in keys)].append(r)
    balanced = " (balanced where the data set's headline)" if any(r.get("headline") == "balanced_accuracy"
                                                                  for r in rows) else ""
    data = data_label(study)
    ours = f"fedlatent {metric}{balanced}" + (f" on {data}" if data else "") + " (%)"
    header = keys + ["paper (%)", ours] + (["majority baseline (%)"] if personal else []) + ["seeds", "status"]
    body = []
    for group, members in groups.items():
        entry = study.published_for(group)
        paper = "-" if entry is None else f"{entry['value']:.2f}" + (f" ± {entry['std']:.2f}" if entry.get("std") is not None else "")
        done = [r for r in members if _value(r, metric) is not None]
        values = [_value(r, metric) for r in done if _value(r, metric) == _value(r, metric)]
        status = members[0].get("error", "") if members[0]["status"] == "unavailable" else \
            ", ".join(sorted({r["status"] for r in members}))
        body.append([*(v for _, v in group), paper, format_mean_std(values, 100, 2)]
                    + ([format_mean_std([r["majority_baseline_accuracy"] for r in done
                                         if "majority_baseline_accuracy" in r], 100, 2)] if personal else [])
                    + [str(len(values)), status])
    return markdown_table(header, body)


def reproduce(name: str, out: Path, *, tier: str = "full", jobs: int = 1, data_root: str | None = None,
              only: dict[str, list[str]] | None = None, overrides: Sequence[str] = ()) -> str:
    """Run a spec (its available cells; see :func:`load_spec` for the options) into ``out`` and write
    ``out/comparison.md``; return its text."""
    study = load_spec(name, tier=tier, data_root=data_root, only=only, overrides=overrides)
    rows = run_sweep(study, out, jobs=jobs)
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
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.md").write_text(text)
    return text
