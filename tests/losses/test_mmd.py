"""MK-MMD estimates, their covariance and the test-power kernel weights, against float64 loop references."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedlatent.losses.mmd import (kernel_bandwidths, mk_mmd, mmd_estimates, mmd_estimates_covariance,
                                  optimize_kernel_weights)

# ------------------------------------------------------------------ independent float64 references


def _gammas_ref() -> list[float]:
    return [2.0 ** (-3.5 + 0.25 * i) for i in range(19)]


def _rows(t: torch.Tensor, normalize: bool) -> list[np.ndarray]:
    a = t.detach().to(torch.float64).reshape(t.shape[0], -1).numpy()
    rows = []
    for r in a:
        rows.append(r / max(math.sqrt(float(np.dot(r, r))), 1e-12) if normalize else r.copy())
    return rows


def _k(a: np.ndarray, b: np.ndarray, gamma: float, kernel: str) -> float:
    d2 = 0.0
    for ai, bi in zip(a, b):
        d2 += (ai - bi) ** 2
    return math.exp(-gamma * d2) if kernel == "paper" else math.exp(-d2 / gamma)


def _biased_ref(x, y, gammas, kernel, normalize):
    xs, ys = _rows(x, normalize), _rows(y, normalize)
    out = []
    for g in gammas:
        sxx = sum(_k(a, b, g, kernel) for a in xs for b in xs) / len(xs) ** 2
        syy = sum(_k(a, b, g, kernel) for a in ys for b in ys) / len(ys) ** 2
        sxy = sum(_k(a, b, g, kernel) for a in xs for b in ys) / (len(xs) * len(ys))
        out.append(sxx + syy - 2 * sxy)
    return np.array(out)


def _linear_h_ref(x, y, gammas, kernel, normalize):
    xs, ys = _rows(x, normalize), _rows(y, normalize)
    hs = []
    for g in gammas:
        row = []
        for i in range(len(xs) // 2):
            x1, x2, y1, y2 = xs[2 * i], xs[2 * i + 1], ys[2 * i], ys[2 * i + 1]
            row.append(_k(x1, x2, g, kernel) + _k(y1, y2, g, kernel) - _k(x1, y2, g, kernel) - _k(x2, y1, g, kernel))
        hs.append(row)
    return hs


def _linear_ref(x, y, gammas, kernel, normalize):
    return np.array([sum(r) / len(r) for r in _linear_h_ref(x, y, gammas, kernel, normalize)])


def _cov_linear_ref(x, y, gammas, kernel, normalize):
    hs = _linear_h_ref(x, y, gammas, kernel, normalize)
    k, p = len(hs), len(hs[0])
    means = [sum(r) / p for r in hs]
    q = np.zeros((k, k))
    for i in range(k):
        for j in range(k):
            q[i, j] = sum((hs[i][t] - means[i]) * (hs[j][t] - means[j]) for t in range(p)) / (p - 1)
    return q


def _cov_all_ref(x, y, gammas, kernel, normalize):
    """Population covariance of h(x_s, x_t, y_u, y_v) over all n²m² index quadruples."""
    xs, ys = _rows(x, normalize), _rows(y, normalize)
    n, m = len(xs), len(ys)
    hs = []
    for g in gammas:
        kxx = [[_k(a, b, g, kernel) for b in xs] for a in xs]
        kyy = [[_k(a, b, g, kernel) for b in ys] for a in ys]
        kxy = [[_k(a, b, g, kernel) for b in ys] for a in xs]
        hs.append([kxx[s][t] + kyy[u][v] - kxy[s][v] - kxy[t][u]
                   for s in range(n) for t in range(n) for u in range(m) for v in range(m)])
    k, total = len(hs), len(hs[0])
    means = [sum(r) / total for r in hs]
    q = np.zeros((k, k))
    for i in range(k):
        for j in range(i + 1):
            q[i, j] = q[j, i] = sum((a - means[i]) * (b - means[j]) for a, b in zip(hs[i], hs[j])) / total
    return q, np.array(means)


def _cov_paired_ref(x, y, gammas, kernel, normalize):
    """The release's covariance: entries H_st (x_s paired with y_s) as samples, divisor n² − 1."""
    xs, ys = _rows(x, normalize), _rows(y, normalize)
    n = len(xs)
    hs = []
    for g in gammas:
        hs.append([_k(xs[s], xs[t], g, kernel) + _k(ys[s], ys[t], g, kernel) - _k(xs[s], ys[t], g, kernel)
                   - _k(xs[t], ys[s], g, kernel) for s in range(n) for t in range(n)])
    k = len(hs)
    means = [sum(r) / n ** 2 for r in hs]
    q = np.zeros((k, k))
    for i in range(k):
        for j in range(k):
            q[i, j] = sum((a - means[i]) * (b - means[j]) for a, b in zip(hs[i], hs[j])) / (n ** 2 - 1)
    return q


