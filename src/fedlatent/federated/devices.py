"""Whether a run can train on the torch device its configuration names, on this machine.

Checked before any data is read, so that ``train.device = "cuda"`` on a machine without a CUDA
device (or a typo) fails with one line instead of a stack trace from the first batch."""
from __future__ import annotations

import torch


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
