"""fedlatent: federated learning on heterogeneous clients, with representation-space remedies.

Stable entry points: :func:`load_config` and :func:`run`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fedlatent.config import RunConfig, load_config

__version__ = "0.1.0"


def run(config: RunConfig, out: str | Path | None = None, *, resume: bool = False,
        progress: bool = False) -> dict[str, Any]:
    """Run one configuration and return its summary (the content of ``summary.json``)."""
    from fedlatent.experiment import run as run_experiment
    return run_experiment(config, out, resume=resume, progress=progress, echo=None)


__all__ = ["load_config", "run", "RunConfig", "__version__"]
