"""Multi-kernel MMD (MK-MMD) for the Ditto feature-drift constraint, with test-power kernel weights.

A family of Gaussian kernels k_j, j = 1..K, and the per-kernel squared maximum mean discrepancy
(Gretton et al. 2012, "A Kernel Two-Sample Test", JMLR, Eq. 2/5)

    MMD²_j(P, Q) = E k_j(x, x') + E k_j(y, y') − 2 E k_j(x, y),

combined as MK-MMD² = Σ_j β_j MMD²_j (Gretton et al. 2012, "Optimal kernel choice for large-scale
two-sample tests", NeurIPS). β maximises the test power: minimise βᵀ(Q + εI)β subject to
βᵀm̂ = 1, β ≥ 0 (ibid., Sec. 3), with m̂ the per-kernel estimates and Q their covariance.

Kernel conventions (``kernel=``), both over γ_j = 2^e, e = −3.5, −3.25, …, 1.0 (19 values):

* ``"paper"`` — the seed paper's formula, k_j(a, b) = exp(−γ_j ‖a − b‖²);
* ``"official"`` — the authors' released code, k_j(a, b) = exp(−‖a − b‖² / γ_j).

Estimators (``estimator=``):

* ``"biased"`` — the V-statistic over all pairs, diagonal included (the release's estimator;
  Gretton et al. 2012 JMLR Eq. 5): mean(K_xx) + mean(K_yy) − 2 mean(K_xy). Batch sizes may differ.
* ``"linear"`` — the linear-time estimator (ibid. Lemma 14; NeurIPS 2012 Eq. 4): with
  P = ⌊n/2⌋ quadruples v_i = (x_{2i−1}, x_{2i}, y_{2i−1}, y_{2i}),
  h(v_i) = k(x_{2i−1}, x_{2i}) + k(y_{2i−1}, y_{2i}) − k(x_{2i−1}, y_{2i}) − k(x_{2i}, y_{2i−1}),
  MMD²_l = (1/P) Σ_i h(v_i). Needs equal batch sizes; an odd last sample is dropped.

Everything is vectorised over kernels: one pairwise squared-distance computation, then a
broadcast over a leading kernel axis. Pure functions of tensors.

Example::

    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> x, y = torch.randn(16, 4, generator=g), torch.randn(16, 4, generator=g) + 1.0
    >>> m, q = mmd_estimates(x, y), mmd_estimates_covariance(x, y)
    >>> beta = optimize_kernel_weights(m, q)
    >>> bool(mk_mmd(x, y, betas=beta) > 0)
    True
"""
from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import minimize
from torch import Tensor

from fedlatent.losses.amp import in_float32

__all__ = [
    "kernel_bandwidths",
    "squared_distances",
    "mmd_estimates",
    "mmd_estimates_covariance",
    "mmd_estimates_with_covariance",
    "mmd_estimates_with_covariance_batch",
    "optimize_kernel_weights",
    "mk_mmd",
    "mk_mmd_batch",
]

_KERNELS = ("paper", "official")
_ESTIMATORS = ("biased", "linear")
_QUADRUPLES = ("all", "paired")
# exp(t) is computed as 2^(t·log2 e) with the factor folded into the kernel scales: torch's exp2
# runs ~4x faster than its exp on CPU and agrees with it to float rounding
_LOG2E = math.log2(math.e)


def kernel_bandwidths(kernel: str = "paper", *, dtype: torch.dtype | None = None,
                      device: torch.device | str | None = None) -> Tensor:
    """The 19 default γ_j = 2^e, e = −3.5, −3.25, …, 1.0 (same values for both conventions).

    ``kernel="paper"`` reads them as k_j = exp(−γ_j d²); ``kernel="official"`` (the release) as
    k_j = exp(−d²/γ_j). ``dtype`` defaults to torch's default dtype.
    """
    _check_choice("kernel", kernel, _KERNELS)
    exponents = torch.arange(-14, 5, dtype=torch.float64) * 0.25
    return torch.pow(2.0, exponents).to(dtype=dtype or torch.get_default_dtype(), device=device)


def batched_self_distances(a: Tensor) -> Tensor:
    """(B, N, N) squared distances of the rows of each a[b] (B, N, d), with an exact zero diagonal:
    from the differences while the (B, N, N, d) stack is small (per-step terms: fewer operators,
    the exact form), else as :func:`squared_distances` for each a[b]."""
    if a.shape[1] ** 2 * a.shape[2] <= 1 << 16:
        diff = a[:, :, None] - a[:, None]
        return (diff * diff).sum(-1)  # the same values as square(), a backward pass ~2x faster than pow's
    return _cross_distances(a, a, zero_diagonal=True)


