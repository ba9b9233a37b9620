"""``train.precision``: the arithmetic of local training — float32, or mixed precision under
``torch.autocast`` (bfloat16, or float16 with dynamic loss scaling) — resolved for a device, checked
before any data is read, and the autocast the client trainer runs its forward and loss under.

Mixed precision (Micikevicius et al. 2018) keeps float32 master weights, gradients, optimiser state,
uploads and aggregation; only the forward's matrix products and convolutions (and their backward)
run in 16 bits. ``"auto"`` is bfloat16 on a CUDA device that supports it (Ampere and later:
``torch.cuda.is_bf16_supported()``), float32 elsewhere, so CPU runs keep their numbers.
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve(name: str, device: torch.device | str) -> str:
    """The concrete precision ``name`` means on ``device``: ``"auto"`` → ``"bf16"`` on a CUDA device
    that supports bfloat16, else ``"fp32"``; any other name as it is."""
    if name != "auto":
        return name
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def refusal(name: str, device: torch.device | str) -> str | None:
    """Why local training cannot run in precision ``name`` on ``device`` (a few words), or None."""
    dtype = DTYPES.get(resolve(name, device))
    if dtype is None:
        return None
    kind = torch.device(device).type
    if not torch.amp.is_autocast_available(kind):
        return f"torch has no autocast for device type '{kind}'; use 'fp32'"
    if kind == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return "this CUDA device does not support bfloat16 (torch.cuda.is_bf16_supported()); use 'fp16' or 'fp32'"
    return None


def autocast(name: str, device: torch.device) -> AbstractContextManager:
    """The context local training's forward and loss run in: ``torch.autocast`` to the precision's
    16-bit type on ``device``'s type, or nothing for ``"fp32"``."""
    dtype = DTYPES[name]
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def scales_loss(name: str) -> bool:
    """Whether ``name`` trains with a dynamic loss scale (float16's narrow range: small gradients
    underflow to zero unless the loss is scaled up)."""
    return name == "fp16"
