"""What a worker of a study runs: one cell, or one stack of cells, into its run folder(s) — the same
function whichever executor (in process, ``--jobs`` worker processes, a Ray task) runs it, so the
numbers do not depend on where a cell ran."""
from __future__ import annotations

from pathlib import Path

from fedlatent.config import RunConfig
from fedlatent.errors import UserInputError
from fedlatent.experiment.runner.single import run
from fedlatent.experiment.studies.stacking import run_stack


def run_cell(config: RunConfig, out: str, figures: bool = True) -> str:
    """Run (or continue) one cell (``figures``: see :func:`fedlatent.experiment.runner.single.run`);
    returns "" on success, else the error's one-line message."""
    import torch
    torch.set_num_threads(config.train.threads)
    try:
        run(config, Path(out), resume=(Path(out) / "config.toml").is_file(), echo=None, figures=figures)
    except UserInputError as err:
        return str(err)
    except Exception as err:  # noqa: BLE001 - one failed cell must not stop the others
        return f"{type(err).__name__}: {err}"
    return ""


def run_unit(configs: list[RunConfig], outs: list[str], figures: bool = True) -> list[str]:
    """Run one cell (:func:`run_cell`) or a stack of cells (:func:`~fedlatent.experiment.studies.stacking.run_stack`);
    each cell's "" on success, else its error's one line."""
    if len(configs) == 1:
        return [run_cell(configs[0], outs[0], figures)]
    return run_stack(configs, outs, figures)
