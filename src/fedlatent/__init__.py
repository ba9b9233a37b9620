"""fedlatent: federated learning on heterogeneous clients, with representation-space remedies.

Stable entry points: :func:`load_config` and :func:`run`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from fedlatent import config as _config
from fedlatent.config import RunConfig, load_config

__version__ = "0.1.0"


def _check_registered(config: RunConfig) -> None:
    """Names and own keys of the model, data set and partition, checked on every loaded config.

    ``config`` is the bottom layer and cannot import the registries; the package face plugs them
    in (imported here on first use, so ``import fedlatent`` stays light)."""
    from fedlatent.data.registry import check as check_data
    from fedlatent.models.registry import check as check_model
    config.data.options = check_data(config.data)
    config.model.options = check_model(config.model)


def _registered_choices() -> str:
    from fedlatent.data.registry import DATASETS, PARTITIONS
    from fedlatent.models.registry import MODELS
    return "\n".join(r.describe() for r in (DATASETS, PARTITIONS, MODELS))


_config.add_check(_check_registered, _registered_choices)


def run(config: RunConfig, out: str | Path | None = None, *, resume: bool = False,
        progress: bool = False) -> dict[str, Any]:
    """Run one configuration and return its summary (the content of ``summary.json``)."""
    from fedlatent.experiment import run as run_experiment
    return run_experiment(config, out, resume=resume, progress=progress, echo=None)


__all__ = ["load_config", "run", "RunConfig", "__version__"]
