"""The papers' settings as data: one TOML table per paper (``settings/<paper>.toml``) giving, for every
key a cell of the paper's ``reproduce`` specs or one of its shipped configs sets, the value, the
paper's words with the seed text's line (``ditto-mmd.txt:305``), or ``stated = false`` with the
choice made and why.

:func:`mismatches` resolves every cell of the paper's specs (their full version) and every config its
table maps to a cell, and lists each key whose value differs from the table, each key a cell sets
away from fedlatent's defaults that the table does not declare, and each entry no cell uses.
:func:`render` writes the table as the markdown section of ``configs/AUDIT.md`` between the markers
``<!-- settings:NAME -->`` and ``<!-- /settings:NAME -->``; ``python -m fedlatent.experiment.studies.settings``
rewrites those sections in place.

An entry applies to the cells whose labels match its ``where`` (axis = label or a list of labels; no
``where``: every cell); when several apply to a key, the last in the file wins. A cell without an axis
(a spec that does not vary it, a shipped config) has the label ``""`` for it: ``where = {model = ["",
"resnet50"]}`` matches the cells with no ``model`` axis and the ``resnet50`` ones. ``seed_file`` is the
paper's text, or a list of its texts (a main text and its supplement); each ``source`` names its file.
Every cell of a spec also has the label ``spec`` (the spec's name: ``where = {spec = "spherefed_table6"}``);
a shipped config has the labels ``[configs]`` gives it, ``spec`` among them if its entries need one.
"""
from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedlatent.config import RunConfig, from_dict, load_config, show_value
from fedlatent.errors import ConfigError, unknown_key
from fedlatent.methods import flat_settings
from fedlatent.experiment.studies.study import CONFIGS

__all__ = ["Entry", "Table", "expected", "load", "mismatches", "names", "render", "update_audit"]

FOLDER = Path(__file__).resolve().parent
ENTRY_KEYS = {"key", "where", "value", "source", "says", "stated", "choice", "why"}
TABLE_KEYS = {"paper", "seed_file", "specs", "not_settings", "configs", "excluded", "setting"}


@dataclass
class Entry:
    """One setting: ``key`` = ``value`` in the cells ``where`` matches; stated (``source``, ``says``) or
    not (``choice``, ``why``)."""

    key: str
    value: Any
    where: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    says: str = ""
    stated: bool = True
    choice: str = ""
    why: str = ""

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k, "") in v if isinstance(v, list) else labels.get(k, "") == v for k, v in self.where.items())


@dataclass
class Table:
    """A paper's settings table (see the module docstring)."""

    name: str
    paper: str
    seed_file: str | list[str]
    specs: list[str]
    entries: list[Entry]
    not_settings: dict[str, str] = field(default_factory=dict)
    configs: dict[str, dict[str, str]] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)


def names() -> list[str]:
    """The papers with a settings table."""
    return sorted(p.stem for p in FOLDER.glob("*.toml"))


def _entry(raw: dict[str, Any], where: str) -> Entry:
    unknown = sorted(set(raw) - ENTRY_KEYS)
    if unknown or "key" not in raw or "value" not in raw:
        raise ConfigError(f"{where}: an entry needs key and value and takes only {', '.join(sorted(ENTRY_KEYS))}")
    entry = Entry(**raw)
    if entry.stated and not (entry.source and entry.says):
        raise ConfigError(f"{where} ({entry.key}): a stated setting needs source (file:line) and says (the words)")
    if not entry.stated and not (entry.choice and entry.why):
        raise ConfigError(f"{where} ({entry.key}): stated = false needs choice and why")
    return entry


def load(name: str) -> Table:
    """The settings table ``settings/<name>.toml``, each entry checked for its fields."""
    path = FOLDER / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"settings: no table {name!r}; known: {', '.join(names())}")
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    unknown = sorted(set(raw) - TABLE_KEYS)
    if unknown:
        raise ConfigError(f"{path.name}: {unknown_key(unknown[0], sorted(TABLE_KEYS), 'a settings table')}")
    entries = [_entry(e, f"{path.name}: setting {i}") for i, e in enumerate(raw.get("setting", []))]
    return Table(name, raw["paper"], raw["seed_file"], raw["specs"], entries, raw.get("not_settings", {}),
                 raw.get("configs", {}), raw.get("excluded", {}))


def expected(table: Table, labels: dict[str, str]) -> dict[str, Entry]:
    """The entry that applies to each key for a cell with these labels (the last matching one)."""
    found: dict[str, Entry] = {}
    for entry in table.entries:
        if entry.matches(labels):
            found[entry.key] = entry
    return found


def defaults(config: RunConfig) -> dict[str, Any]:
    """fedlatent's defaults for ``config``'s data set, model and method: what a cell 'sets' differs from them."""
    return flat_settings(from_dict({"data": {"dataset": config.data.dataset}, "model": {"arch": config.model.arch},
                                    "algorithm": {"name": config.algorithm["name"]}}))


