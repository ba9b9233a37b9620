"""Floating-point operations of a model's forward and backward pass, per sample.

Counted by torch's :class:`~torch.utils.flop_counter.FlopCounterMode` (matrix multiplications and
convolutions, 2 FLOPs per multiply-add, as FLOP tables such as SphereFed's cost table (Table 1)
count them; element-wise operations, normalisation and the loss are not counted) on a copy of the
model and a batch of two zero samples, once per model instance, sample shape and set of trainable
parameters (the backward pass computes no gradient for a frozen layer's weights): both passes are
linear in the batch size, so per-sample costs times samples give a round's count.

Example::

    >>> from fedlatent.models.mlp import build
    >>> per_sample_flops(build((1, 8, 8), 10, hidden=[32]), (1, 8, 8))  # 2·(64·32 + 32·10), 2·64·32 + 4·32·10
    (4736, 5376)
"""
from __future__ import annotations

import copy
import weakref

import torch
from torch.utils.flop_counter import FlopCounterMode

from fedlatent.models.base import FedModel

_CACHE: "weakref.WeakKeyDictionary[FedModel, dict]" = weakref.WeakKeyDictionary()


def per_sample_flops(model: FedModel, sample_shape: tuple[int, ...]) -> tuple[int, int]:
    """(forward, backward) FLOPs of one sample of ``sample_shape`` through ``model`` in training mode,
    the backward pass with the model's current trainable parameters; ``model`` is not touched."""
    trainable = frozenset(n for n, p in model.named_parameters() if p.requires_grad)
    key = (tuple(sample_shape), trainable)
    counts = _CACHE.setdefault(model, {})
    if key not in counts:
        probe = copy.deepcopy(model).train()
        x = torch.zeros((2, *sample_shape), device=next(model.parameters()).device)
        with torch.enable_grad():
            with FlopCounterMode(display=False) as forward:
                logits = probe(x).logits
            with FlopCounterMode(display=False) as backward:
                if logits.requires_grad:
                    logits.sum().backward()
        counts[key] = (forward.get_total_flops() // 2, backward.get_total_flops() // 2)
    return counts[key]
