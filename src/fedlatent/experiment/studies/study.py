"""Study files: a base configuration and a grid of variations, expanded into named cells.

A study is TOML::

    title = "FedAvg vs FedDecorr under label skew"
    base = "../configs/digits_fedavg.toml"   # relative to the study file; or inline: [base] tables
    select = "last"                          # or "val": report the round of best validation accuracy
    set = {"train.rounds" = 5}               # applied to every cell, after the axes

    [grid]                                   # one axis per config key, each a list of values
    "data.alpha" = [0.05, 0.5]
    seed = [0, 1, 2]
    terms = [[], [{name = "decorrelation", beta = 0.1}]]   # whole [[terms]] variants

    [variants.method]                        # a named axis: each label sets several keys at once
    fedavg = {algorithm = {name = "fedavg"}}
    feddecorr = {algorithm = {name = "feddecorr", beta = 0.1}, "train.lr" = 0.01}

``[[overrides]]`` tables (``where = {axis = label}``, ``set = {key = value}``) change the matching
cells only (e.g. a learning rate tuned per method and setting). ``[published]`` may also be a
matrix: ``rows``/``columns`` name two axes, ``labels`` the column labels, and ``[published.values]``
one list per row label of ``value`` or ``[value, std]``.

A key is a dotted config key (``"train.lr"``) setting one value, or a section name (``algorithm``,
``data``, ``terms``) replacing the whole section. Cells are the product of the axes (variants
first, in file order, then the grid; ``seed`` last), applied in that order, then ``set``, then
the matching ``[[overrides]]``. ``[[unavailable]]`` tables (``where = {axis = label}``,
``reason = "..."``) mark cells that cannot run yet (in the full version only, unless
``also_quick = true``: a missing method rather than missing data), and ``[[published]]`` tables
(``where``, ``value``, optional ``std``) hold a paper's numbers. ``[quick]`` (``base``, ``set``,
``grid``, ``variants`` replace or add to the full ones; ``only = {axis = [labels]}`` keeps some
cells, a list of such tables the cells any of them keeps; ``compare = {axis = {quick label = paper label}}``) is the reduced version that
``fedlatent reproduce --quick`` runs; ``[cpu]``, with the same keys and a ``budget`` line, is the
real-data tier (``fedlatent reproduce --tier cpu``): the paper's data at a budget two CPU cores
finish, with the budget stated beside every table it produces. A tier's ``[[TIER.overrides]]`` apply
after the full version's. A ``where`` value may be a list of labels. Cells whose
labels differ only in ``seed`` form a group whose mean ± std the tables show.

A variant label may name a shipped configuration, ``{config = "feduv/cifar100_a0.01.toml"}``
(relative to the shipped ``configs/``, :data:`CONFIGS`): the label then sets every section of that file,
then its own keys, so a table's settings are written once, in the configs users run directly. The
reproduce specs use this, and a copy of a spec runs under ``fedlatent sweep`` as it is.
"""
from __future__ import annotations

import copy
import itertools
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedlatent.config import RunConfig, from_dict
from fedlatent.errors import ConfigError, unknown_key
from fedlatent.methods import resolve

TIERS = ("quick", "cpu")  # the reduced versions a study may carry, each a table of TIER_KEYS
STUDY_KEYS = {"title", "description", "paper", "base", "set", "grid", "variants", "select", "metric",
              "unavailable", "published", "name", "overrides", *TIERS}
TIER_KEYS = {"base", "set", "grid", "variants", "compare", "note", "only", "budget", "overrides"}
SELECT = ("last", "val")
METRICS = ("accuracy", "balanced_accuracy", "personalized_accuracy")
# The shipped configurations: package data (``fedlatent/configs``, in a checkout a link to the
# repository's ``configs/``), so an installed package finds them from any working directory.
CONFIGS = Path(__file__).parents[2] / "configs"  # studies/ → experiment/ → fedlatent/


@dataclass
class Axis:
    """One dimension of the grid: a name and its labelled settings (dotted key → value)."""

    name: str
    labels: list[str]
    settings: list[dict[str, Any]]


@dataclass
class Cell:
    """One run of a study: its labels per axis, its configuration and its run directory name."""

    labels: dict[str, str]
    config: RunConfig
    name: str
    unavailable: str = ""

    @property
    def group(self) -> tuple[tuple[str, str], ...]:
        """The labels without the seed: cells that differ only in seed share a group."""
        return tuple((k, v) for k, v in self.labels.items() if k != "seed")


@dataclass
class Study:
    """A parsed study: its cells and what the tables need to know about them."""

    title: str
    axes: list[Axis]
    cells: list[Cell]
    select: str = "last"
    metric: str = "accuracy"
    published: list[dict[str, Any]] = field(default_factory=list)
    compare: dict[str, str] = field(default_factory=dict)
    note: str = ""
    paper: str = ""
    tier: str = "full"
    budget: str = ""

    def published_for(self, group: tuple[tuple[str, str], ...]) -> dict[str, Any] | None:
        """The published entry whose ``where`` labels all match this group's labels, read through
        ``compare`` (quick label → the paper's label it stands for, per axis)."""
        labels = dict(group)
        for axis, mapping in self.compare.items():
            labels[axis] = mapping.get(labels.get(axis), labels.get(axis)) if isinstance(mapping, dict) else mapping
        for entry in self.published:
            if all(labels.get(k) == v for k, v in entry["where"].items()):
                return entry
        return None


