"""FedUV variance term L_V (Son et al., "FedUV: Uniformity and Variance for Heterogeneous
Federated Learning", CVPR 2024, Eq. 3 and the supplementary pseudocode).

Pure function of a tensor: no configuration, no state.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedlatent.losses.amp import in_float32

__all__ = ["variance", "HINGES"]

HINGES = ("hinge", "none", "squared")


@in_float32
def variance(logits: Tensor, *, gamma: float | None = None, hinge: str = "hinge") -> Tensor:
    """Hinge on the batch standard deviation of each class's predicted probability (FedUV's L_V).

    ``L_V = (1/C) * sum_c h(gamma - std_batch(softmax(logits)[:, c]))`` with the unbiased
    (``N - 1``) standard deviation over the batch. The default ``gamma`` is the mean over
    columns of the unbiased std of the ``C x C`` identity matrix, which equals ``1/sqrt(C)``
    (the std a batch of one confident one-hot prediction per class would have).

    Following the authors' release, the softmax is applied to the raw logits (the supplementary
    pseudocode's ``one_hot`` of the predictions would leave the term without a gradient).

    Args:
        logits: shape ``(N, C)``.
        gamma: the target std; ``None`` means ``1/sqrt(C)``.
        hinge: ``"hinge"`` ``max(0, x)`` (paper/release default), ``"none"`` the identity
            (the paper's "no hinge" ablation), ``"squared"`` ``max(0, x)^2`` (squared-hinge
            ablation).

    Returns:
        A 0-d tensor in ``logits``' dtype.

    Edge cases (always finite, never NaN):
        * ``N = 1``: the unbiased std is undefined (the release would produce NaN); it is taken
          as 0, so ``L_V = h(gamma)``, with a zero gradient (still connected to ``logits``).
        * a column with zero spread (e.g. identical rows): its std is 0 and the gradient of the
          square root at 0 is taken as 0 instead of infinity.
        * a class never predicted is an ordinary column with a small std.

    Example:
        >>> logits = torch.randn(16, 10)
        >>> float(variance(logits)) >= 0.0
        True
    """
    if logits.dim() != 2:
        raise ValueError(f"variance expects logits of shape (N, C), got {tuple(logits.shape)}")
    if hinge not in HINGES:
        raise ValueError(f"hinge must be one of {HINGES}, got {hinge!r}")
    n, c = logits.shape
    if c == 0:
        raise ValueError("variance needs at least one class")
    target = 1.0 / math.sqrt(c) if gamma is None else float(gamma)
    p = torch.softmax(logits, dim=1)
    if n < 2:
        std = p.sum(dim=0) * 0.0
    else:
        var = p.var(dim=0, correction=1)
        positive = var > 0
        std = torch.where(positive, torch.where(positive, var, torch.ones_like(var)).sqrt(), torch.zeros_like(var))
    gap = target - std
    if hinge == "hinge":
        term = torch.relu(gap)
    elif hinge == "squared":
        term = torch.relu(gap).square()
    else:
        term = gap
    return term.mean()
