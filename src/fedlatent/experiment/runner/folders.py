"""A run's folder: its default name, one per configuration, and what ``--resume`` finds there.

The default name is readable (data set, partition, method, seed) and ends in a short digest of the
resolved settings, so that changing any setting and running again makes a new folder instead of
colliding with the first run, while the same configuration always names the same folder (and
``--resume`` without ``--out`` finds it).
"""
from __future__ import annotations

import hashlib
import json
import tomllib
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedlatent.config import RunConfig, to_toml, toml_value
from fedlatent.errors import ConfigError

@dataclass(frozen=True)
class Terms:
    """How a refusal names the run's folder and the resume option: the CLI's flags, or
    :func:`fedlatent.run`'s arguments."""

    out: str
    resume: str


PYTHON_TERMS = Terms(out="out", resume="resume=True")
CLI_TERMS = Terms(out="--out", resume="--resume")
TERMS: ContextVar[Terms] = ContextVar("TERMS", default=PYTHON_TERMS)  # the CLI sets CLI_TERMS

DIGEST_CHARS = 6  # 16^6 ≈ 1.7e7 names: two configurations of one data set, method and seed collide with ~6e-8


def partition_tag(config: RunConfig) -> str:
    """The partition in a few characters: ``iid``, ``dirichlet0.05``, ``shards2``, ``given``."""
    d = config.data
    return {"dirichlet": f"dirichlet{d.alpha:g}", "shards": f"shards{d.classes_per_client}"}.get(d.partition, d.partition)


def settings_digest(config: RunConfig) -> str:
    """The first :data:`DIGEST_CHARS` hex digits of the SHA-256 of the resolved configuration as
    written to the run's ``config.toml`` (:func:`~fedlatent.config.to_toml`)."""
    return hashlib.sha256(to_toml(config).encode()).hexdigest()[:DIGEST_CHARS]


def default_out(config: RunConfig) -> Path:
    """``runs/<dataset>-<partition>-<algorithm>-seed<seed>-<digest>``, e.g.
    ``runs/digits-dirichlet0.05-fedavg-seed0-3f9a1c`` (:func:`settings_digest`)."""
    return Path("runs") / (f"{config.data.dataset}-{partition_tag(config)}-{config.algorithm['name']}"
                           f"-seed{config.seed}-{settings_digest(config)}")


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A parsed TOML document as dotted key → value (``train.lr``, ``terms[0].mu``, ``tracking.tags.team``)."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, item in enumerate(value):
                flat.update(flatten(item, f"{name}[{i}]."))
        else:
            flat[name] = value
    return flat


def differences(started: str, now: str) -> list[str]:
    """Each key whose value differs between two configurations' TOML texts, in the order the keys
    are written: ``train.rounds 20 → 5`` (TOML values; ``(unset)`` where one lacks the key)."""
    old, new = flatten(tomllib.loads(started)), flatten(tomllib.loads(now))
    shown = lambda flat, key: toml_value(flat[key]) if key in flat else "(unset)"  # noqa: E731
    keys = list(old) + [k for k in new if k not in old]
    return [f"{k} {shown(old, k)} → {shown(new, k)}" for k in keys if k not in old or k not in new or old[k] != new[k]]


def check_same_config(config: RunConfig, config_toml: Path) -> int | None:
    """Refuse to resume the run whose ``config.toml`` this is with another configuration: one
    line naming every key that differs, with both values. One difference is allowed: a larger
    ``train.rounds``, which extends the run (returned: the rounds it was started with; else None);
    and ``train.client_state_memory`` may change, which changes no number (a run killed for its
    memory resumes within a budget)."""
    resume = TERMS.get().resume
    try:
        text = config_toml.read_text()
        changed = [c for c in differences(text, to_toml(config)) if not c.startswith("train.client_state_memory ")]
        started = flatten(tomllib.loads(text)).get("train.rounds")
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{resume}: {config_toml} is not valid TOML ({err})") from None
    if len(changed) == 1 and changed[0].startswith("train.rounds ") and isinstance(started, int):
        if config.train.rounds > started:
            return started
        raise ConfigError(f"{resume}: train.rounds = {config.train.rounds}: fewer than the {started} rounds the run in "
                          f"{config_toml.parent} was started with; a run extends, it does not shorten")
    if changed:
        raise ConfigError(f"{resume}: the configuration differs from the one in {config_toml}: {', '.join(changed)}"
                          " (only a larger train.rounds may differ: it extends the run)")
    return None


def extension_note(started: int, rounds: int) -> str:
    """What a run extended from ``started`` to ``rounds`` rounds is, and is not."""
    return (f"note: extending the run from {started} to {rounds} rounds (train.rounds; every other key as it started): "
            f"rounds {started + 1}-{rounds} continue from round {started}'s checkpoint. Where a key depends on "
            f"train.rounds (a learning-rate schedule over the rounds), rounds 1-{started} ran under {started}, so the "
            f"result is not that of a {rounds}-round run from the start")


def completed(config: RunConfig, out: Path) -> dict[str, Any] | None:
    """The summary of the run in ``out`` when it completed all ``config.train.rounds`` rounds, else None."""
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    done = summary.get("status") == "completed" and summary.get("rounds_completed") == config.train.rounds
    return summary if done else None
