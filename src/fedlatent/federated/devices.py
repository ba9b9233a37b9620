"""Whether a run can train on the torch device its configuration names, on this machine, and
what the run sets up on that device (the model's memory layout, cuDNN's autotuner).

Checked before any data is read, so that ``train.device = "cuda"`` on a machine without a CUDA
device (or a typo) fails with one line instead of a stack trace from the first batch."""
from __future__ import annotations

from typing import TypeVar

import torch
from torch import Tensor

from fedlatent.data.transfer import to_device

M = TypeVar("M", bound=torch.nn.Module)


def refusal(name: str) -> str | None:
    """Why ``name`` cannot be trained on here (a few words), or None when it can."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as error:
        return f"not a torch device ({str(error).splitlines()[0]})"
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            return "this machine has no CUDA device that torch can use"
        if device.index is not None and device.index >= count:
            return f"this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
        return None
    if device.type == "mps":
        return None if torch.backends.mps.is_available() else "this machine has no MPS device that torch can use"
    return f"device type '{device.type}' is not supported (use 'cpu', 'cuda' or 'mps')"


# The layout and cuDNN settings of a training device: kept only where they pay on a GPU (to be
# measured there with `fedlatent bench --device cuda`); one line each to switch them off.
CHANNELS_LAST = frozenset({"cuda"})     # device types whose convolutional models train channels_last
CUDNN_BENCHMARK = frozenset({"cuda"})   # device types that let cuDNN time its algorithms per input shape


def channels_last(device: torch.device | str) -> bool:
    """Whether convolutional models and their image batches are held channels_last (NHWC) on ``device``."""
    return torch.device(device).type in CHANNELS_LAST


def convolutional(model: torch.nn.Module) -> bool:
    """Whether ``model`` has a 2-D convolution (the layers channels_last speeds up)."""
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def laid_out(model: M, on: bool) -> M:
    """``model`` with its 4-D weights channels_last when ``on`` and it is convolutional (in place)."""
    return model.to(memory_format=torch.channels_last) if on and convolutional(model) else model  # type: ignore[call-overload]


def batch_layout(x: Tensor, on: bool) -> Tensor:
    """A 4-D image batch channels_last when ``on`` (the same values, other strides), else as it is."""
    return x.contiguous(memory_format=torch.channels_last) if on and x.dim() == 4 else x


def prepare(model: M, device: torch.device | str) -> M:
    """The run's model on ``device`` with that device's layout, and cuDNN's autotuner on where it
    pays: ``torch.backends.cudnn.benchmark`` picks each convolution's fastest algorithm for the
    run's input shapes (the same shapes every step), at the price of bitwise repeatability."""
    if torch.device(device).type in CUDNN_BENCHMARK:
        torch.backends.cudnn.benchmark = True
    return laid_out(model.to(device), channels_last(device))


def upload(values: list | Tensor, device: torch.device | str, dtype: torch.dtype | None = None) -> Tensor:
    """Small host values (Python numbers or a CPU tensor: a step's positions, group rows, batch
    sizes) as a tensor on ``device``, without waiting for it
    (:func:`fedlatent.data.transfer.to_device`). ``dtype``: by default the values' own (int64 for
    integers)."""
    return to_device(torch.as_tensor(values, dtype=dtype), device)


def generator(device: torch.device | str) -> torch.Generator:
    """A generator that draws on ``device`` (its own kind on an accelerator; the CPU's for the CPU
    and for the ``meta`` device, which draws no values)."""
    kind = torch.device(device).type
    return torch.Generator() if kind in ("cpu", "meta") else torch.Generator(device=device)