def squared_distances(a: Tensor, b: Tensor | None = None) -> Tensor:
    """‖a_i − b_j‖² for rows of (n×d) ``a`` and (m×d) ``b`` via ‖a‖² + ‖b‖² − 2a·b, clamped at 0.

    With ``b=None`` the self-distances of ``a``, with an exactly zero diagonal (so that
    k(a_i, a_i) = 1 exactly and no rounding noise reaches the gradient).
    """
    return _cross_distances(a[None], (a if b is None else b)[None], zero_diagonal=b is None)[0]


@in_float32
def mmd_estimates(x: Tensor, y: Tensor, *, gammas: Tensor | None = None, kernel: str = "paper",
                  estimator: str = "biased", normalize: bool = False) -> Tensor:
    """Per-kernel MMD² estimates m̂ ∈ R^K (see the module docstring for kernels and estimators).

    Args:
        x: (n, …) features of the first sample; dimensions after the first are flattened.
        y: (m, …) features of the second sample, same feature size.
        gammas: (K,) positive γ_j; default :func:`kernel_bandwidths` (19 kernels).
        kernel: ``"paper"`` exp(−γ d²) or ``"official"`` exp(−d²/γ).
        estimator: ``"biased"`` (V-statistic, n ≠ m allowed) or ``"linear"`` (n = m required).
        normalize: L2-normalise each feature row first (the release's Ditto client does).

    Returns:
        (K,) tensor, differentiable w.r.t. ``x`` and ``y``.
    """
    x, y, scales = _prepare(x, y, gammas, kernel, estimator, normalize)
    if estimator == "linear":
        return _linear_h(x, y, scales).mean(1)
    kxx, kyy, kxy, back = _kernel_blocks(x[None], y[None], scales)
    return (kxx.mean((2, 3)) + kyy.mean((2, 3)) - 2.0 * kxy.mean((2, 3)))[0, back]


@in_float32
def mmd_estimates_covariance(x: Tensor, y: Tensor, *, gammas: Tensor | None = None,
                             kernel: str = "paper", estimator: str = "biased",
                             normalize: bool = False, quadruples: str = "all") -> Tensor:
    """Q ∈ R^{K×K}, the covariance of the per-kernel h-statistics used in the test-power criterion.

    All definitions estimate Cov[h_i(v), h_j(v)] for one quadruple v = (x, x', y, y') with
    h_k(v) = k_k(x, x') + k_k(y, y') − k_k(x, y') − k_k(x', y) — the matrix Q of Gretton et al.
    2012 (NeurIPS, "Optimal kernel choice", Sec. 3), whose estimator variance is Q/#quadruples.

    * ``estimator="linear"``: the unbiased sample covariance (divisor P − 1) of h over the
      P = ⌊n/2⌋ disjoint quadruples of :func:`mmd_estimates`. Needs n = m ≥ 4. (The release
      instead averages h_Δ h_Δᵀ with h_Δ = h(v_{2i−1}) − h(v_{2i}), Gretton's linear-time
      estimate of 2Q.)
    * ``estimator="biased"``, ``quadruples="all"`` (default): the exact covariance of
      h(x_s, x_t, y_u, y_v) = k(x_s, x_t) + k(y_u, y_v) − k(x_s, y_v) − k(x_t, y_u) over all n²m²
      index quadruples (s, t ≤ n; u, v ≤ m) taken uniformly, i.e. population covariance
      (divisor n²m²) under the empirical distributions. Its mean is exactly the biased
      V-statistic, for any n, m ≥ 1. Computed in closed form from kernel-matrix moments
      (no n²m² tensor): Cov_AA + Cov_BB + 2 Cov_CC − 2(Cov_AC + Cov_ACᵀ) − 2(Cov_BC + Cov_BCᵀ),
      A = k(x_s, x_t), B = k(y_u, y_v), C = k(x_s, y_v); cross terms of index-disjoint parts vanish.
    * ``estimator="biased"``, ``quadruples="paired"``: the release's definition — the n² entries
      H_st = k(x_s, x_t) + k(y_s, y_t) − k(x_s, y_t) − k(x_t, y_s) (pairing x_s with y_s) as
      samples, Q = Σ_st (H_st − m̂)(H_st − m̂)ᵀ / (n² − 1). Needs n = m ≥ 2; depends on the
      (arbitrary) order in which x and y are paired, which the default does not.

    Differentiable, though the kernel-weight program uses it detached.
    """
    return mmd_estimates_with_covariance(x, y, gammas=gammas, kernel=kernel, estimator=estimator,
                                         normalize=normalize, quadruples=quadruples)[1]


