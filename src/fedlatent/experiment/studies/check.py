"""``fedlatent check CONFIG|SPEC``: validate a run configuration or a study (a ``reproduce`` spec by
name, or a study file) without training or creating any folder — every check ``fedlatent run`` (or a
sweep, for each cell of a study) makes before it trains: those that need no data
(:func:`fedlatent.experiment.runner.validation.validate`) and those on the data's outline, its labels and
counts rather than its samples (:func:`fedlatent.experiment.runner.validation.validate_data`; ``data=False``,
``--no-data``: without these, to read a spec's settings where its data are not) — and print its
resolved settings.

A configuration prints every key after defaults, one ``key = value`` line each: the sections'
fields and the model's and data set's own keys (:func:`fedlatent.config.to_dict`), then the method's
keys after the preset's and the parts' defaults (``algorithm.*``, ``terms[i].*``:
:func:`fedlatent.methods.resolved_keys`). A study prints the keys common to every cell as such lines,
then one table row per cell with a column for each key whose value differs between cells. Any invalid
input raises :class:`fedlatent.errors.UserInputError` (the CLI: one line, exit 2).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedlatent.analysis.tables import markdown_table
from fedlatent.config import (SECTIONS, RunConfig, apply_overrides, from_dict, load_config, read_toml, show_value,
                              to_dict)
from fedlatent.errors import ConfigError, UserInputError
from fedlatent.experiment.studies import reproduce
from fedlatent.experiment.studies.study import Study, load_study
from fedlatent.experiment.runner.validation import validate, validate_data
from fedlatent.experiment.studies.preflight import validate_study
from fedlatent.methods import flat_settings

__all__ = ["check", "load_target"]


def _is_config(path: Path) -> bool:
    """Whether the TOML file is a run configuration (only config sections at its top level) rather
    than a study file."""
    return set(read_toml(path, "check:")) <= set(SECTIONS)


def load_target(target: str, *, tier: str = "full", overrides: Sequence[str] = (),
                data: bool = True) -> RunConfig | Study:
    """``target`` as a configuration (a TOML file of config sections), a study file, or a spec name
    (``fedlatent reproduce --list``), validated (``data``: the data's checks too); ``overrides``
    (``--set`` texts) apply to the configuration or to every cell, last."""
    path = Path(target)
    if path.is_file() and _is_config(path):
        if tier != "full":
            raise UserInputError(f"check {target}: --tier {tier} applies to a spec or study, not to a configuration")
        config = load_config(path, overrides)
        spec = validate(config)
        if data:
            validate_data(config, spec)
        return config
    if path.is_file():
        study = load_study(path, tier=tier)
        for cell in study.cells:
            try:
                cell.config = from_dict(apply_overrides(to_dict(cell.config), overrides))
            except ConfigError as err:
                raise ConfigError(f"{target}: cell {cell.name}: {err}") from None
    elif target in reproduce.spec_names():
        study = reproduce.load_spec(target, tier=tier, overrides=overrides)
    else:
        raise UserInputError(f"check: {target!r} is neither a file nor a spec name (specs: "
                             f"{', '.join(reproduce.spec_names())})")
    validate_study(study, f"{target}: ", data=data)
    return study


def _lines(settings: dict[str, Any]) -> list[str]:
    width = max((len(k) for k in settings), default=0)
    return [f"{k:<{width}} = {show_value(v)}" for k, v in settings.items()]


def config_text(config: RunConfig, target: str) -> str:
    """Every resolved key of a configuration, one line each."""
    return "\n".join([f"{target}: a valid configuration; every key after defaults:", *_lines(flat_settings(config))])


def study_text(study: Study, target: str) -> str:
    """The keys common to every cell, then a table of the cells and the keys that differ."""
    flats = [flat_settings(c.config) for c in study.cells]
    keys = list(dict.fromkeys(k for flat in flats for k in flat))
    differ = [k for k in keys if len({show_value(f[k]) if k in f else None for f in flats}) > 1]
    common = {k: flats[0][k] for k in keys if k not in differ} if flats else {}
    blocked = any(c.unavailable for c in study.cells)
    header = ["cell", *differ, *(["not runnable yet"] if blocked else [])]
    rows = [[c.name, *(show_value(f[k]) if k in f else "-" for k in differ), *([c.unavailable or ""] if blocked else [])]
            for c, f in zip(study.cells, flats)]
    tier = "" if study.tier == "full" else f" ({study.tier} tier)"
    return "\n".join([f"{target}{tier}: {study.title or 'study'}: {len(study.cells)} valid cells; axes "
                      f"{' × '.join(a.name for a in study.axes) or '-'}",
                      f"keys common to every cell ({len(common)}):", *("  " + line for line in _lines(common)),
                      f"keys that differ between cells ({len(differ)}), one row per cell:",
                      markdown_table(header, rows)])


def check(target: str, *, tier: str = "full", overrides: Sequence[str] = (), data: bool = True) -> str:
    """Validate ``target`` (see :func:`load_target`) and return its resolved settings as text."""
    loaded = load_target(target, tier=tier, overrides=overrides, data=data)
    return config_text(loaded, target) if isinstance(loaded, RunConfig) else study_text(loaded, target)
