"""Which CUDA device each running cell of a study trains on, when the machine has several.

A cell whose ``train.device`` is ``"cuda"`` — the device type alone — lets the study place it: under
``--jobs N`` on a machine with several CUDA devices each unit (a cell or a stack) starts on the device
the fewest running units use (:class:`Shares`), so N workers on D devices use each ⌈N/D⌉ or ⌊N/D⌋
times, and the cell's ``config.toml`` records the device it trained on (``train.device = "cuda:1"``).
A cell naming an index (``"cuda:1"``) keeps it. Where a cell trains does not change what it computes,
so a cell resumed on another device than it started on continues its run: the recorded device is
moved to the new one (:func:`settle`) — the one key of ``config.toml`` that may differ on resume.
"""
from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import torch

from fedlatent.config import RunConfig, to_toml
from fedlatent.experiment.runner.single import as_started
from fedlatent.federated.state import write_atomically

PLACEABLE = "cuda"  # the device a cell names to let the study choose among the machine's CUDA devices


def cuda_count() -> int:
    """How many CUDA devices torch sees here (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class Shares:
    """The machine's ``count`` CUDA devices shared among the running units: :meth:`take` gives the
    device the fewest running units use (the lowest index on a tie), :meth:`give` returns it."""

    def __init__(self, count: int) -> None:
        self.use = [0] * count

    def take(self) -> str:
        index = min(range(len(self.use)), key=lambda i: (self.use[i], i))
        self.use[index] += 1
        return f"cuda:{index}"

    def give(self, device: str) -> None:
        self.use[int(device.split(":")[1])] -= 1


def placeable(configs: list[RunConfig]) -> bool:
    """Whether the study may choose these cells' device (each names ``"cuda"`` alone)."""
    return all(c.train.device == PLACEABLE for c in configs)


def placed(config: RunConfig, device: str) -> RunConfig:
    """``config`` training on ``device`` (a placeable cell only; any other unchanged)."""
    if config.train.device != PLACEABLE or device == config.train.device:
        return config
    return dataclasses.replace(config, train=dataclasses.replace(config.train, device=device))


def recorded_device(config_toml: Path) -> str | None:
    """The ``train.device`` a run's ``config.toml`` records (None without one, or unreadable)."""
    try:
        train = tomllib.loads(config_toml.read_text()).get("train", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    device = train.get("device", "cpu") if isinstance(train, dict) else None
    return device if isinstance(device, str) else None


def as_recorded(config: RunConfig, config_toml: Path) -> RunConfig:
    """A placeable cell's ``config`` on the CUDA device its run's ``config.toml`` records (the run
    started there), so that comparing the two files ignores where the cell was placed."""
    device = recorded_device(config_toml)
    if config.train.device != PLACEABLE or device is None or device.split(":")[0] != "cuda":
        return config
    return placed(config, device)


def settle(config: RunConfig, out: Path) -> None:
    """Before a placed cell continues the run in ``out`` on ``config.train.device``: where the run's
    ``config.toml`` records another CUDA device and nothing else different, record the new one (the
    run then resumes there). Any other difference is left for the run's own check to name."""
    path = out / "config.toml"
    device = recorded_device(path)
    if device is None or device == config.train.device or config.train.device.split(":")[0] != "cuda" \
            or device.split(":")[0] != "cuda":
        return
    before = dataclasses.replace(config, train=dataclasses.replace(config.train, device=device))
    if path.read_text() == to_toml(as_started(before, path)):
        write_atomically(path, to_toml(as_started(config, path)))
