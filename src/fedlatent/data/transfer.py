"""Small host tensors (a batch's draws, positions, maps) sent to the training device without
waiting for them: a copy from pageable host memory to a CUDA device synchronises the stream (the
host would wait for every queued kernel, each step), so on CUDA the tensor goes through pinned
memory, asynchronously; elsewhere it is a plain copy (none on the CPU)."""
from __future__ import annotations

import torch
from torch import Tensor


def to_device(t: Tensor, device: torch.device | str) -> Tensor:
    """``t`` (a host tensor) on ``device``, without waiting for the copy on CUDA."""
    if torch.device(device).type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
