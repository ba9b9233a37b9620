"""A SuperNode's own terms: what its clients require of any run, set by whoever runs the node
(Flower's ``--node-config``), not by the ServerApp — so that a dishonest or misconfigured server
that asks for less gets a refusal instead of clear uploads or features.

Node-config keys (all optional; absent: no term):

- ``require-secagg = true``: every update and statistics upload leaves masked (SecAgg+); a run whose
  configuration has ``privacy.secure_aggregation = "off"``, or a train / statistics message without
  a SecAgg+ session record, is refused.
- ``max-clip-norm = C``: client-level DP with the clients' clip norm at most C (the node clips with
  the configuration's clip norm, so a larger one, or none, is refused).
- ``min-noise-multiplier = s``: the configuration's ``privacy.noise_multiplier`` at least s. Under
  central DP the noise is the server's: the node checks what the server declares, and cannot see
  whether it adds it (docs/privacy.md, "Threat model"); under distributed DP with SecAgg+ the node
  adds its clients' shares of it itself.
- ``answer-census``, ``answer-tsne``, ``answer-diagnostics`` (default true): whether the node answers
  the data census (its clients' split sizes and label counts), t-SNE (its clients' features) and
  the client diagnostics (statistics of its clients' splits under the models sent).

A refusal is an error reply (Flower's ``Error``, code :data:`REFUSED`) whose reason names the term,
logged on the node; the ServerApp turns one into a ``ConfigError`` (exit 2), the run's settings and
the node's terms being the user's to reconcile.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from fedlatent.config import RunConfig

REFUSED = 53  # the error code of a node's refusal (Flower's Error.code)
PREFIX = "node terms: "  # the reason's start, which the ServerApp recognises
QUERIES = {"query.census": "census", "query.tsne": "tsne", "query.diagnostics": "diagnostics"}
MASKED = ("train", "query.statistics")  # the messages whose uploads SecAgg+ masks
_LOG = logging.getLogger("flwr")


def _flag(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class NodeTerms:
    """A node's terms, from its node config (:func:`terms_of`)."""

    require_secagg: bool = False
    max_clip_norm: float = math.inf
    min_noise_multiplier: float = 0.0
    answers: frozenset[str] = frozenset(QUERIES.values())

    def run_refusal(self, config: RunConfig) -> str | None:
        """Why the node refuses a run of ``config`` (the term it breaks), or None."""
        p, d = config.privacy, config.diagnostics
        if self.require_secagg and p.secure_aggregation == "off":
            return "require-secagg = true, but the run sends clear uploads (privacy.secure_aggregation = 'off')"
        if p.clip_norm > self.max_clip_norm:
            return f"max-clip-norm = {self.max_clip_norm:g}, but the run clips at privacy.clip_norm = {p.clip_norm:g}"
        if p.noise_multiplier < self.min_noise_multiplier:
            return (f"min-noise-multiplier = {self.min_noise_multiplier:g}, but the run's privacy.noise_multiplier = "
                    f"{p.noise_multiplier:g}")
        if "tsne" in d.which and "tsne" not in self.answers:
            return "answer-tsne = false, but the run asks for t-SNE of the clients' features (diagnostics.which)"
        if d.which and d.clients and "diagnostics" not in self.answers:
            return "answer-diagnostics = false, but the run asks for client diagnostics (diagnostics.clients = true)"
        return None

    def message_refusal(self, message_type: str, masked: bool) -> str | None:
        """Why the node refuses a message of ``message_type`` (``masked``: it carries a SecAgg+ session)."""
        query = QUERIES.get(message_type)
        if query is not None and query not in self.answers:
            return f"answer-{query} = false: this node does not answer {message_type}"
        if self.require_secagg and message_type in MASKED and not masked:
            return f"require-secagg = true, but {message_type} came without a SecAgg+ session (a clear upload)"
        return None


def terms_of(node_config: dict[str, Any]) -> NodeTerms:
    """The terms a node config states (absent keys: none)."""
    return NodeTerms(require_secagg=_flag(node_config.get("require-secagg", False)),
                     max_clip_norm=float(node_config.get("max-clip-norm", math.inf)),
                     min_noise_multiplier=float(node_config.get("min-noise-multiplier", 0.0)),
                     answers=frozenset(q for q in QUERIES.values() if _flag(node_config.get(f"answer-{q}", True))))


def refusal(node_config: dict[str, Any], message_type: str, masked: bool, config: RunConfig) -> str | None:
    """The node's refusal of a message (its type, whether masked) of a run of ``config``, logged on the
    node with the term it enforces; None when the terms hold."""
    terms = terms_of(node_config)
    reason = terms.message_refusal(message_type, masked) or terms.run_refusal(config)
    if reason is not None:
        _LOG.error("fedlatent: %s%s", PREFIX, reason)
        return PREFIX + reason
    return None


def is_refusal(reason: str) -> bool:
    """Whether an error reply's reason is a node's refusal."""
    return reason.startswith(PREFIX)