def _data(n: int, m: int, d: int = 3, seed: int = 0, shift: float = 0.5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = 0.8 * torch.randn(n, d, generator=g, dtype=dtype)
    y = 0.8 * torch.randn(m, d, generator=g, dtype=dtype) + shift
    return x, y


KERNELS = ["paper", "official"]
NORMALIZE = [False, True]

# ------------------------------------------------------------------ bandwidths


def test_kernel_bandwidths_values() -> None:
    for kernel in KERNELS:
        g = kernel_bandwidths(kernel)
        assert g.shape == (19,)
        np.testing.assert_allclose(g.double().numpy(), _gammas_ref(), rtol=1e-6)
    assert kernel_bandwidths("paper", dtype=torch.float64)[0].item() == pytest.approx(2.0 ** -3.5, rel=1e-15)
    assert kernel_bandwidths("official", dtype=torch.float64)[-1].item() == 2.0
    with pytest.raises(ValueError, match="kernel"):
        kernel_bandwidths("rbf")


# ------------------------------------------------------------------ estimates vs loops


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("normalize", NORMALIZE)
@pytest.mark.parametrize("sizes", [(6, 6), (7, 4), (3, 8)])
def test_biased_matches_loop_reference(kernel: str, normalize: bool, sizes: tuple[int, int]) -> None:
    x, y = _data(*sizes)
    got = mmd_estimates(x, y, kernel=kernel, normalize=normalize)
    want = _biased_ref(x, y, _gammas_ref(), kernel, normalize)
    assert got.dtype == torch.float64 and got.shape == (19,)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("normalize", NORMALIZE)
@pytest.mark.parametrize("n", [8, 9])
def test_linear_matches_loop_reference(kernel: str, normalize: bool, n: int) -> None:
    x, y = _data(n, n, seed=1)
    got = mmd_estimates(x, y, kernel=kernel, normalize=normalize, estimator="linear")
    want = _linear_ref(x, y, _gammas_ref(), kernel, normalize)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-12)


def test_custom_gammas_and_extra_dims_are_flattened() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 2, 3, generator=g, dtype=torch.float64)
    y = torch.randn(4, 2, 3, generator=g, dtype=torch.float64)
    gammas = torch.tensor([0.1, 1.0, 3.0], dtype=torch.float64)
    for kernel in KERNELS:
        got = mmd_estimates(x, y, gammas=gammas, kernel=kernel)
        want = _biased_ref(x.reshape(5, 6), y.reshape(4, 6), [0.1, 1.0, 3.0], kernel, False)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-12)
        flat = mmd_estimates(x.reshape(5, 6), y.reshape(4, 6), gammas=gammas, kernel=kernel)
        torch.testing.assert_close(got, flat)


def test_float32_inputs_close_to_float64() -> None:
    x, y = _data(10, 12)
    got = mmd_estimates(x.float(), y.float(), kernel="official", normalize=True)
    assert got.dtype == torch.float32
    want = mmd_estimates(x, y, kernel="official", normalize=True)
    np.testing.assert_allclose(got.double().numpy(), want.numpy(), atol=1e-5)


def test_input_validation() -> None:
    x, y = _data(6, 5)
    with pytest.raises(ValueError, match="equal batch sizes"):
        mmd_estimates(x, y, estimator="linear")
    with pytest.raises(ValueError, match="feature sizes"):
        mmd_estimates(x, y[:, :2])
    with pytest.raises(ValueError, match="estimator"):
        mmd_estimates(x, y, estimator="unbiased")
    with pytest.raises(ValueError, match="kernel"):
        mmd_estimates(x, y, kernel="gauss")
    with pytest.raises(ValueError, match="gammas"):
        mmd_estimates(x, y, gammas=torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="non-empty"):
        mmd_estimates(x[:0], y)
    with pytest.raises(ValueError, match="quadruples"):
        mmd_estimates_covariance(x, y, quadruples="paired")
    with pytest.raises(ValueError, match="2 quadruples"):
        mmd_estimates_covariance(x[:3], x[:3] + 1, estimator="linear")
    with pytest.raises(ValueError, match="betas"):
        mk_mmd(x, y, betas=torch.ones(3))


