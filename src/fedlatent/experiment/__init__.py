"""Experiments, in rooms that import only the rooms below them: one run end to end (:mod:`.runner`, its
:func:`run` re-exported here); studies over many runs (:mod:`.studies`) and measurement (:mod:`.tooling`) build on it."""
from __future__ import annotations

from fedlatent.experiment.runner.single import BACKENDS, default_out, fedlatent_version, prepare, run, write_partition

__all__ = ["BACKENDS", "default_out", "fedlatent_version", "prepare", "run", "write_partition"]
