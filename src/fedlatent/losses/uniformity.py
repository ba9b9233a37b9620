"""FedUV uniformity term L_U (Son et al., "FedUV: Uniformity and Variance for Heterogeneous
Federated Learning", CVPR 2024, Eq. 4 and the supplementary pseudocode).

Pure function of a tensor: no configuration, no state.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from fedlatent.losses.amp import in_float32

__all__ = ["uniformity"]


@in_float32
def uniformity(z: Tensor, *, sigma_factor: float = 1.0, detach_sigma: bool = False) -> Tensor:
    """Gaussian-potential uniformity of a batch of representations (FedUV's L_U).

    ``L_U = mean_{i<j} exp(-||z_i - z_j||^2 / (sigma_factor * sigma))`` where ``sigma`` is the
    median of the *non-zero* squared pairwise distances over the pairs ``i < j``, with
    ``torch.median`` semantics (the lower of the two middle values for an even count).

    The default (``sigma_factor=1``, sigma not detached) is what the FedUV supplementary
    pseudocode and the authors' release compute; ``sigma_factor=2.0`` is Eq. 4 of the main text
    (``2 sigma`` in the denominator). With ``detach_sigma=True`` no gradient flows through the
    bandwidth.

    Args:
        z: representations, shape ``(N, d)`` (the classifier's input; not normalised here), or
            ``(B, N, d)`` for ``B`` independent batches (the vectorized backend's clients).
        sigma_factor: multiplier of the median bandwidth (1 = release/pseudocode, 2 = Eq. 4).
        detach_sigma: stop the gradient through ``sigma``.

    Returns:
        A 0-d tensor (``(B,)`` for batched ``z``) in ``z``'s dtype, in ``[0, 1]``.

    Edge cases (always finite, never NaN):
        * ``N <= 1``: there are no pairs; the mean over the empty set is taken as ``0`` (with a
          zero gradient, still connected to ``z``).
        * every pair at distance zero (all rows identical): the median of the non-zero
          distances does not exist. The bandwidth is then taken as 1, so every kernel value is
          ``exp(0) = 1`` and ``L_U = 1``, the largest value the term can take: fully collapsed
          features are the least uniform configuration. The gradient is exactly zero there
          (each kernel's derivative is proportional to ``z_i - z_j = 0``), which is also right:
          ``L_U`` is invariant to the scale of ``z``, so a collapsed batch has no preferred
          direction to spread in.
        * some (not all) pairs at distance zero: those pairs contribute ``exp(0) = 1`` to the
          mean but are excluded from the median, as in the release.

    The distances are direct differences (``torch.pdist`` as in the release, half the work of a
    full distance matrix; batched: ``torch.cdist`` in its direct mode), so identical rows give
    an exact zero; the median is a sort and a gather, without data-dependent shapes. It works
    under ``torch.func.vmap`` too, but ``pdist`` has no batching rule there: pass ``(B, N, d)``.

    Example:
        >>> z = torch.randn(8, 4)
        >>> float(uniformity(z)) <= 1.0
        True
    """
    if z.dim() not in (2, 3):
        raise ValueError(f"uniformity expects z of shape (N, d) or (B, N, d), got {tuple(z.shape)}")
    if not sigma_factor > 0:
        raise ValueError(f"sigma_factor must be positive, got {sigma_factor}")
    if z.shape[-2] < 2:
        return z.sum((-2, -1)) * 0.0
    sq = _pair_squared_distances(z)  # (..., P), the pairs i < j in row-major order

    # median of the non-zero entries (lower middle), without data-dependent shapes:
    # sorted ascending, the zeros come first; the wanted entry sits at k + (m - 1) // 2.
    num_pairs = sq.shape[-1]
    sorted_sq, _ = torch.sort(sq, dim=-1)
    num_zero = (sq == 0).sum(-1, keepdim=True)
    num_nonzero = num_pairs - num_zero
    index = (num_zero + torch.div(num_nonzero - 1, 2, rounding_mode="floor")).clamp(0, num_pairs - 1)
    sigma = sorted_sq.gather(-1, index)
    if detach_sigma:
        sigma = sigma.detach()
    sigma = torch.where(num_nonzero > 0, sigma, torch.ones_like(sigma))
    return torch.exp(-sq / (sigma_factor * sigma)).mean(-1)


def _pair_squared_distances(z: Tensor) -> Tensor:
    """``||z_i - z_j||^2`` for the pairs ``i < j`` in row-major order, ``(..., N(N-1)/2)``."""
    if z.dim() == 2:
        return torch.pdist(z).square()
    rows, cols = _upper_pairs(z.shape[-2], z.device)
    return torch.cdist(z, z, compute_mode="donot_use_mm_for_euclid_dist")[:, rows, cols].square()


@functools.lru_cache(maxsize=8)
def _upper_pairs(n: int, device: torch.device) -> Tensor:
    return torch.triu_indices(n, n, offset=1, device=device)