def _same(a: Any, b: Any) -> bool:
    return show_value(a) == show_value(b) if isinstance(a, (bool, str, list)) or isinstance(b, (bool, str, list)) else a == b


def compare(table: Table, labels: dict[str, str], config: RunConfig, what: str) -> list[str]:
    """The mismatches of one resolved cell against the table (one line each)."""
    flat, base, rules = flat_settings(config), defaults(config), expected(table, labels)
    problems = [f"{what}: {key} = {show_value(flat.get(key, '<unset>'))}, the table says {show_value(e.value)} "
                f"({e.source or 'not stated: ' + e.choice})" for key, e in rules.items() if not _same(flat.get(key), e.value)]
    undeclared = [k for k, v in flat.items() if k not in rules and k not in table.not_settings
                  and not (k in base and _same(base[k], v))]
    problems += [f"{what}: {k} = {show_value(flat[k])} is set but not declared in settings/{table.name}.toml" for k in undeclared]
    return problems


def _shipped(table: Table) -> list[tuple[str, dict[str, str]]]:
    """The paper's configs under configs/ that the table maps or excludes; a config it does neither is an error."""
    folders = sorted({name.split("/")[0] for name in [*table.configs, *table.excluded]})
    shipped = sorted(str(p.relative_to(CONFIGS)) for f in folders for p in (CONFIGS / f).glob("*.toml"))
    missing = [n for n in shipped if n not in table.configs and not any(fnmatch.fnmatch(n, x) for x in table.excluded)]
    if missing:
        raise ConfigError(f"settings/{table.name}.toml: config {missing[0]} is neither in [configs] nor [excluded]")
    return [(name, labels) for name, labels in table.configs.items()]


def mismatches(table: Table) -> list[str]:
    """Every difference between the table and the cells of its specs and its configs (empty: they agree)."""
    from fedlatent.experiment.studies.reproduce import load_spec
    problems: list[str] = []
    used: set[int] = set()
    cells = [(f"{spec} {c.name}", {"spec": spec, **c.labels}, c.config) for spec in table.specs for c in load_spec(spec).cells]
    cells += [(f"configs/{name}", labels, load_config(CONFIGS / name)) for name, labels in _shipped(table)]
    for what, labels, config in cells:
        problems += compare(table, labels, config, what)
        used |= {i for i, e in enumerate(table.entries) if e.matches(labels)}
    problems += [f"settings/{table.name}.toml: setting {i} ({e.key}, where {e.where}) applies to no cell"
                 for i, e in enumerate(table.entries) if i not in used]
    return problems


def _where(entry: Entry) -> str:
    def labels(axis: str, v: str | list[str]) -> str:
        return ", ".join(x or f"(no {axis} axis)" for x in (v if isinstance(v, list) else [v]))
    return "; ".join(f"{k}: {labels(k, v)}" for k, v in entry.where.items()) or "every cell"


def render(table: Table) -> str:
    """The table as markdown: one row per entry (key, cells, value, source and the paper's words, or
    'not stated' with the choice and why)."""
    seeds = [table.seed_file] if isinstance(table.seed_file, str) else table.seed_file
    texts = " and ".join(f"`../shared/papers/{f}`" for f in seeds)
    rows = [f"### {table.paper}: settings (generated from `src/fedlatent/experiment/studies/settings/{table.name}.toml`)", "",
            f"Specs: {', '.join(f'`{s}`' for s in table.specs)}; configs: {len(table.configs)} files "
            f"({', '.join(sorted({n.split('/')[0] + '/' for n in table.configs}))}). Line numbers refer to "
            f"{texts}. `tests/test_settings.py` fails on any cell that differs.", "",
            "| key | cells | value | source | the paper's words, or the choice and why |", "|---|---|---|---|---|"]
    for e in table.entries:
        source, words = (e.source, e.says) if e.stated else ("not stated", f"{e.choice}: {e.why}")
        rows.append(f"| `{e.key}` | {_where(e)} | `{show_value(e.value)}` | {source} | {words.replace('|', '/')} |")
    rows += ["", "Not the paper's settings: " + "; ".join(f"`{k}` ({v})" for k, v in table.not_settings.items()) + "."]
    rows += [f"Not compared: `{k}` ({v})." for k, v in table.excluded.items()]
    return "\n".join(rows)


def update_audit(text: str) -> str:
    """``configs/AUDIT.md``'s text with each ``<!-- settings:NAME -->`` … ``<!-- /settings:NAME -->``
    section replaced by :func:`render` of that table."""
    for name in names():
        begin, end = f"<!-- settings:{name} -->", f"<!-- /settings:{name} -->"
        if begin not in text or end not in text:
            raise ConfigError(f"configs/AUDIT.md: no section {begin} … {end}")
        head, rest = text.split(begin, 1)
        text = f"{head}{begin}\n{render(load(name))}\n{end}{rest.split(end, 1)[1]}"
    return text


def main() -> None:
    """Rewrite the generated sections of ``configs/AUDIT.md``."""
    path = CONFIGS / "AUDIT.md"
    path.write_text(update_audit(path.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {path}")
