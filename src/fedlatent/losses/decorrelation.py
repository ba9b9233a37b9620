"""FedDecorr decorrelation term (Shi et al., "Towards Understanding and Mitigating Dimensional
Collapse in Heterogeneous Federated Learning", ICLR 2023, Eq. 4 / Sec. 4).

Pure function of a tensor: no configuration, no state.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedlatent.losses.amp import in_float32

__all__ = ["decorrelation", "SEMANTICS"]

SEMANTICS = ("paper", "official")


@in_float32
def decorrelation(z: Tensor, semantics: str = "paper", eps: float = 1e-8) -> Tensor:
    """Squared correlations between the dimensions of a batch of representations.

    Each column of ``z`` (``N x d``) is centred over the batch and divided by
    ``sqrt(var + eps)``.

    * ``"paper"`` (default): the variance is the population (``1/N``) one, so
      ``K = z_hat^T z_hat / N`` is the correlation matrix (unit diagonal up to ``eps``) and
      ``L = ||K||_F^2 / d^2`` (the diagonal included, as in the paper's formula; it only adds
      the near-constant ``1/d``).
    * ``"official"`` (the authors' FedDecorr release): the variance is the unbiased
      (``1/(N-1)``) one, ``M = z_hat^T z_hat`` (not divided by anything, so ``M = (N-1) K``),
      and ``L = mean over the d(d-1) off-diagonal entries of M^2, divided by N``.

    For ``eps -> 0`` and no constant column the two are related exactly by
    ``official = (N-1)^2/N * d/(d-1) * (paper - 1/d)``, i.e. roughly ``N d/(d-1)`` times the
    paper's off-diagonal part; hence the release's coefficient (0.1 / 0.05) depends on the batch
    size and is not interchangeable with a coefficient for the paper's scale.

    Args:
        z: representations, shape ``(N, d)``.
        semantics: ``"paper"`` or ``"official"``.
        eps: added to the per-column variance before the square root (1e-8 as in both).

    Returns:
        A 0-d tensor in ``z``'s dtype.

    Edge cases (always finite): ``N <= 1`` gives 0 (as the release), with a zero gradient
    still connected to ``z``; ``d = 1`` with ``"official"`` has no off-diagonal entry and gives
    0; a constant column standardises to (near) zero and contributes nothing, also with
    ``eps = 0`` (a column whose variance plus ``eps`` is exactly 0 is left at zero instead of
    dividing 0 by 0).

    Example:
        >>> z = torch.randn(32, 8)
        >>> 0.0 < float(decorrelation(z)) <= 1.0
        True
    """
    if z.dim() != 2:
        raise ValueError(f"decorrelation expects z of shape (N, d), got {tuple(z.shape)}")
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")
    if eps < 0:
        raise ValueError(f"eps must be non-negative, got {eps}")
    n, d = z.shape
    if n < 2 or d == 0:
        return z.sum() * 0.0
    centred = z - z.mean(dim=0, keepdim=True)
    divisor = n if semantics == "paper" else n - 1
    var = centred.square().sum(dim=0, keepdim=True) / divisor + eps
    positive = var > 0
    scale = torch.where(positive, torch.where(positive, var, torch.ones_like(var)).rsqrt(), torch.zeros_like(var))
    z_hat = centred * scale
    # ‖ẐᵀẐ‖_F = ‖ẐẐᵀ‖_F: the smaller Gram matrix gives the same value (N×N when N < d)
    gram = z_hat @ z_hat.T if n < d else z_hat.T @ z_hat
    frobenius2 = gram.square().sum()
    if semantics == "paper":
        return frobenius2 / (n * n) / (d * d)
    if d < 2:
        return z.sum() * 0.0
    diagonal = z_hat.square().sum(dim=0)  # the diagonal of ẐᵀẐ
    return (frobenius2 - diagonal.square().sum()) / (d * (d - 1)) / n
