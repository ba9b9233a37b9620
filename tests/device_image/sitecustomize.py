"""Imported at start-up by a Python process whose ``PYTHONPATH`` holds this folder: the packages that
a lent GPU machine's image lacks (``benchmarks/README.md``, "What the device machine has") cannot be
imported, as there, so that a test on this machine finds a top-level import of one of them before a
lease spends its minutes on it. ``FEDLATENT_HIDDEN_PACKAGES`` (comma-separated) replaces the list."""
from __future__ import annotations

import os
import sys

# installed here with fedlatent or its extras, absent from the device image
ABSENT = ("quadprog", "flwr", "dp_accounting", "datasets", "mlflow", "wandb", "ray")


class _Hidden:
    """A meta-path finder that answers every import of a hidden package with ModuleNotFoundError."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = frozenset(names)

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden: not on the device image)", name=name)
        return None


_names = os.environ.get("FEDLATENT_HIDDEN_PACKAGES")
sys.meta_path.insert(0, _Hidden(tuple(n for n in _names.split(",") if n) if _names is not None else ABSENT))
