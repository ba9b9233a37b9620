"""DeCov and Structured-DeCov: penalties on the covariance (not the correlation) of a batch of
representations — the decorrelation baselines of FedDecorr's Table 6 (Shi et al., ICLR 2023, App. C.2).

* DeCov (Cogswell et al., "Reducing Overfitting in Deep Networks by Decorrelating
  Representations", ICLR 2016, Eq. 1): with C = (1/N) Σ_n (h_n − μ)(h_n − μ)ᵀ,
  L = ½ (‖C‖_F² − ‖diag C‖²).
* Structured-DeCov (Xiong et al., "Regularizing Deep Convolutional Neural Networks with a
  Structured Decorrelation Constraint", ICDM 2016): the d units are split into ``groups``
  contiguous, (nearly) equal groups; only the covariances between units of different groups are
  penalised, L = ½ (‖C‖_F² − Σ_g ‖C_gg‖_F²), so units within a group may stay correlated. With
  one unit per group it is DeCov.

Pure functions of a tensor: no configuration, no state.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

from fedlatent.losses.amp import in_float32

__all__ = ["covariance", "decov", "structured_decov", "group_of"]


def covariance(h: Tensor) -> Tensor:
    """The biased (1/N) d×d covariance of the rows of ``h`` (N×d), as DeCov defines it."""
    if h.dim() != 2:
        raise ValueError(f"expected representations of shape (N, d), got {tuple(h.shape)}")
    centred = h - h.mean(dim=0, keepdim=True)
    return centred.T @ centred / h.shape[0]


@in_float32
def decov(h: Tensor) -> Tensor:
    """½ (‖C‖_F² − ‖diag C‖²): the squared off-diagonal covariances, halved.

    Example:
        >>> float(decov(torch.tensor([[1.0, -1.0], [-1.0, 1.0]])))   # C = [[1, -1], [-1, 1]]
        1.0
    """
    c = covariance(h)
    return 0.5 * (c.pow(2).sum() - c.diagonal().pow(2).sum())


def group_of(d: int, groups: int) -> Tensor:
    """The group of each of ``d`` units: ``groups`` contiguous blocks, sizes differing by at most one."""
    if not 1 <= groups <= d:
        raise ValueError(f"groups must be between 1 and d = {d}, got {groups}")
    return torch.arange(d) * groups // d


@in_float32
def structured_decov(h: Tensor, groups: int) -> Tensor:
    """½ (‖C‖_F² − Σ_g ‖C_gg‖_F²): the squared covariances between units of different groups, halved."""
    c = covariance(h)
    return 0.5 * c.pow(2).flatten().index_select(0, _across(c.shape[0], groups, c.device)).sum()


@functools.lru_cache(maxsize=32)
def _across(d: int, groups: int, device: torch.device) -> Tensor:
    """The flat (row-major) indices of the d×d covariances between units of different groups, on
    ``device``, made once: the entries a boolean mask would pick, in its order (the same sum), without
    a mask's compaction, which reads its count on the host at every call."""
    g = group_of(d, groups)
    return (g[:, None] != g[None, :]).flatten().nonzero()[:, 0].to(device)
