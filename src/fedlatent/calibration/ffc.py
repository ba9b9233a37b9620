"""Fast federated calibration (FFC) of SphereFed (Dong et al., "SphereFed: Hyperspherical
Federated Learning", ECCV 2022, Sec. 3.3, Eq. 7-9).

Each client sends ``V_k = sum_i z_i z_i^T`` and ``U_k = sum_i z_i onehot(y_i)^T``; the server
solves the least-squares problem of the pooled data in closed form,
``W* = (sum_k V_k + lambda I)^{-1} sum_k U_k``, which equals the centralised ridge (or, with
``lambda = 0``, ordinary least-squares) classifier on all the clients' features.

Pure functions of tensors: no configuration, no state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from fedlatent.losses.amp import in_float32

__all__ = ["ffc_statistics", "ffc_solve"]

Statistics = tuple[Tensor, Tensor]


@in_float32
def ffc_statistics(
    z: Tensor, labels: Tensor, num_classes: int, *, dtype: torch.dtype | None = None
) -> Statistics:
    """A client's sufficient statistics for FFC.

    Args:
        z: features of the client's samples (the normalised classifier input), ``(N, l)``.
        labels: integer labels in ``[0, num_classes)``, ``(N,)``.
        num_classes: ``C``.
        dtype: dtype of the returned statistics; ``None`` means ``z.dtype``. They are always
            accumulated in float64; ask for ``torch.float64`` to keep that precision on the
            wire.

    Returns:
        ``(V, U)`` with ``V = z^T z`` of shape ``(l, l)`` and ``U = z^T onehot(y)`` of shape
        ``(l, C)``. An empty client gives zeros.

    Example:
        >>> V, U = ffc_statistics(torch.randn(5, 3), torch.tensor([0, 1, 1, 2, 0]), 3)
        >>> tuple(V.shape), tuple(U.shape)
        ((3, 3), (3, 3))
    """
    if z.dim() != 2:
        raise ValueError(f"ffc_statistics expects z of shape (N, l), got {tuple(z.shape)}")
    if labels.shape != (z.shape[0],):
        raise ValueError(f"labels must have shape ({z.shape[0]},), got {tuple(labels.shape)}")
    out_dtype = z.dtype if dtype is None else dtype
    z64 = z.to(torch.float64)
    onehot = F.one_hot(labels.long(), num_classes).to(torch.float64)
    return (z64.T @ z64).to(out_dtype), (z64.T @ onehot).to(out_dtype)


def _as_pairs(statistics: Statistics | Sequence[Statistics]) -> list[Statistics]:
    if len(statistics) == 2 and all(isinstance(part, Tensor) for part in statistics):
        return [cast(Statistics, (statistics[0], statistics[1]))]
    pairs = [tuple(pair) for pair in statistics]
    if not pairs:
        raise ValueError("ffc_solve needs at least one (V, U) pair")
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(part, Tensor) for part in pair):
            raise ValueError("statistics must be one (V, U) pair of tensors or a sequence of such pairs")
    return pairs


@in_float32
def ffc_solve(
    statistics: Statistics | Sequence[Statistics],
    ridge: float = 0.0,
    *,
    rtol: float = 1e-10,
) -> Tensor:
    """Solve FFC's least-squares classifier from one or several clients' statistics.

    ``W = ((sum_k V_k + ridge * I)^{-1} sum_k U_k)^T``, shape ``(C, l)`` -- the layout of
    ``nn.Linear(l, C).weight``, so it can be copied into the classifier directly. Pass a
    single client's pair for the personalised variant.

    The system is solved in float64: by Cholesky when ``sum V + ridge I`` is positive definite
    and not numerically singular (smallest squared Cholesky pivot above ``rtol`` times the
    largest diagonal entry); otherwise by the pseudo-inverse, with eigenvalues below
    ``rtol * largest`` treated as zero. For a singular ``V`` (e.g. more feature dimensions than
    samples, or collapsed features) and ``ridge = 0`` this is the minimum-norm least-squares
    solution, which is what ``lstsq`` on the pooled features returns (``V^+ Z^T Y = Z^+ Y``).
    Directions whose eigenvalue in ``V`` falls below ``rtol`` relative (singular values of
    the features below ``sqrt(rtol)`` relative) cannot be recovered from ``V`` at all and are
    dropped.

    Args:
        statistics: ``(V, U)`` or a sequence of ``(V, U)`` pairs, which are summed.
        ridge: ``lambda >= 0`` (0 in the paper's default; 0.1 reported slightly better).
        rtol: relative threshold for numerical singularity (see above).

    Returns:
        ``W`` of shape ``(C, l)`` in the dtype of the first ``U``.

    Example:
        >>> z = torch.randn(50, 4, dtype=torch.float64); y = torch.randint(0, 3, (50,))
        >>> W = ffc_solve(ffc_statistics(z, y, 3))
        >>> tuple(W.shape)
        (3, 4)
    """
    if ridge < 0:
        raise ValueError(f"ridge must be non-negative, got {ridge}")
    pairs = _as_pairs(statistics)
    v0, u0 = pairs[0]
    if v0.dim() != 2 or v0.shape[0] != v0.shape[1] or u0.dim() != 2 or u0.shape[0] != v0.shape[0]:
        raise ValueError(f"V must be (l, l) and U (l, C); got {tuple(v0.shape)} and {tuple(u0.shape)}")
    for v, u in pairs[1:]:
        if v.shape != v0.shape or u.shape != u0.shape:
            raise ValueError("all (V, U) pairs must have the same shapes")
    out_dtype = u0.dtype
    v_sum = torch.stack([v.to(torch.float64) for v, _ in pairs]).sum(dim=0)
    u_sum = torch.stack([u.to(torch.float64) for _, u in pairs]).sum(dim=0)
    a = 0.5 * (v_sum + v_sum.T)
    if ridge:
        a = a + ridge * torch.eye(a.shape[0], dtype=a.dtype, device=a.device)
    solution: Tensor | None = None
    if a.shape[0] > 0:
        chol, info = torch.linalg.cholesky_ex(a)
        if int(info) == 0:
            scale = a.diagonal().max()
            if bool(chol.diagonal().square().min() > rtol * scale):
                solution = torch.cholesky_solve(u_sum, chol)
    if solution is None:
        solution = torch.linalg.pinv(a, rtol=rtol, hermitian=True) @ u_sum
    return solution.T.to(out_dtype)