def _read_toml(path: Path, what: str) -> dict:
    if not path.is_file():
        raise ConfigError(f"{what} {path} not found")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML ({err})") from None


def load_study(path: str | Path, *, tier: str = "full") -> Study:
    """Read a study file (see the module docstring) and expand it into validated cells, in its full
    version or one of its reduced ``TIERS``."""
    path = Path(path)
    return parse_study(_read_toml(path, "study file"), path.parent, tier=tier, where=str(path))


def _config_sections(name: Any, where: str) -> dict:
    """A shipped config's top-level keys and sections, as a variant label sets them (whole sections)."""
    if not isinstance(name, str):
        raise ConfigError(f"{where}: config = {name!r}: expected a path under configs/, e.g. \"feduv/stl10_a1.toml\"")
    path = CONFIGS / name
    if not path.is_file():
        raise ConfigError(f"{where}: config {name!r} not found under {CONFIGS}")
    return _read_toml(path, "config")


def with_configs(raw: dict, *, tier: str = "full", where: str = "study") -> dict:
    """``raw`` with each ``config = ...`` variant label (of the full version and of the reduced
    ``tier``) replaced by that config's sections followed by the label's other keys. Axes a reduced
    tier replaces are left alone in that tier (their configs name data that the reduced version
    does not read)."""
    raw = copy.deepcopy(raw)
    reduced = raw.get(tier) if tier in TIERS else None
    tier_variants = reduced.get("variants", {}) if isinstance(reduced, dict) else {}
    variants = raw.get("variants", {})
    if not isinstance(variants, dict) or not isinstance(tier_variants, dict):
        return raw  # refused by parse_study with its own message
    tables = [(f"variants.{axis}", table) for axis, table in variants.items() if axis not in tier_variants]
    tables += [(f"{tier}.variants.{axis}", table) for axis, table in tier_variants.items()]
    for name, table in tables:
        if not isinstance(table, dict):
            continue
        for label, settings in table.items():
            if isinstance(settings, dict) and "config" in settings:
                rest = {k: v for k, v in settings.items() if k != "config"}
                table[label] = {**_config_sections(settings["config"], f"{where}: {name}.{label}"), **rest}
    return raw


def _base(raw: Any, folder: Path, where: str) -> dict:
    if raw is None:
        return {}
    if isinstance(raw, str):
        return _read_toml(folder / raw, f"{where}: base config")
    if isinstance(raw, dict):
        return copy.deepcopy(raw)
    raise ConfigError(f"{where}: base must be a path to a config file or a table of config sections")


def set_key(doc: dict, key: str, value: Any, where: str) -> None:
    """Set a dotted config key (``train.lr``) or replace a whole section (``algorithm``) in ``doc``."""
    parts = key.split(".")
    node = doc
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {key}: {part} is not a section")
    node[parts[-1]] = copy.deepcopy(value)


