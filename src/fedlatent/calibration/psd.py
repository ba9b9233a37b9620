"""The nearest positive semidefinite matrix (Higham 1988, "Computing a nearest symmetric positive
semidefinite matrix", Linear Algebra Appl. 103, Theorem 2.1): what a Gram matrix or a covariance
with noise added to it is replaced by before it is solved with or sampled from.

Pure functions of tensors.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["nearest_psd"]


def nearest_psd(a: Tensor) -> Tensor:
    """The positive semidefinite matrix nearest to ``a`` in Frobenius norm: the symmetric part
    (A + Aᵀ)/2 = Q Λ Qᵀ with its negative eigenvalues set to zero, Q max(Λ, 0) Qᵀ, in float64
    (``a``: ``(..., l, l)``, a batch of matrices alike; returned in ``a``'s dtype)."""
    if a.dim() < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"nearest_psd expects square matrices (..., l, l), got {tuple(a.shape)}")
    a64 = a.to(torch.float64)
    eigenvalues, eigenvectors = torch.linalg.eigh(0.5 * (a64 + a64.transpose(-1, -2)))
    out = (eigenvectors * eigenvalues.clamp_min(0).unsqueeze(-2)) @ eigenvectors.transpose(-1, -2)
    return (0.5 * (out + out.transpose(-1, -2))).to(a.dtype)