@in_float32
def mmd_estimates_with_covariance(x: Tensor, y: Tensor, *, gammas: Tensor | None = None,
                                  kernel: str = "paper", estimator: str = "biased", normalize: bool = False,
                                  quadruples: str = "all") -> tuple[Tensor, Tensor]:
    """(m̂, Q) of :func:`mmd_estimates` and :func:`mmd_estimates_covariance` from one pass over the
    kernel matrices (what a kernel-weight refresh needs; half the work of calling both)."""
    _check_choice("quadruples", quadruples, _QUADRUPLES)
    x, y, scales = _prepare(x, y, gammas, kernel, estimator, normalize)
    if estimator == "linear":
        h = _linear_h(x, y, scales)
        if h.shape[1] < 2:
            raise ValueError(f"linear-time covariance needs at least 2 quadruples (batch ≥ 4), got {x.shape[0]}")
        hc = h - h.mean(1, keepdim=True)
        return h.mean(1), hc @ hc.T / (h.shape[1] - 1)
    n, m = x.shape[0], y.shape[0]
    if quadruples == "paired":
        if n != m or n < 2:
            raise ValueError(f"quadruples='paired' needs equal batch sizes ≥ 2, got {n} and {m}")
        m_hat, q = _paired_moments(x[None], y[None], scales)
        return m_hat[0], q[0]
    m_hat, q = _all_moments(x[None], y[None], scales)
    return m_hat[0], q[0]


@in_float32
def mmd_estimates_with_covariance_batch(xs: Tensor, ys: Tensor, *, gammas: Tensor | None = None,
                                        kernel: str = "paper", estimator: str = "biased", normalize: bool = False,
                                        quadruples: str = "all") -> tuple[Tensor, Tensor]:
    """:func:`mmd_estimates_with_covariance` for B problems at once: (B, n, …) and (B, m, …) ↦
    (B, K), (B, K, K). The biased estimator's covariances run as one batched computation (several
    clients' kernel-weight refreshes together); the linear one loops over the batch."""
    if xs.ndim < 3 or ys.ndim < 3 or xs.shape[0] != ys.shape[0]:
        raise ValueError(f"expected (B, n, …) and (B, m, …) stacks, got {tuple(xs.shape)} and {tuple(ys.shape)}")
    opts: dict[str, Any] = dict(gammas=gammas, kernel=kernel, estimator=estimator, normalize=normalize,
                                quadruples=quadruples)
    _check_choice("quadruples", quadruples, _QUADRUPLES)
    if estimator == "biased" and (quadruples == "all" or xs.shape[1] == ys.shape[1] >= 2):
        x, y, scales = _prepare(xs.flatten(0, 1), ys.flatten(0, 1), gammas, kernel, estimator, normalize)
        moments = _paired_moments if quadruples == "paired" else _all_moments
        return moments(x.unflatten(0, xs.shape[:2]), y.unflatten(0, ys.shape[:2]), scales)
    stats = [mmd_estimates_with_covariance(x, y, **opts) for x, y in zip(xs, ys)]
    return torch.stack([m for m, _ in stats]), torch.stack([q for _, q in stats])


def optimize_kernel_weights(estimates: Tensor, covariance: Tensor, *, eps: float = 1e-3,
                            normalize: bool = True) -> Tensor:
    """Test-power kernel weights: argmin βᵀ(Q + εI)β s.t. βᵀm̂ = 1, β ≥ 0 (Gretton et al. 2012, NeurIPS).

    Solved on a rescaled but equivalent problem (m̂ / max m̂, (Q + εI) / mean diag) with
    ``quadprog`` (Goldfarb–Idnani dual active set: exact for this strictly convex QP, ~0.1 ms for
    19 kernels); when Q + εI is not positive definite (ε = 0 and a singular Q), or quadprog is not
    installed (a device image with only its own packages), with
    ``scipy.optimize.minimize(method="SLSQP")`` from the feasible start m̂₊/‖m̂₊‖². ε = 1e-3 is the
    paper's value, 1e-5 the release's. Inputs are detached; the solve runs in float64 on the CPU.

    Fallback (returns a one-hot β, weight 1, in both modes): when no m̂_j > 0 (the constraint is
    then infeasible), and also when the solver reports failure or returns a point violating the
    constraints by more than 1e-6, all weight goes to the kernel with the largest m̂_j/σ_j,
    σ_j = sqrt(Q_jj) (floored at the smallest positive float so that a zero variance gives ±inf).

    Args:
        estimates: (K,) m̂.
        covariance: (K, K) Q (symmetrised here).
        eps: ridge ε added to Q's diagonal.
        normalize: return β / Σβ (scale-invariant weights, as in the papers; default); with
            ``False`` the raw solution with βᵀm̂ = 1.

    Returns:
        (K,) β ≥ 0 with the dtype and device of ``estimates``.
    """
    m = estimates.detach().to("cpu", torch.float64).reshape(-1).numpy()
    q = covariance.detach().to("cpu", torch.float64).numpy()
    k = m.shape[0]
    if k == 0 or q.shape != (k, k):
        raise ValueError(f"estimates must be (K,) with K ≥ 1 and covariance (K, K); got {tuple(estimates.shape)} "
                         f"and {tuple(covariance.shape)}")
    if not (np.isfinite(m).all() and np.isfinite(q).all()):
        raise ValueError("estimates and covariance must be finite")
    if eps < 0:
        raise ValueError(f"eps = {eps}: must be ≥ 0")
    q = 0.5 * (q + q.T)
    beta = _solve_power_qp(m, q + eps * np.eye(k))
    if beta is None:
        sigma = np.sqrt(np.maximum(np.diag(q), np.finfo(np.float64).tiny))
        beta = np.zeros(k)
        beta[int(np.argmax(m / sigma))] = 1.0
    elif normalize:
        beta = beta / beta.sum()
    return torch.as_tensor(beta, dtype=estimates.dtype, device=estimates.device)


