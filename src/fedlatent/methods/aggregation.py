"""Aggregation arithmetic shared by the server and the parts that replace its mean."""
from __future__ import annotations

import torch

from fedlatent.methods.parts import Combine, Tensors, Upload


def weighted_mean(uploads: list[Upload], keys: list[str] | None = None,
                  weights: list[float] | None = None) -> Tensors:
    """Sample-count-weighted mean of the uploaded states (FedAvg's, McMahan et al. 2017, Algorithm 1:
    Σ_k n_k/n · w_k), or Σ_k c_k · w_k with the coefficients ``weights`` when given (FedNova's
    p_k/a_k, FedDyn's 1/K); accumulated in float32 (float64 for float64 tensors), integer buffers
    rounded back.

    A tensor whose uploads are the rows of one stack, each row once in any order (the vectorized
    backend's uploads: views of its trained stack), is summed in one product over the client axis,
    one operator instead of three per client: the same value up to float rounding (the summation
    order differs). Every caller (the server's mean, FedNova's and FedDyn's) takes it."""
    if weights is None:
        total = float(sum(u.num_samples for u in uploads))
        weights = [u.num_samples / total for u in uploads]
    keys = list(uploads[0].state) if keys is None else keys
    out: Tensors = {}
    for key in keys:
        values = [u.state[key] for u in uploads]
        first = values[0]
        dtype = torch.float64 if first.dtype == torch.float64 else torch.float32
        stacked = stack_rows(values)
        if stacked is not None:
            base, where = stacked
            by_row = [0.0] * len(values)
            for row, weight in zip(where, weights):
                by_row[row] = weight
            acc = torch.tensordot(torch.tensor(by_row, dtype=dtype), base.to(dtype), dims=1)
        else:
            acc = torch.zeros_like(first, dtype=dtype)
            for value, weight in zip(values, weights):
                acc += value.to(dtype) * weight
        out[key] = acc.to(first.dtype) if first.is_floating_point() else acc.round().to(first.dtype)
    return out


def split_mean(uploads: list[Upload], trainable: set[str], weights: list[float],
               combine: Combine | None = None) -> Tensors:
    """The uploads' states averaged with the coefficients ``weights`` over the ``trainable``
    tensors and by sample count over the rest (buffers), keys in the uploads' order (FedNova's and
    FedDyn's starting point); both sums through ``combine`` (the update codec's, default
    :func:`weighted_mean`)."""
    combine = combine or weighted_mean
    names = list(uploads[0].state)
    means = {**combine(uploads, [n for n in names if n not in trainable], None),
             **combine(uploads, [n for n in names if n in trainable], weights)}
    return {n: means[n] for n in names}


def stack_rows(rows: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]] | None:
    """The floating-point tensor whose rows 0..C−1 are ``rows`` in some order (views of one stack)
    and the row of each, or None."""
    base = rows[0]._base
    if base is None or not base.is_floating_point() or base.dim() == 0 or base.shape[0] != len(rows):
        return None
    start, stride, shape, strides = base.storage_offset(), base.stride(0), base.shape[1:], base.stride()[1:]
    if stride <= 0:
        return None
    where = []
    for row in rows:
        index, rest = divmod(row.storage_offset() - start, stride)
        if row._base is not base or rest or row.shape != shape or row.stride() != strides:
            return None
        where.append(index)
    return (base, where) if sorted(where) == list(range(len(rows))) else None
