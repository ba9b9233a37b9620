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

import math

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import minimize
from torch import Tensor

__all__ = [
    "kernel_bandwidths",
    "squared_distances",
    "mmd_estimates",
    "mmd_estimates_covariance",
    "optimize_kernel_weights",
    "mk_mmd",
]

_KERNELS = ("paper", "official")
_ESTIMATORS = ("biased", "linear")
_QUADRUPLES = ("all", "paired")


def kernel_bandwidths(kernel: str = "paper", *, dtype: torch.dtype | None = None,
                      device: torch.device | str | None = None) -> Tensor:
    """The 19 default γ_j = 2^e, e = −3.5, −3.25, …, 1.0 (same values for both conventions).

    ``kernel="paper"`` reads them as k_j = exp(−γ_j d²); ``kernel="official"`` (the release) as
    k_j = exp(−d²/γ_j). ``dtype`` defaults to torch's default dtype.
    """
    _check_choice("kernel", kernel, _KERNELS)
    exponents = torch.arange(-14, 5, dtype=torch.float64) * 0.25
    return torch.pow(2.0, exponents).to(dtype=dtype or torch.get_default_dtype(), device=device)


def squared_distances(a: Tensor, b: Tensor | None = None) -> Tensor:
    """‖a_i − b_j‖² for rows of (n×d) ``a`` and (m×d) ``b`` via ‖a‖² + ‖b‖² − 2a·b, clamped at 0.

    With ``b=None`` the self-distances of ``a``, with an exactly zero diagonal (so that
    k(a_i, a_i) = 1 exactly and no rounding noise reaches the gradient).
    """
    if b is None:
        sq = (a * a).sum(1)
        d2 = (sq[:, None] + sq[None, :] - 2.0 * (a @ a.T)).clamp_min(0.0)
        eye = torch.eye(a.shape[0], dtype=torch.bool, device=a.device)
        return d2.masked_fill(eye, 0.0)
    d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * (a @ b.T)
    return d2.clamp_min(0.0)


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
    kxx, kyy, kxy = _kernel_blocks(x, y, scales)
    return kxx.mean((1, 2)) + kyy.mean((1, 2)) - 2.0 * kxy.mean((1, 2))


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
    kxx, kyy, kxy = _kernel_blocks(x, y, scales)
    n, m = x.shape[0], y.shape[0]
    ma, mb, mc = kxx.mean((1, 2)), kyy.mean((1, 2)), kxy.mean((1, 2))
    estimates = ma + mb - 2.0 * mc
    if quadruples == "paired":
        if n != m or n < 2:
            raise ValueError(f"quadruples='paired' needs equal batch sizes ≥ 2, got {n} and {m}")
        h = kxx + kyy - kxy - kxy.transpose(1, 2)
        hc = (h - h.mean((1, 2), keepdim=True)).reshape(h.shape[0], -1)
        return estimates, hc @ hc.T / (n * n - 1)

    def second_moment(k: Tensor) -> Tensor:  # E[k_i k_j] over the entries of a (K, p, q) stack
        flat = k.reshape(k.shape[0], -1)
        return flat @ flat.T / flat.shape[1]

    cov_aa = second_moment(kxx) - torch.outer(ma, ma)
    cov_bb = second_moment(kyy) - torch.outer(mb, mb)
    cov_cc = second_moment(kxy) - torch.outer(mc, mc)
    # A and C share the x-index s: E_s[mean_t A_st · mean_v C_sv]
    cov_ac = kxx.mean(2) @ kxy.mean(2).T / n - torch.outer(ma, mc)
    # B and C share the y-index v: E_v[mean_u B_uv · mean_s C_sv]
    cov_bc = kyy.mean(1) @ kxy.mean(1).T / m - torch.outer(mb, mc)
    return estimates, cov_aa + cov_bb + 2.0 * cov_cc - 2.0 * (cov_ac + cov_ac.T) - 2.0 * (cov_bc + cov_bc.T)


