"""A study's cells checked as their runs check them (:mod:`fedlatent.experiment.runner.validation`), before
any cell's folder exists or any cell trains: what ``fedlatent check STUDY``, a sweep and ``reproduce`` do first."""
from __future__ import annotations

from typing import Any

from fedlatent.data.federation import outline
from fedlatent.data.types import Outline
from fedlatent.errors import ConfigError
from fedlatent.experiment.runner.validation import check_fit, validate
from fedlatent.experiment.studies.study import Study

__all__ = ["validate_study"]


def validate_study(study: Study, where: str = "", *, data: bool = True) -> None:
    """Every runnable cell of ``study`` validated as its run validates it (:func:`~fedlatent.experiment.runner.validation.validate`,
    and with ``data`` :func:`~fedlatent.experiment.runner.validation.validate_data`): what ``fedlatent check``
    and a sweep do before anything runs; the first failure names its cell. Cells that share their data
    read them once; cells that share their ``[data]`` and data seed share one outline (one partition made)."""
    read: dict[Any, Any] = {}
    outlines: dict[str, Outline] = {}
    for cell in study.cells:
        if not cell.unavailable:
            try:
                spec = validate(cell.config)
                if data:
                    key = repr((cell.config.data, cell.config.data_seed))
                    if key not in outlines:
                        outlines[key] = outline(cell.config.data, cell.config.data_seed, read)
                    check_fit(cell.config, spec, outlines[key])
            except ConfigError as err:
                raise ConfigError(f"{where}cell {cell.name}: {err}") from None