# ------------------------------------------------------------------ covariance vs loops


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("normalize", NORMALIZE)
@pytest.mark.parametrize("sizes", [(4, 4), (5, 3)])
def test_biased_covariance_matches_quadruple_loop(kernel: str, normalize: bool, sizes: tuple[int, int]) -> None:
    x, y = _data(*sizes, seed=2)
    got = mmd_estimates_covariance(x, y, kernel=kernel, normalize=normalize)
    want, means = _cov_all_ref(x, y, _gammas_ref(), kernel, normalize)
    assert got.shape == (19, 19)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-8, atol=1e-12)
    # the quadruples' mean is the biased estimate itself
    np.testing.assert_allclose(mmd_estimates(x, y, kernel=kernel, normalize=normalize).numpy(), means,
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("normalize", NORMALIZE)
def test_paired_covariance_matches_release_definition(kernel: str, normalize: bool) -> None:
    x, y = _data(5, 5, seed=4)
    got = mmd_estimates_covariance(x, y, kernel=kernel, normalize=normalize, quadruples="paired")
    want = _cov_paired_ref(x, y, _gammas_ref(), kernel, normalize)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("normalize", NORMALIZE)
@pytest.mark.parametrize("n", [8, 11])
def test_linear_covariance_matches_loop(kernel: str, normalize: bool, n: int) -> None:
    x, y = _data(n, n, seed=5)
    got = mmd_estimates_covariance(x, y, kernel=kernel, normalize=normalize, estimator="linear")
    want = _cov_linear_ref(x, y, _gammas_ref(), kernel, normalize)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-8, atol=1e-12)


def test_covariances_are_symmetric_psd() -> None:
    x, y = _data(12, 9, seed=6)
    for q in (mmd_estimates_covariance(x, y), mmd_estimates_covariance(x, y[:9].repeat(2, 1)[:12], quadruples="paired"),
              mmd_estimates_covariance(x, x.flip(0) + 0.3, estimator="linear")):
        torch.testing.assert_close(q, q.T)
        assert torch.linalg.eigvalsh(q).min() > -1e-10


# ------------------------------------------------------------------ same distribution, mk_mmd


def test_same_distribution() -> None:
    x, _ = _data(9, 9, seed=7)
    for kernel in KERNELS:
        assert torch.allclose(mmd_estimates(x, x, kernel=kernel), torch.zeros(19, dtype=torch.float64), atol=1e-12)
        assert torch.allclose(mmd_estimates(x, x, kernel=kernel, estimator="linear"),
                              torch.zeros(19, dtype=torch.float64), atol=1e-12)
    g = torch.Generator().manual_seed(8)
    lin = []
    for _ in range(300):
        a, b = torch.randn(2, 16, 3, generator=g, dtype=torch.float64)
        assert (mmd_estimates(a, b) >= -1e-12).all()  # the V-statistic is a squared RKHS norm
        lin.append(mmd_estimates(a, b, estimator="linear"))
    lin_t = torch.stack(lin)
    mean, se = lin_t.mean(0), lin_t.std(0) / math.sqrt(len(lin))
    assert (mean.abs() <= 4 * se + 1e-12).all()  # unbiased: mean ~ 0