@in_float32
def mk_mmd(x: Tensor, y: Tensor, *, gammas: Tensor | None = None, betas: Tensor | None = None,
           kernel: str = "paper", normalize: bool = False, estimator: str = "biased") -> Tensor:
    """MK-MMD² = Σ_j β_j MMD²_j(x, y); β uniform (1/K) when ``betas`` is None.

    ``betas`` may be (K,) or (K, 1) (the release's column layout). Differentiable w.r.t. ``x``
    and ``y`` (and ``betas``). See :func:`mmd_estimates` for the other arguments. The biased
    estimator is computed as one weighted sum Σ_ab W_ab Σ_j β_j k_j(z_a, z_b) over z = [x; y]
    (W = 1/n² on the x-x block, 1/m² on y-y, −1/(nm) on x-y and y-x): the same value as
    Σ_j β_j m̂_j in a third of the operators, which matters when it runs on every step.
    """
    if estimator != "biased":
        est = mmd_estimates(x, y, gammas=gammas, kernel=kernel, estimator=estimator, normalize=normalize)
        return est.mean() if betas is None else (_betas(betas, est.shape[0]).to(est) * est).sum()
    x, y, scales = _prepare(x, y, gammas, kernel, estimator, False)
    b = torch.full_like(scales, 1.0 / scales.shape[0]) if betas is None else \
        _betas(betas, scales.shape[0]).to(dtype=x.dtype, device=x.device)
    z = torch.cat([x, y])
    if normalize:
        z = F.normalize(z, dim=1)
    if z.shape[0] ** 2 * z.shape[1] <= 1 << 16:  # small batch: the direct form, fewer operators
        d2 = (z[:, None] - z[None]).square().sum(-1)
    else:
        d2 = squared_distances(z)
    k = torch.exp2(-(scales * _LOG2E)[:, None] * d2.reshape(1, -1))  # (K, N²), exp as 2^(t·log2 e)
    return torch.dot(b @ k, _block_weights(x.shape[0], y.shape[0], x.dtype, x.device))


@in_float32
def mk_mmd_batch(xs: Tensor, ys: Tensor, *, betas: Tensor, gammas: Tensor | None = None, kernel: str = "paper",
                 normalize: bool = False, estimator: str = "biased") -> Tensor:
    """:func:`mk_mmd` of B problems at once: (B, n, …), (B, m, …) and β (B, K) ↦ (B,).

    The biased estimator runs as one batched computation (several clients' constraints in one
    step of the vectorized backend); the linear one through ``torch.vmap``."""
    if xs.ndim < 3 or ys.ndim < 3 or not xs.shape[0] == ys.shape[0] == betas.shape[0]:
        raise ValueError(f"expected (B, n, …), (B, m, …) and (B, K), got {tuple(xs.shape)}, {tuple(ys.shape)} "
                         f"and {tuple(betas.shape)}")
    if estimator != "biased":
        return torch.vmap(lambda x, y, b: mk_mmd(x, y, betas=b, gammas=gammas, kernel=kernel, normalize=normalize,
                                                 estimator=estimator))(xs, ys, betas)
    batch, n, m = xs.shape[0], xs.shape[1], ys.shape[1]
    x, y, scales = _prepare(xs.flatten(0, 1), ys.flatten(0, 1), gammas, kernel, estimator, False)
    b = betas.reshape(batch, -1).to(dtype=x.dtype, device=x.device)
    if b.shape[1] != scales.shape[0]:
        raise ValueError(f"betas has {b.shape[1]} entries but there are {scales.shape[0]} kernels")
    z = torch.cat([x.unflatten(0, (batch, n)), y.unflatten(0, (batch, m))], 1)  # (B, N, d)
    if normalize:
        z = F.normalize(z, dim=2)
    d2 = batched_self_distances(z)
    k = torch.exp2(-(scales * _LOG2E)[None, :, None] * d2.flatten(1)[:, None, :])  # (B, K, N²), as in mk_mmd
    return torch.bmm(b[:, None, :], k).squeeze(1) @ _block_weights(n, m, x.dtype, x.device)


