"""Aggregation arithmetic shared by the server and the parts that replace its mean."""
from __future__ import annotations

import torch

from fedlatent.methods.parts import Tensors, Upload


def weighted_mean(uploads: list[Upload], keys: list[str] | None = None) -> Tensors:
    """Sample-count-weighted mean of the uploaded states; integer buffers are rounded back."""
    total = float(sum(u.num_samples for u in uploads))
    keys = list(uploads[0].state) if keys is None else keys
    out: Tensors = {}
    for key in keys:
        first = uploads[0].state[key]
        acc = torch.zeros_like(first, dtype=torch.float64 if first.dtype == torch.float64 else torch.float32)
        for u in uploads:
            acc += u.state[key].to(acc.dtype) * (u.num_samples / total)
        out[key] = acc.to(first.dtype) if first.is_floating_point() else acc.round().to(first.dtype)
    return out
