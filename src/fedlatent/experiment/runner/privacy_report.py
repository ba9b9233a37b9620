"""What a private run says of its guarantee: ε on the terminal and in ``summary.json``, what its
randomness means for whom ε holds, and a line when ε is too large to mean anything.

An (ε, δ) guarantee bounds how much more likely any outcome becomes when one participant's data is
swapped, by the factor e^ε. Past ε = 10 that factor exceeds 2·10⁴: the bound no longer rules out an
observer telling the two apart with near certainty (Dwork & Roth 2014, §2.3, read ε as "a small
constant"; deployed systems stay at or below it), so the run warns that the number is not a
privacy guarantee in any useful sense.
"""
from __future__ import annotations

from typing import Any

from fedlatent.config import RunConfig
from fedlatent.federated.randomness import SEEDED, noised, resolve

MEANINGFUL_EPSILON = 10.0  # above it ε is reported with a warning that it protects nothing in practice
EPSILON_KEYS = ("privacy_epsilon", "sample_level_epsilon")  # client-level DP-FedAvg's, sample-level DP-SGD's
SEEDED_NOTE = ("privacy.randomness = 'seeded': the noise and the client selection follow from the run's seed, so "
               "epsilon holds only against observers who do not hold that seed (set privacy.randomness = 'secret')")


def private(summary_or_line: dict[str, Any]) -> bool:
    """Whether a summary or metrics line reports an ε."""
    return any(key in summary_or_line for key in EPSILON_KEYS)


def summary_fields(config: RunConfig, summary: dict[str, Any]) -> dict[str, Any]:
    """The privacy fields a private run's ``summary.json`` adds: ``privacy_randomness`` (secret or
    seeded, ``auto`` resolved) and, when seeded, ``privacy_note`` (for whom ε holds)."""
    if not private(summary):
        return {}
    mode = resolve(config.privacy.randomness, config.backend, noised(config.privacy))
    return {"privacy_randomness": mode, **({"privacy_note": SEEDED_NOTE} if mode == SEEDED else {})}


def epsilon_text(value: float) -> str:
    """ε as the terminal shows it: three significant digits, or the power of ten past 10⁴."""
    return f"{value:.3g}" if value < 1e4 else f"{value:.2e}"


def terminal_lines(summary: dict[str, Any]) -> list[str]:
    """The lines a private run's end prints on stderr: the seeded run's note, and a warning per ε
    above :data:`MEANINGFUL_EPSILON`."""
    lines = []
    if summary.get("privacy_note"):
        lines.append(f"fedlatent: note: {summary['privacy_note']}")
    for key, delta in (("privacy_epsilon", "privacy_delta"), ("sample_level_epsilon", "sample_level_delta")):
        value = summary.get(key)
        if value is not None and value > MEANINGFUL_EPSILON:
            lines.append(f"fedlatent: warning: {key} = {epsilon_text(value)} at delta = {summary.get(delta):g} is above "
                         f"{MEANINGFUL_EPSILON:g}: e^epsilon > 2e4 bounds nothing in practice; this run is not private "
                         "in any useful sense (raise privacy.noise_multiplier or lower train.rounds)")
    return lines
