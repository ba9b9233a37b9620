"""What each backend honours, declared once: the features a run may ask for that not every backend
carries (or did not: those the table shows honoured everywhere were once refused somewhere), the
backends that do, and for the others the reason in a few words. The run's checks
(``experiment.runner.validation.check_capabilities``) refuse with one wording for every backend
(:func:`refusal`), and ``docs/backends.md``'s table is generated from here (:func:`table`;
``tests/test_capabilities.py`` walks it against what validation refuses). A feature not listed
works on every backend: the client trainer and the run driver are shared.

``auto`` honours what ``simulation`` does: it chooses ``vectorized`` only for a run that trains in
lockstep and falls back to ``simulation`` otherwise (``backends.auto.choose``)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedlatent.backends import vectorized
from fedlatent.config import UNBOUNDED, RunConfig
from fedlatent.methods.parts import MethodSpec

BACKENDS = ("simulation", "vectorized", "auto", "flower")
# the backends whose clients train in this process: the run's device and precision are this machine's
IN_PROCESS = frozenset({"simulation", "vectorized", "auto"})
# what a backend checks of the method itself (a ConfigError naming the reason): the vectorized
# backend's lockstep forms (a copy not stacked, a constraint without a lockstep form); auto runs
# such a method on simulation instead
METHOD_CHECKS: dict[str, Callable[[RunConfig, MethodSpec], None]] = {"vectorized": vectorized.check}
# the optional extra a backend needs: (the module it installs, what it is, the extra)
EXTRAS = {"flower": ("flwr", "Flower", "fedlatent[flower]")}


@dataclass(frozen=True)
class Feature:
    """A feature a run asks for by ``key``: ``asked`` gives the value it asks with, or None when the
    run does not ask for it (None for a feature asked for outside the run's keys: a study's stacked
    cells). ``honoured``: the backends that carry it; ``why_not``: the reason, by backend, for each
    of the others."""

    name: str
    key: str
    asked: Callable[[RunConfig], Any] | None
    honoured: tuple[str, ...]
    why_not: dict[str, str]

    def __post_init__(self) -> None:
        missing = set(BACKENDS) - set(self.honoured) - set(self.why_not)
        assert not missing, f"feature {self.name!r} states no reason for {sorted(missing)}"


def _if(condition: Callable[[RunConfig], bool], value: Callable[[RunConfig], Any]) -> Callable[[RunConfig], Any]:
    return lambda c: value(c) if condition(c) else None


NO_MASKING_PARTIES = "SecAgg+'s parties are Flower's clients (the embedded backends have none to mask)"

FEATURES: tuple[Feature, ...] = (
    Feature("sample-level DP-SGD", "privacy.sample_clip_norm",
            _if(lambda c: math.isfinite(c.privacy.sample_clip_norm), lambda c: c.privacy.sample_clip_norm),
            BACKENDS, {}),
    Feature("held-out clients", "data.holdout_clients",
            _if(lambda c: bool(c.data.holdout_clients), lambda c: c.data.holdout_clients), BACKENDS, {}),
    Feature("step trace", "diagnostics.trace_terms",
            _if(lambda c: c.diagnostics.trace_terms, lambda c: True), BACKENDS, {}),
    Feature("SecAgg+", "privacy.secure_aggregation",
            _if(lambda c: c.privacy.secure_aggregation != "off", lambda c: c.privacy.secure_aggregation),
            ("flower",),
            {b: NO_MASKING_PARTIES for b in ("simulation", "vectorized", "auto")}),
    Feature("compiled forward", "train.compile",
            _if(lambda c: c.train.compile, lambda c: True),
            ("simulation", "auto", "flower"),
            {"vectorized": "the vectorized backend trains in lockstep, which is not compiled (measured slower)"}),
    Feature("client-state store", "train.client_state_memory",
            lambda c: None if c.train.client_state_memory == UNBOUNDED else c.train.client_state_memory,
            ("simulation", "vectorized", "auto"),
            {"flower": "its nodes keep their clients' states (Flower's Context.state)"}),
    Feature("a study's runs trained in one stack", "stacked cells", None,
            ("simulation", "vectorized", "auto"),
            {"flower": "its clients train on its own nodes, not in a stack of runs"}),
)
BY_KEY = {f.key: f for f in FEATURES}


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else repr(value)


def refusal(feature: Feature, backend: str, value: Any = None) -> str | None:
    """The one line refusing ``feature`` (asked for with ``value``) on ``backend``, or None where the
    backend honours it: ``<key> = <value> (<feature>): honoured on backend = <...> only, not
    <backend> (<why>)``."""
    if backend in feature.honoured:
        return None
    asked = feature.key if value is None else f"{feature.key} = {_value(value)}"
    honoured = ", ".join(repr(b) for b in feature.honoured)
    return f"{asked} ({feature.name}): honoured on backend = {honoured} only, not {backend!r} ({feature.why_not[backend]})"


def refusals(config: RunConfig) -> list[str]:
    """The refusals of every feature ``config`` asks for that its backend does not honour."""
    found = []
    for feature in FEATURES:
        value = feature.asked(config) if feature.asked is not None else None
        if value is not None:
            reason = refusal(feature, config.backend, value)
            if reason:
                found.append(reason)
    return found


def table() -> str:
    """The Markdown table of what each backend honours (docs/backends.md's, generated)."""
    lines = ["| feature | key | " + " | ".join(f"`{b}`" for b in BACKENDS) + " |",
             "|---|---|" + "---|" * len(BACKENDS)]
    for f in FEATURES:
        key = f"`{f.key}`" if f.asked is not None else f.key
        cells = ["yes" if b in f.honoured else "no" for b in BACKENDS]
        lines.append(f"| {f.name} | {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
