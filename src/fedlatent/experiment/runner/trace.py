"""``diagnostics.trace_terms``: every local step's task loss and loss terms, one JSON line each.

The ablation figures of the papers plot each term of the local objective step by step (FedUV's
L_U and L_V, FedDecorr's penalty, a Ditto constraint). With the key on, the client records, at
each step, the task loss and every part's unweighted term (the values the ``term_*`` columns of
``metrics.jsonl`` average; Ditto's personal step under ``personal_task``, ``personal_<term>``) in
its upload, and :class:`TermTrace` appends them to ``terms_trace.jsonl`` in the run directory:
``{"round": r, "client": i, "step": k, "task": …, "<term>": …}`` (non-finite values as null).
Recording reads detached copies only, so the weights are bit-identical with it off.

:class:`TermTrace` wraps the embedded backends' trainer (the round loop calls it once per round,
failed rounds included); on Flower the server hands it each round's uploads, which carry the
nodes' traces (:meth:`TermTrace.record`). A resumed run continues after the rounds already in ``metrics.jsonl``,
which the backend has cut to its checkpoint before the first round; later lines of the trace are
dropped then, as they are from ``metrics.jsonl``.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from fedlatent.backends.simulation import Trainer
from fedlatent.methods.parts import Upload

FILE = "terms_trace.jsonl"


class TermTrace:
    """A trainer that runs ``trainer`` and appends its uploads' step traces to ``out/terms_trace.jsonl``
    (without a trainer: :meth:`record` alone, told each round's outcomes)."""

    def __init__(self, trainer: Trainer | None, out: Path) -> None:
        self.trainer, self.out = trainer, out
        self.round: int | None = None

    def __call__(self, *args: Any) -> list:
        assert self.trainer is not None, "a trace without a trainer is told the outcomes (record)"
        outcomes = self.trainer(*args)
        self.record(outcomes)
        return outcomes

    def record(self, outcomes: list) -> None:
        """Append one round's uploads' step traces (the rounds counted from the first call on)."""
        if self.round is None:
            self.round = self._rounds_done()
        self.round += 1
        lines = [json.dumps({"round": self.round, "client": outcome.client_id, "step": k,
                             **{name: v if math.isfinite(v) else None for name, v in values.items()}})
                 for outcome in outcomes if isinstance(outcome, Upload)
                 for k, values in enumerate(outcome.trace, start=1)]
        with (self.out / FILE).open("a") as sink:
            sink.write("".join(line + "\n" for line in lines))

    def _rounds_done(self) -> int:
        """Rounds already run (a resume): the lines of ``metrics.jsonl``; the trace is cut to them."""
        metrics, path = self.out / "metrics.jsonl", self.out / FILE
        done = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
        if path.is_file():
            kept = [line for line in path.read_text().splitlines() if json.loads(line)["round"] <= done]
            path.write_text("".join(line + "\n" for line in kept))
        return done