@pytest.mark.parametrize("estimator", ["biased", "linear"])
@pytest.mark.parametrize("n,m,d", [(8, 8, 3), (60, 60, 20)])  # mk_mmd's direct and Gram-matrix paths
def test_mk_mmd_is_weighted_sum(estimator: str, n: int, m: int, d: int) -> None:
    x, y = _data(n, m, d=d, seed=9)
    est = mmd_estimates(x, y, kernel="official", estimator=estimator, normalize=True)
    betas = torch.linspace(0.0, 1.0, 19, dtype=torch.float64)
    betas = betas / betas.sum()
    got = mk_mmd(x, y, betas=betas, kernel="official", estimator=estimator, normalize=True)
    want = sum(float(b) * float(m) for b, m in zip(betas, est))
    assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert mk_mmd(x, y, betas=betas[:, None], kernel="official", estimator=estimator,
                  normalize=True).item() == pytest.approx(want, rel=1e-12, abs=1e-15)
    uniform = mk_mmd(x, y, kernel="official", estimator=estimator, normalize=True)
    assert uniform.item() == pytest.approx(sum(float(m) for m in est) / 19, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("normalize", NORMALIZE)
@pytest.mark.parametrize("estimator", ["biased", "linear"])
def test_gradcheck(kernel: str, normalize: bool, estimator: str) -> None:
    n, m = (6, 6) if estimator == "linear" else (5, 4)
    x, y = _data(n, m, seed=10)
    x.requires_grad_(True)
    y.requires_grad_(True)
    betas = torch.rand(19, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda a, b: mk_mmd(a, b, betas=betas, kernel=kernel, normalize=normalize, estimator=estimator), (x, y))
    assert torch.autograd.gradcheck(
        lambda a, b: mmd_estimates_covariance(a, b, kernel=kernel, normalize=normalize,
                                              estimator=estimator)[::6, ::6], (x, y))


@pytest.mark.parametrize("sizes", [(5, 4, 3), (40, 30, 48)])  # mk_mmd's direct and Gram-matrix paths
def test_mk_mmd_gradient_equals_weighted_estimates_gradient(sizes: tuple[int, int, int]) -> None:
    x, y = _data(*sizes, seed=12)
    x.requires_grad_(True)
    betas = torch.rand(19, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (got,) = torch.autograd.grad(mk_mmd(x, y, betas=betas, kernel="paper", normalize=True), x)
    (want,) = torch.autograd.grad((betas * mmd_estimates(x, y, kernel="paper", normalize=True)).sum(), x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("estimator", ["biased", "linear"])
@pytest.mark.parametrize("n,d", [(5, 3), (40, 48)])  # the direct and the Gram-matrix paths
def test_mk_mmd_batch_equals_one_problem_at_a_time(estimator: str, n: int, d: int) -> None:
    from fedlatent.losses.mmd import mk_mmd_batch
    pairs = [_data(n, n, d=d, seed=20 + i, shift=0.3 * i) for i in range(3)]
    xs = torch.stack([x for x, _ in pairs]).requires_grad_(True)
    ys = torch.stack([y for _, y in pairs])
    betas = torch.rand(3, 19, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    opts = dict(kernel="official", normalize=True, estimator=estimator)
    got = mk_mmd_batch(xs, ys, betas=betas, **opts)
    want = torch.stack([mk_mmd(xs[i], ys[i], betas=betas[i], **opts) for i in range(3)])
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-14)
    (g_got,) = torch.autograd.grad(got.sum(), xs)
    (g_want,) = torch.autograd.grad(want.sum(), xs)
    torch.testing.assert_close(g_got, g_want, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError):
        mk_mmd_batch(xs[0], ys[0], betas=betas[0])


def test_estimates_with_covariance_batch_equals_one_problem_at_a_time() -> None:
    from fedlatent.losses.mmd import mmd_estimates_with_covariance, mmd_estimates_with_covariance_batch
    pairs = [_data(30, 30, d=4, seed=30 + i, shift=0.2 * i) for i in range(3)]
    xs, ys = torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs])
    for quadruples in ("paired", "all"):
        ms, qs = mmd_estimates_with_covariance_batch(xs, ys, kernel="paper", normalize=True, quadruples=quadruples)
        for i, (x, y) in enumerate(pairs):
            m, q = mmd_estimates_with_covariance(x, y, kernel="paper", normalize=True, quadruples=quadruples)
            torch.testing.assert_close(ms[i], m, rtol=1e-9, atol=1e-13)
            torch.testing.assert_close(qs[i], q, rtol=1e-9, atol=1e-13)
    ms, qs = mmd_estimates_with_covariance_batch(xs, ys, estimator="linear")  # loops over the batch
    m, q = mmd_estimates_with_covariance(xs[1], ys[1], estimator="linear")
    torch.testing.assert_close((ms[1], qs[1]), (m, q))
    with pytest.raises(ValueError, match="stacks"):
        mmd_estimates_with_covariance_batch(xs[0], ys[0])
    with pytest.raises(ValueError, match="quadruples"):
        mmd_estimates_with_covariance_batch(xs, ys, quadruples="some")


def test_gaussians_by_squaring_equal_exponentials() -> None:
    from fedlatent.losses.mmd import _gaussians, _squaring_levels
    d2 = torch.rand(3, 7, dtype=torch.float64) * 4
    for scales in [(1.0, 3.0, 2.0, 6.0, 4.0, 0.7), tuple(kernel_bandwidths("official", dtype=torch.float64).tolist())]:
        s = torch.tensor(scales, dtype=torch.float64)
        levels = _squaring_levels(scales)
        assert sorted(j for kernels, _ in levels for j in kernels) == list(range(len(scales)))
        for dim in (0, 1):
            for grad in (False, True):
                with torch.set_grad_enabled(grad):
                    stack, order = _gaussians(s, d2.clone().requires_grad_(grad), levels, dim=dim)
                want = torch.exp(-s[order].reshape([-1] + [1] * 2).movedim(0, dim) * d2.unsqueeze(dim))
                torch.testing.assert_close(stack, want, rtol=1e-13, atol=0)
    assert len(_squaring_levels(tuple(kernel_bandwidths("paper", dtype=torch.float64).tolist()))) == 5


def test_paired_covariance_gradient() -> None:
    x, y = _data(6, 6, seed=13)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda a: mmd_estimates_covariance(a, y, kernel="official", normalize=True, quadruples="paired")[::5, ::5], (x,))


