"""Which cells of a study train as one lockstep stack (:mod:`fedlatent.backends.stacked`), and how many.

Cells stack when they differ only in what changes a client's data or starting weights, or what
scales its terms: the seed, the data seed, the partition (Dirichlet α, classes per client), the
method's coefficients (FedProx's μ, FedDecorr's β, Ditto's λ, …: :mod:`fedlatent.methods.coefficients`)
— the same model, method otherwise, local settings, number of clients and data set, on an embedded
backend, with a method that trains in lockstep. ``--stack auto`` stacks on a CUDA device as many cells as an
estimate of their memory lets fit in half of the device's free memory (none on a CPU, where the
cells' own backends already keep the cores busy; ``benchmarks/stacked_cells.py`` measures it); ``--stack N`` stacks up to N cells
anywhere; ``off`` (or 1) never.
"""
from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path

import torch

from fedlatent.backends.stacked import Cohort
from fedlatent.config import RunConfig, TrackingConfig, to_toml
from fedlatent.errors import ConfigError, UserInputError
from fedlatent.experiment.runner.single import run
from fedlatent.experiment.runner.validation import declared_shape
from fedlatent.federated.trainer import unsupported
from fedlatent.federated.round import clients_per_round
from fedlatent.methods import resolve
from fedlatent.methods.coefficients import method_shape
from fedlatent.models import build_model

EMBEDDED = ("auto", "simulation", "vectorized")
FREE_SHARE = 0.5  # of the device's free memory a stack may plan to use (the estimate is rough)


def parse_stack(text: str) -> int | str:
    """``--stack``'s value: ``auto``, ``off`` or a positive number of cells."""
    if text in ("auto", "off"):
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UserInputError(f"--stack {text}: expected auto, off or a positive number of cells")
    return value


def stack_key(config: RunConfig) -> str | None:
    """What a cell shares with the cells it may stack with (its configuration but the seeds and the
    partition, its method but the coefficients: :func:`~fedlatent.methods.coefficients.method_shape`),
    or None when it trains alone (Flower, a method without a lockstep form, partial personalisation)."""
    if config.backend not in EMBEDDED:
        return None
    spec = resolve(config.algorithm, config.terms)
    if unsupported(spec) is not None or not spec.personalization.stacks_runs:
        return None
    data = dataclasses.replace(config.data, seed=-1, partition="", alpha=0.0, classes_per_client=0)
    rest = dataclasses.replace(config, seed=0, data=data, tracking=TrackingConfig(), algorithm={}, terms=[])
    return f"{to_toml(rest)}\n# method\n{method_shape(spec)}"


def stacks(configs: dict[str, RunConfig], stack: int | str) -> list[list[str]]:
    """The cells (by name, in the given order) grouped into stacks of cells that share a
    :func:`stack_key`, each at most as large as ``stack`` allows (:func:`stack_size`); a cell that
    stacks with none is a stack of one."""
    groups: dict[str, list[str]] = {}
    units: list[list[str]] = []
    for name, config in configs.items():
        key = stack_key(config) if stack not in ("off", 1) else None
        if key is None:
            units.append([name])
            continue
        if key not in groups:
            groups[key] = []
            units.append(groups[key])
        groups[key].append(name)
    out: list[list[str]] = []
    for unit in units:
        size = stack_size(configs[unit[0]], stack) if len(unit) > 1 else 1
        out += [unit[i:i + size] for i in range(0, len(unit), size)]
    return out


def stack_size(config: RunConfig, stack: int | str) -> int:
    """How many cells like ``config`` one stack holds: ``stack`` when a number; for ``auto``, on a
    CUDA device, as many as :func:`client_bytes` says fit in :data:`FREE_SHARE` of its free
    memory; else 1."""
    if isinstance(stack, int):
        return stack
    device = torch.device(config.train.device)
    if stack != "auto" or device.type != "cuda" or not torch.cuda.is_available():
        return 1
    need = client_bytes(config)
    if need is None:
        return 1
    clients = clients_per_round(config.data.num_clients or 10, config.train.participation)
    free, _ = torch.cuda.mem_get_info(device)
    return max(1, int(FREE_SHARE * free // (need * clients)))


def client_bytes(config: RunConfig) -> int | None:
    """A rough upper estimate of one stacked client's device memory: its weights, gradients and two
    optimiser slots (float32), and a batch's activations kept for the backward (every module's output,
    float32, counted on the meta device) — None when the data set declares no input shape."""
    shape = declared_shape(config.data)
    if shape is None:
        return None
    input_shape, num_classes = shape
    with torch.device("meta"):
        model = build_model(dataclasses.replace(config.model, weights=""), input_shape, num_classes,
                            config.data.dataset)
        elements = [0]
        hooks = [m.register_forward_hook(lambda _m, _i, out: elements.__setitem__(
            0, elements[0] + (out.numel() if isinstance(out, torch.Tensor) else 0))) for m in model.modules()]
        try:
            model(torch.zeros((1, *input_shape)))
        finally:
            for hook in hooks:
                hook.remove()
    params = sum(p.numel() for p in model.parameters())
    return 4 * (4 * params + config.train.batch_size * elements[0])


def run_stack(configs: list[RunConfig], outs: list[str], figures: bool = True) -> list[str]:
    """Run (or continue) the cells ``configs`` into ``outs`` as one stack; each cell's "" on success,
    else its error's one line (as :func:`fedlatent.experiment.studies.units.run_cell`)."""
    torch.set_num_threads(configs[0].train.threads)
    cohort = Cohort(len(configs))
    # each run's figures drawn in this process when it ends (the figure process serves one run at a time)
    results = cohort.play([partial(run, config, Path(out), resume=(Path(out) / "config.toml").is_file(), echo=None,
                                   figures=figures, figures_in_background=False, trainer=cohort.trainer)
                           for config, out in zip(configs, outs)])
    return [_error(result) for result in results]


def _error(result: object) -> str:
    if not isinstance(result, BaseException):
        return ""
    if isinstance(result, (UserInputError, ConfigError)):
        return str(result)
    return f"{type(result).__name__}: {result}"