def _betas(betas: Tensor, num_kernels: int) -> Tensor:
    b = betas.reshape(-1)
    if b.shape[0] != num_kernels:
        raise ValueError(f"betas has {b.shape[0]} entries but there are {num_kernels} kernels")
    return b


@functools.lru_cache(maxsize=32)
def _block_weights(n: int, m: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Flattened (n + m)² weights of the biased estimator: 1/n², 1/m² on the diagonal blocks, −1/(nm) off."""
    w = torch.full((n + m, n + m), -1.0 / (n * m), dtype=torch.float64)
    w[:n, :n], w[n:, n:] = 1.0 / (n * n), 1.0 / (m * m)
    return w.reshape(-1).to(dtype=dtype, device=device)


# ---------------------------------------------------------------------------------------------

def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} = {value!r}: expected one of {', '.join(map(repr, choices))}")


def _as_matrix(t: Tensor, name: str) -> Tensor:
    if t.ndim == 0 or t.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty batch (N, …), got shape {tuple(t.shape)}")
    return t.reshape(t.shape[0], -1)


def _prepare(x: Tensor, y: Tensor, gammas: Tensor | None, kernel: str, estimator: str,
             normalize: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Validate, flatten, promote to a common dtype, normalise; return per-kernel scales s_j (d² ↦ exp(−s_j d²))."""
    _check_choice("kernel", kernel, _KERNELS)
    _check_choice("estimator", estimator, _ESTIMATORS)
    x, y = _as_matrix(x, "x"), _as_matrix(y, "y")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y have different feature sizes: {x.shape[1]} and {y.shape[1]}")
    if estimator == "linear" and (x.shape[0] != y.shape[0] or x.shape[0] < 2):
        raise ValueError(f"the linear-time estimator needs equal batch sizes ≥ 2, got {x.shape[0]} and {y.shape[0]}")
    dtype = torch.promote_types(x.dtype, y.dtype)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    x, y = x.to(dtype), y.to(dtype)
    if normalize:
        x, y = F.normalize(x, dim=1), F.normalize(y, dim=1)
    if gammas is None:
        return x, y, _default_scales(kernel, dtype, x.device)
    g = gammas.reshape(-1).to(dtype=dtype, device=x.device)
    if g.numel() == 0 or not bool(torch.all(g > 0)) or not bool(torch.all(torch.isfinite(g))):
        raise ValueError("gammas must be a non-empty vector of finite positive values")
    return x, y, (g if kernel == "paper" else 1.0 / g)


@functools.lru_cache(maxsize=16)
def _default_scales(kernel: str, dtype: torch.dtype, device: torch.device) -> Tensor:
    g = kernel_bandwidths(kernel, dtype=torch.float64)
    return (g if kernel == "paper" else 1.0 / g).to(dtype=dtype, device=device)


def _kernel_blocks(x: Tensor, y: Tensor, scales: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Batched kernel matrices of x (B, n, d) and y (B, m, d): (B, K, n, n), (B, K, m, m),
    (B, K, n, m), the kernel axis in :func:`_gaussians`' squaring order, and the permutation that
    restores the order of ``scales`` (callers apply it to their K-sized results)."""
    levels = _squaring_levels(tuple(scales.detach().to("cpu", torch.float64).tolist()))
    kxx, order = _gaussians(scales, _cross_distances(x, x, zero_diagonal=True), levels, dim=1)
    kyy, _ = _gaussians(scales, _cross_distances(y, y, zero_diagonal=True), levels, dim=1)
    kxy, _ = _gaussians(scales, _cross_distances(x, y), levels, dim=1)
    return kxx, kyy, kxy, torch.as_tensor(order, device=x.device).argsort()


def _all_moments(x: Tensor, y: Tensor, scales: Tensor) -> tuple[Tensor, Tensor]:
    """(m̂, Q) over all n²m² index quadruples (see :func:`mmd_estimates_covariance`), batched:
    x (B, n, d), y (B, m, d) ↦ (B, K), (B, K, K). From kernel-matrix moments, no n²m² tensor:
    Cov_AA + Cov_BB + 2 Cov_CC − 2(Cov_AC + Cov_ACᵀ) − 2(Cov_BC + Cov_BCᵀ), A = k(x_s, x_t),
    B = k(y_u, y_v), C = k(x_s, y_v); cross terms of index-disjoint parts vanish."""
    n, m = x.shape[1], y.shape[1]
    kxx, kyy, kxy, back = _kernel_blocks(x, y, scales)
    ma, mb, mc = kxx.mean((2, 3)), kyy.mean((2, 3)), kxy.mean((2, 3))

    def outer(u: Tensor, v: Tensor) -> Tensor:
        return u[:, :, None] * v[:, None, :]

    def second_moment(k: Tensor) -> Tensor:  # E[k_i k_j] over the entries of a (B, K, p, q) stack
        flat = k.flatten(2)
        return flat @ flat.transpose(1, 2) / flat.shape[2]

    cov_aa = second_moment(kxx) - outer(ma, ma)
    cov_bb = second_moment(kyy) - outer(mb, mb)
    cov_cc = second_moment(kxy) - outer(mc, mc)
    # A and C share the x-index s: E_s[mean_t A_st · mean_v C_sv]
    cov_ac = kxx.mean(3) @ kxy.mean(3).transpose(1, 2) / n - outer(ma, mc)
    # B and C share the y-index v: E_v[mean_u B_uv · mean_s C_sv]
    cov_bc = kyy.mean(2) @ kxy.mean(2).transpose(1, 2) / m - outer(mb, mc)
    covariance = (cov_aa + cov_bb + 2.0 * cov_cc - 2.0 * (cov_ac + cov_ac.transpose(1, 2))
                  - 2.0 * (cov_bc + cov_bc.transpose(1, 2)))
    return (ma + mb - 2.0 * mc)[:, back], covariance[:, back][:, :, back]


def _paired_moments(x: Tensor, y: Tensor, scales: Tensor, chunk_elements: int = 1 << 20) -> tuple[Tensor, Tensor]:
    """(m̂, Q) over the n² paired h-statistics H_st = k(x_s, x_t) + k(y_s, y_t) − k(x_s, y_t) − k(x_t, y_s),
    for a batch of problems: x, y (B, n, d) ↦ m̂ (B, K), Q (B, K, K).

    H is symmetric in (s, t), so the sums run over the n(n − 1)/2 pairs s < t (counted twice) and
    the diagonal H_ss = 2 − 2k(x_s, y_s): half the kernel evaluations of the full n × n stacks, in
    chunks of about ``chunk_elements`` kernel values, with the kernels of doubled bandwidth scale
    obtained by squaring (:func:`_gaussians`, whose kernel order is undone on the K-sized results
    only). The second moment is accumulated around a shift (the first chunk's mean) so that
    float32 keeps its digits when Q ≪ m̂m̂ᵀ.
    """
    batch, n = x.shape[:2]
    dxy = _cross_distances(x, y)
    upper, lower = _upper_pairs(n, x.device)  # flat indices s·n + t and t·n + s of the pairs s < t
    flat_xy = dxy.flatten(1)
    pair_d2 = torch.stack([_cross_distances(x, x).flatten(1).index_select(1, upper),
                           _cross_distances(y, y).flatten(1).index_select(1, upper),
                           flat_xy.index_select(1, upper), flat_xy.index_select(1, lower)], 1)  # (B, 4, P)
    levels = _squaring_levels(tuple(scales.detach().to("cpu", torch.float64).tolist()))
    diag, order = _gaussians(scales, torch.diagonal(dxy, dim1=1, dim2=2), levels, dim=1)
    diag = 2.0 - 2.0 * diag  # (B, K, n), kernels in ``order``
    num_kernels = scales.shape[0]
    chunk = max(1, chunk_elements // (num_kernels * batch * 4))
    shift = total = second = None
    for start in range(0, pair_d2.shape[2], chunk):
        k, _ = _gaussians(scales, pair_d2[:, :, start:start + chunk], levels, dim=1)  # (B, K, 4, c)
        h = torch.add(k[:, :, 0], k[:, :, 1])
        h.sub_(k[:, :, 2]).sub_(k[:, :, 3])  # (B, K, c)
        if shift is None or total is None or second is None:  # the first chunk (all three None)
            shift = h.mean(2, keepdim=True)
            total = torch.zeros_like(shift)
            second = torch.zeros(batch, num_kernels, num_kernels, dtype=x.dtype, device=x.device)
        h = h.sub_(shift) if not h.requires_grad else h - shift
        total = total + 2.0 * h.sum(2, keepdim=True)
        second = torch.baddbmm(second, h, h.transpose(1, 2), alpha=2.0)
    assert shift is not None and total is not None and second is not None  # n ≥ 2: at least one pair
    dc = diag - shift
    total = total + dc.sum(2, keepdim=True)
    second = torch.baddbmm(second, dc, dc.transpose(1, 2))
    count = n * n
    centered = (total / count).squeeze(2)  # (B, K): m̂ − shift
    covariance = (second - count * centered[:, :, None] * centered[:, None, :]) / (count - 1)
    back = torch.as_tensor(order, device=x.device).argsort()
    estimates = centered + shift.squeeze(2)
    return estimates[:, back], covariance[:, back][:, :, back]


def _cross_distances(a: Tensor, b: Tensor, zero_diagonal: bool = False) -> Tensor:
    """(B, n, m) squared distances ‖a_s − b_t‖² of batched rows via ‖a‖² + ‖b‖² − 2a·b, clamped at
    0; ``zero_diagonal`` (self-distances, b = a) sets the diagonal to exactly 0 so that
    k(a_s, a_s) = 1 and no rounding noise reaches the gradient."""
    sq_a, sq_b = (a * a).sum(2), (b * b).sum(2)
    d2 = torch.baddbmm(sq_a[:, :, None] + sq_b[:, None, :], a, b.transpose(1, 2), alpha=-2.0).clamp_min(0.0)
    if zero_diagonal:
        d2 = d2.masked_fill(torch.eye(a.shape[1], dtype=torch.bool, device=a.device), 0.0)
    return d2


@functools.lru_cache(maxsize=8)
def _upper_pairs(n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    s, t = torch.triu_indices(n, n, offset=1, device=device).unbind(0)
    return s * n + t, t * n + s


@functools.lru_cache(maxsize=16)
def _squaring_levels(scales: tuple[float, ...]) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """How :func:`_gaussians` obtains the kernels: level by level, as (kernels, rows) pairs.

    The first level's kernels come from one exponential (rows is empty); each later level's
    kernels have exactly twice the scale of the kernels in the given rows of the level before, so
    that exp(−2s·d²) = exp(−s·d²)². The default grid (γ_j = 2^e in steps of 1/4) gives levels of
    4, 4, 4, 4, 3: 4 exponentials and 4 squarings for 19 kernels. Relative tolerance 1e-9.
    """
    def double_of(j: int) -> int | None:
        return next((i for i, si in enumerate(scales) if i != j and abs(scales[j] - 2.0 * si) <= 1e-9 * scales[j]),
                    None)

    sources = {j: double_of(j) for j in range(len(scales))}
    levels: list[tuple[tuple[int, ...], tuple[int, ...]]] = [(tuple(j for j, i in sources.items() if i is None), ())]
    while True:
        previous = levels[-1][0]
        rows = tuple(r for r, i in enumerate(previous) if any(src == i for src in sources.values()))
        if not rows:
            return tuple(levels)
        kernels = tuple(next(j for j, src in sources.items() if src == previous[r]) for r in rows)
        levels.append((kernels, rows))


def _gaussians(scales: Tensor, d2: Tensor, levels: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...],
               dim: int = 0) -> tuple[Tensor, list[int]]:
    """exp(−s_j d2) stacked along a new kernel axis at ``dim``, in the order of ``levels``
    (:func:`_squaring_levels`); returns the stack and the kernel index at each position.

    One exponential (as exp2, see ``_LOG2E``) for the first level, then one squaring per level, so the operator count
    does not grow with K. Each squaring doubles the relative rounding error of its source (~1e-6
    in float32 after 4 levels), far below the sampling noise of the statistics it feeds.
    """
    inplace = not (torch.is_grad_enabled() and (d2.requires_grad or scales.requires_grad))
    total = sum(len(kernels) for kernels, _ in levels)
    shape = list(d2.shape)
    shape.insert(dim, total)
    stack = torch.empty(shape, dtype=d2.dtype, device=d2.device) if inplace else None
    first = list(levels[0][0])
    scale_shape = [1] * (d2.ndim + 1)
    scale_shape[dim] = len(first)
    values = torch.exp2(-(scales[first] * _LOG2E).reshape(scale_shape) * d2.unsqueeze(dim),
                       **({"out": stack.narrow(dim, 0, len(first))} if stack is not None else {}))
    blocks, done = [values], len(first)
    for kernels, rows in levels[1:]:
        contiguous = rows == tuple(range(rows[0], rows[0] + len(rows)))
        source = values.narrow(dim, rows[0], len(rows)) if contiguous else \
            values.index_select(dim, torch.tensor(rows, device=d2.device))
        values = torch.mul(source, source,
                           **({"out": stack.narrow(dim, done, len(kernels))} if stack is not None else {}))
        blocks.append(values)
        done += len(kernels)
    order = [j for kernels, _ in levels for j in kernels]
    if stack is not None:  # written in place: no graph to keep, no concatenation to pay for
        return stack, order
    return (torch.cat(blocks, dim) if len(blocks) > 1 else blocks[0]), order


def _linear_h(x: Tensor, y: Tensor, scales: Tensor) -> Tensor:
    """(K, P) h-statistics of the P = ⌊n/2⌋ disjoint quadruples (x_{2i−1}, x_{2i}, y_{2i−1}, y_{2i})."""
    p = x.shape[0] // 2
    x1, x2, y1, y2 = x[0:2 * p:2], x[1:2 * p:2], y[0:2 * p:2], y[1:2 * p:2]
    d2 = torch.stack([x1 - x2, y1 - y2, x1 - y2, x2 - y1]).pow(2).sum(-1)  # (4, P)
    k = torch.exp(-scales[:, None, None] * d2[None])  # (K, 4, P)
    return k[:, 0] + k[:, 1] - k[:, 2] - k[:, 3]


def _solve_power_qp(m: np.ndarray, a: np.ndarray) -> np.ndarray | None:
    """Raw β (βᵀm = 1, β ≥ 0) minimising βᵀAβ, or None when infeasible or the solver fails.

    Solves the equivalent problem in u = β·max(m₊): uᵀ(m/max(m₊)) = 1, objective uᵀ(A/mean diag A)u;
    quadprog first, then SLSQP with ftol 1e-12, retried once at 1e-9 when it stops on a
    line-search failure.
    """
    if not np.any(m > 0):
        return None
    m_scale = float(np.max(m))
    a_scale = float(np.mean(np.diag(a)))
    if not (a_scale > 0 and math.isfinite(a_scale)):
        a_scale = 1.0
    mt, at = m / m_scale, a / a_scale
    for u in itertools.chain([_quadprog(mt, at)], _slsqp(mt, at)):  # SLSQP only if needed
        if u is not None and np.all(np.isfinite(u)) and u.min() >= -1e-6 and abs(u @ mt - 1.0) <= 1e-6:
            u = np.clip(u, 0.0, None)
            return u / float(u @ mt) / m_scale  # βᵀm = 1 exactly after the clip
    return None


def _quadprog(mt: np.ndarray, at: np.ndarray) -> np.ndarray | None:
    """min uᵀ·at·u s.t. mtᵀu = 1, u ≥ 0 by quadprog (None when ``at`` is not positive definite).

    Also None where quadprog is not installed (a GPU image with only its own packages): the
    caller's SLSQP then solves the same problem, so fedlatent imports and runs without it.
    """
    quadprog = _quadprog_module()
    if quadprog is None:
        return None
    k = mt.shape[0]
    constraints = np.column_stack([mt, np.eye(k)])
    bounds = np.concatenate([[1.0], np.zeros(k)])
    try:
        return quadprog.solve_qp(2.0 * at, np.zeros(k), constraints, bounds, meq=1)[0]
    except ValueError:  # "matrix G is not positive definite" or "constraints are inconsistent"
        return None


@functools.cache
def _quadprog_module() -> Any:
    """The quadprog module, imported where it is used, or None where it is absent."""
    try:
        import quadprog
    except ImportError:
        return None
    return quadprog


def _slsqp(mt: np.ndarray, at: np.ndarray) -> Iterator[np.ndarray | None]:
    """Candidate solutions of the same problem from SLSQP (lazily: tighter tolerance first)."""
    pos = np.clip(mt, 0.0, None)
    u0 = pos / float(pos @ pos)
    for ftol in (1e-12, 1e-9):
        res = minimize(lambda u: float(u @ at @ u), u0, jac=lambda u: 2.0 * (at @ u), method="SLSQP",
                       bounds=[(0.0, None)] * mt.shape[0],
                       constraints=[{"type": "eq", "fun": lambda u: np.array([u @ mt - 1.0]),
                                     "jac": lambda u: mt[None, :]}],
                       options={"ftol": ftol, "maxiter": 1000})
        yield np.asarray(res.x, dtype=np.float64) if res.success else None