# ------------------------------------------------------------------ kernel weights


def _objective(beta: np.ndarray, q: np.ndarray, eps: float) -> float:
    return float(beta @ (q + eps * np.eye(len(beta))) @ beta)


@pytest.mark.parametrize("eps", [1e-3, 1e-5])
def test_weights_feasible_and_better_than_uniform(eps: float) -> None:
    x, y = _data(16, 16, seed=11, shift=0.7)
    for est_kind in ("biased", "linear"):
        m = mmd_estimates(x, y, estimator=est_kind, kernel="official", normalize=True)
        q = mmd_estimates_covariance(x, y, estimator=est_kind, kernel="official", normalize=True)
        raw = optimize_kernel_weights(m, q, eps=eps, normalize=False).numpy()
        if not (m > 0).any():
            continue
        assert raw.min() >= 0
        assert float(raw @ m.numpy()) == pytest.approx(1.0, abs=1e-6)
        beta = optimize_kernel_weights(m, q, eps=eps)
        assert beta.sum().item() == pytest.approx(1.0, abs=1e-12)
        np.testing.assert_allclose(beta.numpy(), raw / raw.sum(), atol=1e-12)
        if (m > 0).all():
            uniform = np.ones(19) / float(m.sum())
            assert _objective(raw, q.numpy(), eps) <= _objective(uniform, q.numpy(), eps) * (1 + 1e-8)


def test_weights_match_closed_form_when_interior() -> None:
    # with A⁻¹m > 0 the bound is inactive and β* = A⁻¹m / (mᵀA⁻¹m)
    rng = np.random.default_rng(0)
    b = rng.normal(size=(5, 5))
    q = b @ b.T / 5 + np.eye(5)
    m = np.array([0.3, 0.5, 0.2, 0.4, 0.35])
    a = q + 1e-3 * np.eye(5)
    w = np.linalg.solve(a, m)
    if (w <= 0).any():  # choose m inside the cone instead
        m = a @ np.ones(5) * 0.1
        w = np.linalg.solve(a, m)
    want = w / (m @ w)
    got = optimize_kernel_weights(torch.tensor(m), torch.tensor(q), eps=1e-3, normalize=False).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8)


def test_weights_active_bound_two_kernels() -> None:
    # unconstrained optimum has a negative entry: β ≥ 0 binds; compare with a fine grid on the segment
    m = np.array([1.0, 0.2])
    q = np.array([[1.0, 0.9], [0.9, 1.0]])
    got = optimize_kernel_weights(torch.tensor(m), torch.tensor(q), eps=1e-3, normalize=False).numpy()
    ts = np.linspace(0.0, 1.0, 200001)  # β = (t/m0, (1−t)/m1) sweeps the feasible set
    objs = [_objective(np.array([t / m[0], (1 - t) / m[1]]), q, 1e-3) for t in ts[::100]]
    best = min(objs)
    assert got.min() >= 0 and float(got @ m) == pytest.approx(1.0, abs=1e-9)
    assert _objective(got, q, 1e-3) <= best + 1e-9


