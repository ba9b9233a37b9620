"""The pieces a method is composed of (ARCHITECTURE.md, "How a method is composed").

A method is a :class:`MethodSpec`: a task loss, a list of :class:`Part` objects, a head policy,
the client's program (:mod:`fedlatent.methods.program`: plain local training, or a personalisation)
and an optional after-training calibration. The types themselves live in
:mod:`fedlatent.methods.spec` (which this module's face re-exports); here are the task loss every
part and program shares and the names of a model's trainable weights.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.nn import functional as F

from fedlatent.losses.amp import in_float32
from fedlatent.methods.spec import (HEAD_INITS, Calibration, ClientRound, Combine, HeadPolicy, LockstepContext,
                                    MethodSpec, Part, Tensors, TermContext, Upload, WithClientAxis, vmap_loss)

__all__ = ["HEAD_INITS", "Calibration", "ClientRound", "Combine", "HeadPolicy", "LockstepContext", "MethodSpec",
           "Part", "Tensors", "TermContext", "Upload", "WithClientAxis", "task_loss", "trainable_names", "vmap_loss"]


@functools.cache
def _identity(num_classes: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The C×C identity whose rows are the one-hot targets (built once, not once per step)."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.eye(num_classes, dtype=dtype, device=device)


@in_float32
def task_loss(kind: str, logits: Tensor, y: Tensor, reduction: str = "mean", temperature: float = 1.0) -> Tensor:
    """Cross-entropy of ``logits / temperature``, or SphereFed's MSE (1/C)‖logits − onehot(y)‖²
    averaged over the batch (``reduction="none"``: per sample for cross-entropy, per sample and
    class for MSE, so that their mean is the default value). The temperature T is SphereFed's
    scaling τ·Wz with τ = 1/T (Sec. 4.3, the "CE + Fix(OU) + Norm" row of Table 3). ``logits``
    (batch, classes), or stacked clients' (clients, batch, classes) with ``y`` (clients, batch):
    their cross-entropy takes the log-softmax along the middle axis (a view), which on the CPU
    is ~10× faster than along a last axis of a few classes."""
    if kind == "mse":  # rows of a cached identity: F.one_hot validates the labels with two host syncs per call
        target = _identity(logits.shape[-1], logits.dtype, logits.device)[y]
        return F.mse_loss(logits, target, reduction=reduction)
    scaled = logits if temperature == 1.0 else logits / temperature
    return F.cross_entropy(scaled.transpose(1, 2) if scaled.dim() == 3 else scaled, y, reduction=reduction)


def trainable_names(model: torch.nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]
