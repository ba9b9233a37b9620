"""Experiments: one run end to end (:mod:`.single`); studies over many runs build on it."""
from __future__ import annotations

from fedlatent.experiment.single import BACKENDS, default_out, fedlatent_version, prepare, run, write_partition

__all__ = ["BACKENDS", "default_out", "fedlatent_version", "prepare", "run", "write_partition"]