@pytest.mark.parametrize("quadprog_fails", [False, True])
def test_weights_singular_covariance_without_ridge(quadprog_fails: bool, monkeypatch) -> None:
    # ε = 0 and a rank-1 Q (not positive definite); with quadprog out of the way SLSQP must answer.
    # Reference: a grid over the feasible segment β = (t/m0, (1−t)/m1)
    import fedlatent.losses.mmd as mmd
    if quadprog_fails:
        monkeypatch.setattr(mmd, "_quadprog", lambda mt, at: None)
    m = np.array([0.5, 0.25])
    q = np.array([[1.0, 1.0], [1.0, 1.0]])
    got = optimize_kernel_weights(torch.tensor(m), torch.tensor(q), eps=0.0, normalize=False).numpy()
    grid = [_objective(np.array([t / m[0], (1 - t) / m[1]]), q, 0.0) for t in np.linspace(0, 1, 2001)]
    assert got.min() >= 0 and float(got @ m) == pytest.approx(1.0, abs=1e-9)
    assert _objective(got, q, 0.0) <= min(grid) + 1e-7


def test_weights_quadprog_and_slsqp_agree() -> None:
    from fedlatent.losses.mmd import _quadprog, _slsqp
    x, y = _data(24, 24, seed=5, shift=0.4)
    m = mmd_estimates(x, y, kernel="official", normalize=True).numpy()
    q = mmd_estimates_covariance(x, y, kernel="official", normalize=True).numpy()
    mt, at = m / m.max(), (q + 1e-3 * np.eye(19)) / np.mean(np.diag(q + 1e-3 * np.eye(19)))
    exact = _quadprog(mt, at)
    iterative = next(u for u in _slsqp(mt, at) if u is not None)
    assert exact is not None and float(exact @ mt) == pytest.approx(1.0, abs=1e-9) and exact.min() >= -1e-12
    assert float(exact @ at @ exact) <= float(iterative @ at @ iterative) + 1e-9


def test_weights_fallback_when_no_positive_estimate() -> None:
    m = torch.tensor([-0.3, -0.01, -0.02, 0.0], dtype=torch.float64)
    q = torch.diag(torch.tensor([1.0, 1e-4, 1.0, 0.5], dtype=torch.float64))
    # m/σ = (−0.3, −1.0, −0.02, 0.0): the zero estimate wins
    beta = optimize_kernel_weights(m, q)
    torch.testing.assert_close(beta, torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64))
    m2 = torch.tensor([-0.3, -0.01, -0.02], dtype=torch.float64)
    q2 = torch.diag(torch.tensor([1.0, 1e-4, 1.0], dtype=torch.float64))  # m/σ = (−0.3, −1.0, −0.02)
    torch.testing.assert_close(optimize_kernel_weights(m2, q2, normalize=False),
                               torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))


def test_weights_dtype_and_validation() -> None:
    m = torch.tensor([0.1, 0.2], dtype=torch.float32)
    q = torch.eye(2, dtype=torch.float32)
    beta = optimize_kernel_weights(m, q)
    assert beta.dtype == torch.float32 and beta.shape == (2,)
    with pytest.raises(ValueError):
        optimize_kernel_weights(m, torch.eye(3))
    with pytest.raises(ValueError):
        optimize_kernel_weights(torch.tensor([float("nan"), 1.0]), q)


@pytest.mark.parametrize("estimator,quadruples", [("biased", "all"), ("biased", "paired"), ("linear", "all")])
def test_fused_estimates_and_covariance_equal_the_separate_functions(estimator, quadruples):
    from fedlatent.losses.mmd import mmd_estimates_with_covariance
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(12, 4, generator=gen, dtype=torch.float64), torch.randn(12, 4, generator=gen, dtype=torch.float64) + 0.5
    m, q = mmd_estimates_with_covariance(x, y, kernel="official", estimator=estimator, quadruples=quadruples)
    assert torch.allclose(m, mmd_estimates(x, y, kernel="official", estimator=estimator), atol=1e-12)
    assert torch.allclose(q, mmd_estimates_covariance(x, y, kernel="official", estimator=estimator,
                                                      quadruples=quadruples), atol=1e-12)