def optimize_kernel_weights(estimates: Tensor, covariance: Tensor, *, eps: float = 1e-3,
                            normalize: bool = True) -> Tensor:
    """Test-power kernel weights: argmin βᵀ(Q + εI)β s.t. βᵀm̂ = 1, β ≥ 0 (Gretton et al. 2012, NeurIPS).

    Solved with ``scipy.optimize.minimize(method="SLSQP")`` on a rescaled but equivalent problem
    (m̂ / max m̂, (Q + εI) / mean diag) from the feasible start m̂₊/‖m̂₊‖². ε = 1e-3 is the paper's
    value, 1e-5 the release's. Inputs are detached; the solve runs in float64 on the CPU.

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


def mk_mmd(x: Tensor, y: Tensor, *, gammas: Tensor | None = None, betas: Tensor | None = None,
           kernel: str = "paper", normalize: bool = False, estimator: str = "biased") -> Tensor:
    """MK-MMD² = Σ_j β_j MMD²_j(x, y); β uniform (1/K) when ``betas`` is None.

    ``betas`` may be (K,) or (K, 1) (the release's column layout). Differentiable w.r.t. ``x``
    and ``y`` (and ``betas``). See :func:`mmd_estimates` for the other arguments.
    """
    est = mmd_estimates(x, y, gammas=gammas, kernel=kernel, estimator=estimator, normalize=normalize)
    if betas is None:
        return est.mean()
    b = betas.reshape(-1).to(dtype=est.dtype, device=est.device)
    if b.shape[0] != est.shape[0]:
        raise ValueError(f"betas has {b.shape[0]} entries but there are {est.shape[0]} kernels")
    return (b * est).sum()


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
    g = kernel_bandwidths(kernel, dtype=torch.float64) if gammas is None else gammas
    g = g.reshape(-1).to(dtype=dtype, device=x.device)
    if g.numel() == 0 or not bool(torch.all(g > 0)) or not bool(torch.all(torch.isfinite(g))):
        raise ValueError("gammas must be a non-empty vector of finite positive values")
    return x, y, (g if kernel == "paper" else 1.0 / g)


def _kernel_blocks(x: Tensor, y: Tensor, scales: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(K, n, n), (K, m, m), (K, n, m) kernel matrices from one distance matrix of [x; y]."""
    n = x.shape[0]
    k = torch.exp(-scales[:, None, None] * squared_distances(torch.cat([x, y]))[None])
    return k[:, :n, :n], k[:, n:, n:], k[:, :n, n:]


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
    SLSQP with ftol 1e-12, retried once at 1e-9 when it stops on a line-search failure.
    """
    if not np.any(m > 0):
        return None
    m_scale = float(np.max(m))
    a_scale = float(np.mean(np.diag(a)))
    if not (a_scale > 0 and math.isfinite(a_scale)):
        a_scale = 1.0
    mt, at = m / m_scale, a / a_scale
    pos = np.clip(mt, 0.0, None)
    u0 = pos / float(pos @ pos)
    for ftol in (1e-12, 1e-9):
        res = minimize(lambda u: float(u @ at @ u), u0, jac=lambda u: 2.0 * (at @ u), method="SLSQP",
                       bounds=[(0.0, None)] * m.shape[0],
                       constraints=[{"type": "eq", "fun": lambda u: np.array([u @ mt - 1.0]),
                                     "jac": lambda u: mt[None, :]}],
                       options={"ftol": ftol, "maxiter": 1000})
        u = np.asarray(res.x, dtype=np.float64)
        if res.success and np.all(np.isfinite(u)) and u.min() >= -1e-6 and abs(u @ mt - 1.0) <= 1e-6:
            u = np.clip(u, 0.0, None)
            return u / float(u @ mt) / m_scale  # βᵀm = 1 exactly after the clip
    return None