def _label(value: Any) -> str:
    """A short readable label of a grid value: scalars as written, term lists by their names."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float, str)):
        return f"{value:g}" if isinstance(value, float) else str(value)
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return "+".join(str(v.get("name", "?")) for v in value) or "none"
    if isinstance(value, dict) and "name" in value:
        return str(value["name"])
    return "-".join(_label(v) for v in value) if isinstance(value, list) else "value"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+_-]", "_", text)


def _axes(grid: dict, variants: dict, where: str) -> list[Axis]:
    axes = []
    if not isinstance(variants, dict) or not all(isinstance(v, dict) and v for v in variants.values()):
        raise ConfigError(f"{where}: [variants.NAME] must be tables of label = {{key = value, ...}}")
    for name, table in variants.items():
        if not all(isinstance(s, dict) for s in table.values()):
            raise ConfigError(f"{where}: variants.{name}: each label must be a table of keys to set")
        axes.append(Axis(name, [_safe(l) for l in table], list(table.values())))
    if not isinstance(grid, dict):
        raise ConfigError(f"{where}: [grid] must be a table of key = [values]")
    for key, values in sorted(grid.items(), key=lambda kv: kv[0] == "seed"):
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: grid.{key} must be a non-empty list of values")
        labels = [_safe(_label(v)) for v in values]
        if len(set(labels)) < len(labels):
            labels = [f"{l}{i}" for i, l in enumerate(labels)]
        axes.append(Axis(key, labels, [{key: v} for v in values]))
    names = [a.name for a in axes]
    if len(set(names)) < len(names):
        raise ConfigError(f"{where}: axis {names[0]!r} appears in both [grid] and [variants]")
    return axes


def _short(axes: list[Axis]) -> dict[str, str]:
    """Axis names in run directory names: the last dotted part unless two axes share it."""
    last = [a.name.split(".")[-1] for a in axes]
    return {a.name: (s if last.count(s) == 1 else _safe(a.name)) for a, s in zip(axes, last)}


def parse_study(raw: dict, folder: Path, *, tier: str = "full", where: str = "study") -> Study:
    """Expand a parsed study document (its ``config = ...`` labels first) in its full version or the
    reduced version ``tier``; every cell's configuration is validated (method included)."""
    if tier != "full" and tier not in TIERS:
        raise ConfigError(f"{where}: tier {tier!r}: allowed values are full, {', '.join(TIERS)}")
    raw = with_configs(raw, tier=tier, where=where)
    unknown = sorted(set(raw) - STUDY_KEYS)
    if unknown:
        raise ConfigError(f"{where}: {unknown_key(unknown[0], sorted(STUDY_KEYS), 'a study')}")
    quick = tier != "full"
    q = raw.get(tier, {}) if quick else {}
    if quick and not q:
        raise ConfigError(f"{where}: no [{tier}] version")
    if not isinstance(q, dict) or set(q) - TIER_KEYS:
        raise ConfigError(f"{where}: [{tier}] takes only {', '.join(sorted(TIER_KEYS))}")
    base = _base(q.get("base", raw.get("base")), folder, where)
    variants = {**raw.get("variants", {}), **q.get("variants", {})}
    grid = {**raw.get("grid", {}), **q.get("grid", {})}
    common = {**raw.get("set", {}), **q.get("set", {})}
    select = raw.get("select", "last")
    if select not in SELECT:
        raise ConfigError(f"{where}: select = {select!r}: allowed values are {', '.join(SELECT)}")
    metric = raw.get("metric", "accuracy")
    if metric not in METRICS:
        raise ConfigError(f"{where}: metric = {metric!r}: allowed values are {', '.join(METRICS)}")
    axes = _axes(grid, variants, where)
    short = _short(axes)
    unavailable = [u for u in raw.get("unavailable", []) if not quick or u.get("also_quick", False)]
    cells, names = [], set()
    for combo in itertools.product(*[range(len(a.labels)) for a in axes]):
        labels = {a.name: a.labels[i] for a, i in zip(axes, combo)}
        if not _kept(q.get("only", {}), labels):
            continue
        doc = copy.deepcopy(base)
        for a, i in zip(axes, combo):
            for key, value in a.settings[i].items():
                set_key(doc, key, value, f"{where}: {a.name} = {a.labels[i]}")
        for key, value in common.items():
            set_key(doc, key, value, f"{where}: set")
        for o in [*raw.get("overrides", []), *q.get("overrides", [])]:
            if _matches(o.get("where", {}), labels):
                for key, value in o.get("set", {}).items():
                    set_key(doc, key, value, f"{where}: overrides")
        name = "_".join(f"{short[a.name]}-{labels[a.name]}" for a in axes) or "run"
        if name in names:
            raise ConfigError(f"{where}: two cells share the run directory {name}")
        names.add(name)
        try:
            config = from_dict(doc)
            resolve(config.algorithm, config.terms)
        except ConfigError as err:
            raise ConfigError(f"{where}: cell {name}: {err}") from None
        reason = next((u.get("reason", "not runnable yet") for u in unavailable
                       if _matches(u.get("where", {}), labels)), "")
        cells.append(Cell(labels, config, name, reason))
    return Study(raw.get("title", raw.get("name", "")), axes, cells, select, metric,
                 _published(raw.get("published", []), where), q.get("compare", {}), q.get("note", ""),
                 raw.get("paper", ""), tier, q.get("budget", ""))


def _kept(only: dict[str, Any] | list[dict[str, Any]], labels: dict[str, str]) -> bool:
    """Whether a tier's ``only`` keeps a cell: one ``where`` table, or a list of them (their union)."""
    return any(_matches(w, labels) for w in only) if isinstance(only, list) else _matches(only, labels)


def _matches(where: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether labels match ``where``: each axis's label equals the value (or is in it, for a list)."""
    return all(labels.get(k) in v if isinstance(v, list) else labels.get(k) == v for k, v in where.items())


def _published(raw: Any, where: str) -> list[dict[str, Any]]:
    """Published numbers as a list of ``{where, value, std}`` (the matrix form unrolled)."""
    if isinstance(raw, list):
        return raw
    try:
        entries = []
        for row, values in raw["values"].items():
            if len(values) != len(raw["labels"]):
                raise ConfigError(f"{where}: published.values.{row}: {len(values)} values for {len(raw['labels'])} labels")
            for column, v in zip(raw["labels"], values):
                if v is not None and v != "-":
                    value, std = (v[0], v[1]) if isinstance(v, list) else (v, None)
                    entries.append({"where": {raw["rows"]: row, raw["columns"]: column}, "value": value, "std": std})
        return entries
    except (KeyError, TypeError, AttributeError):
        raise ConfigError(f"{where}: [published] must be a list of {{where, value}} or a matrix with rows, "
                          f"columns, labels and values") from None
