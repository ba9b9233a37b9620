"""MMD-D deep kernel (Liu et al. 2020): kernel values, estimators and power vs float64 loop references."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

from fedlatent.losses.mmd import batched_self_distances, squared_distances
from fedlatent.losses.mmd_d import (DeepKernel, GramWorkspace, _block_distances, _RowSumPower, _stacked_power, deep_kernel_matrix, mmd_d,
                                    mmd_d_power, mmd_d_stacked, stack_parameters, train_deep_kernel, train_deep_kernels)

SEMANTICS = ["official", "paper"]

# ------------------------------------------------------------------ independent float64 references


def _phi_ref(kernel: DeepKernel, row: np.ndarray) -> np.ndarray:
    linears = [m for m in kernel.featurizer if isinstance(m, nn.Linear)]
    h = row
    for i, lin in enumerate(linears):
        w = lin.weight.detach().double().numpy()
        b = lin.bias.detach().double().numpy()
        out = np.zeros(w.shape[0])
        for o in range(w.shape[0]):
            acc = b[o]
            for j in range(w.shape[1]):
                acc += w[o, j] * h[j]
            out[o] = acc
        h = out if i == len(linears) - 1 else np.array([math.log1p(math.exp(v)) for v in out])
    return h


def _k_ref(kernel: DeepKernel, a: np.ndarray, b: np.ndarray, semantics: str) -> float:
    fa, fb = _phi_ref(kernel, a), _phi_ref(kernel, b)
    s_phi, s_q = math.exp(kernel.log_sigma_phi.item()), math.exp(kernel.log_sigma_q.item())
    eps = 1.0 / (1.0 + math.exp(-kernel.eps_logit.item()))
    kappa = math.exp(-sum((u - v) ** 2 for u, v in zip(fa, fb)) / s_phi ** 2)
    q = math.exp(-sum((u - v) ** 2 for u, v in zip(a, b)) / s_q ** 2)
    if semantics == "official":
        return ((1 - eps) * kappa + eps) * q
    return (1 - eps) * kappa + eps * q


def _gram_ref(kernel, a, b, semantics):
    return [[_k_ref(kernel, ai, bj, semantics) for bj in b] for ai in a]


def _rows(t: torch.Tensor) -> list[np.ndarray]:
    return list(t.detach().double().reshape(t.shape[0], -1).numpy())


def _mmd_ref(kernel, x, y, semantics, estimator):
    xs, ys = _rows(x), _rows(y)
    n, m = len(xs), len(ys)
    kxx, kyy, kxy = (_gram_ref(kernel, xs, xs, semantics), _gram_ref(kernel, ys, ys, semantics),
                     _gram_ref(kernel, xs, ys, semantics))
    if estimator == "biased":
        return (sum(map(sum, kxx)) / n ** 2 + sum(map(sum, kyy)) / m ** 2 - 2 * sum(map(sum, kxy)) / (n * m))
    if estimator == "unbiased_two_sample":
        sxx = sum(kxx[i][j] for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
        syy = sum(kyy[i][j] for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
        return sxx + syy - 2 * sum(map(sum, kxy)) / (n * m)
    h = [[kxx[i][j] + kyy[i][j] - kxy[i][j] - kxy[j][i] for j in range(n)] for i in range(n)]
    return sum(h[i][j] for i in range(n) for j in range(n) if i != j) / (n * (n - 1))


def _power_ref(kernel, x, y, semantics):
    xs, ys = _rows(x), _rows(y)
    n = len(xs)
    kxx, kyy, kxy = (_gram_ref(kernel, xs, xs, semantics), _gram_ref(kernel, ys, ys, semantics),
                     _gram_ref(kernel, xs, ys, semantics))
    h = [[kxx[i][j] + kyy[i][j] - kxy[i][j] - kxy[j][i] for j in range(n)] for i in range(n)]
    mmd_u = sum(h[i][j] for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    var = 4 / n ** 3 * sum(sum(h[i]) ** 2 for i in range(n)) - 4 / n ** 4 * sum(map(sum, h)) ** 2
    return mmd_u / math.sqrt(var + 1e-8)


def _kernel(seed: int = 0, in_dim: int = 3, **kw) -> DeepKernel:
    return DeepKernel(in_dim, 6, 4, torch.Generator().manual_seed(seed), dtype=torch.float64, **kw)


def _data(n: int, m: int, d: int = 3, seed: int = 0, shift: float = 0.6):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, d, generator=g, dtype=torch.float64),
            torch.randn(m, d, generator=g, dtype=torch.float64) + shift)


# ------------------------------------------------------------------ construction


def test_architecture_and_parameters() -> None:
    k = DeepKernel(5, 8, 3, torch.Generator().manual_seed(0))
    linears = [m for m in k.featurizer if isinstance(m, nn.Linear)]
    assert [(lin.in_features, lin.out_features) for lin in linears] == [(5, 8), (8, 8), (8, 8), (8, 3)]
    assert [type(m) for m in k.featurizer] == [nn.Linear, nn.Softplus] * 3 + [nn.Linear]
    assert 0 < k.eps.item() < 1 and k.eps.item() == pytest.approx(0.01, rel=1e-5)
    assert k.sigma_q.item() == pytest.approx(math.sqrt(10), rel=1e-6)
    assert k.sigma_phi.item() == pytest.approx(math.sqrt(6), rel=1e-6)
    names = {n for n, _ in k.named_parameters()}
    assert {"log_sigma_phi", "log_sigma_q", "eps_logit"} <= names
    for lin in linears:
        bound = 1 / math.sqrt(lin.in_features)
        assert lin.weight.abs().max() <= bound and lin.bias.abs().max() <= bound
    with pytest.raises(ValueError):
        DeepKernel(5, 8, 3, torch.Generator(), eps=1.5)


def test_init_is_deterministic_and_leaves_global_rng_alone() -> None:
    state = torch.get_rng_state()
    a = DeepKernel(7, 16, 5, torch.Generator().manual_seed(123))
    b = DeepKernel(7, 16, 5, torch.Generator().manual_seed(123))
    c = DeepKernel(7, 16, 5, torch.Generator().manual_seed(124))
    assert torch.equal(torch.get_rng_state(), state)
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(pa, pb)
    assert not torch.equal(a.featurizer[0].weight, c.featurizer[0].weight)


# ------------------------------------------------------------------ values vs loops


@pytest.mark.parametrize("semantics", SEMANTICS)
def test_kernel_matrix_matches_loop(semantics: str) -> None:
    k = _kernel(eps=0.3)
    a, b = _data(4, 5, seed=1)
    got = deep_kernel_matrix(k, a, b, semantics=semantics)
    np.testing.assert_allclose(got.detach().numpy(), _gram_ref(k, _rows(a), _rows(b), semantics), rtol=1e-10)
    self_gram = deep_kernel_matrix(k, a, semantics=semantics)
    np.testing.assert_allclose(self_gram.detach().numpy(), _gram_ref(k, _rows(a), _rows(a), semantics), rtol=1e-10)
    assert torch.all(self_gram.diagonal() == 1.0)


def test_semantics_differ() -> None:
    k = _kernel(eps=0.3)
    a, b = _data(4, 5, seed=1)
    assert not torch.allclose(deep_kernel_matrix(k, a, b, semantics="official"),
                              deep_kernel_matrix(k, a, b, semantics="paper"))
    with pytest.raises(ValueError, match="semantics"):
        deep_kernel_matrix(k, a, b, semantics="liu")


@pytest.mark.parametrize("semantics", SEMANTICS)
@pytest.mark.parametrize("estimator,sizes", [("unbiased", (6, 6)), ("unbiased_two_sample", (6, 4)),
                                             ("biased", (5, 7)), ("unbiased_two_sample", (5, 5))])
def test_mmd_d_matches_loop(semantics: str, estimator: str, sizes: tuple[int, int]) -> None:
    k = _kernel(seed=2, eps=0.2)
    x, y = _data(*sizes, seed=3)
    got = mmd_d(x, y, k, semantics=semantics, estimator=estimator)
    assert got.item() == pytest.approx(_mmd_ref(k, x, y, semantics, estimator), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("semantics", SEMANTICS)
def test_power_matches_loop(semantics: str) -> None:
    k = _kernel(seed=4, eps=0.2)
    x, y = _data(7, 7, seed=5)
    got = mmd_d_power(x, y, k, semantics=semantics)
    assert got.item() == pytest.approx(_power_ref(k, x, y, semantics), rel=1e-8)


def test_extra_dims_are_flattened() -> None:
    k = _kernel(in_dim=6)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 2, 3, generator=g, dtype=torch.float64), torch.randn(5, 2, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(mmd_d(x, y, k), mmd_d(x.reshape(5, 6), y.reshape(5, 6), k))
    with pytest.raises(ValueError, match="expects 6 features"):
        mmd_d(x[:, :1], y[:, :1], k)


def test_unequal_sizes() -> None:
    k = _kernel()
    x, y = _data(6, 4)
    with pytest.raises(ValueError, match="equal batch sizes"):
        mmd_d(x, y, k)
    with pytest.raises(ValueError, match="equal batch sizes"):
        mmd_d_power(x, y, k)
    with pytest.raises(ValueError, match="estimator"):
        mmd_d(x, y, k, estimator="linear")
    assert torch.isfinite(mmd_d(x, y, k, estimator="unbiased_two_sample"))


def test_same_sample_and_distribution() -> None:
    k = _kernel()
    x, _ = _data(8, 8)
    assert mmd_d(x, x, k, estimator="biased").abs().item() < 1e-12
    g = torch.Generator().manual_seed(9)
    vals = torch.stack([mmd_d(*torch.randn(2, 12, 3, generator=g, dtype=torch.float64), k).detach()
                        for _ in range(200)])
    assert vals.mean().abs() <= 4 * vals.std() / math.sqrt(len(vals))  # unbiased: mean ~ 0


# ------------------------------------------------------------------ gradients


@pytest.mark.parametrize("semantics", SEMANTICS)
def test_gradcheck_inputs(semantics: str) -> None:
    k = _kernel(seed=6, eps=0.2)
    x, y = _data(5, 5, seed=7)
    x.requires_grad_(True)
    y.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: mmd_d(a, b, k, semantics=semantics), (x, y))
    assert torch.autograd.gradcheck(lambda a, b: mmd_d(a, b, k, semantics=semantics, estimator="biased"), (x, y))
    assert torch.autograd.gradcheck(lambda a, b: mmd_d_power(a, b, k, semantics=semantics), (x, y))


class _Wrap(nn.Module):
    def __init__(self, kernel: DeepKernel, semantics: str) -> None:
        super().__init__()
        self.k, self.semantics = kernel, semantics

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.stack([mmd_d(x, y, self.k, semantics=self.semantics),
                            mmd_d_power(x, y, self.k, semantics=self.semantics)])


@pytest.mark.parametrize("semantics", SEMANTICS)
def test_gradcheck_kernel_parameters(semantics: str) -> None:
    wrap = _Wrap(_kernel(seed=8, eps=0.2), semantics)
    x, y = _data(5, 5, seed=9)
    names, params = zip(*[(n, p.detach().clone().requires_grad_(True)) for n, p in wrap.named_parameters()])
    assert {"k.log_sigma_phi", "k.log_sigma_q", "k.eps_logit"} <= set(names)
    assert torch.autograd.gradcheck(lambda *ps: functional_call(wrap, dict(zip(names, ps)), (x, y)), params)


# ------------------------------------------------------------------ training


def test_train_deep_kernel_increases_power() -> None:
    # loose check on the training sample itself (held-out power is not asserted: with small
    # batches the featuriser overfits, as Liu et al.'s sample-splitting protocol anticipates)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 5, generator=gen)
    y = torch.randn(64, 5, generator=gen) * 1.3 + 0.4
    kernel = DeepKernel(5, 16, 5, torch.Generator().manual_seed(1))
    before = mmd_d_power(x, y, kernel).item()
    xr = x.clone().requires_grad_(True)
    values = train_deep_kernel(kernel, xr, y, steps=100, lr=1e-2)
    assert len(values) == 100 and all(math.isfinite(v) for v in values)
    assert values[0] == pytest.approx(before, rel=1e-5)
    assert xr.grad is None
    assert mmd_d_power(x, y, kernel).item() > 1.2 * before
    assert train_deep_kernel(kernel, x, y, steps=0) == []


def test_train_deep_kernel_default_lr_moves_parameters() -> None:
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(32, 4, generator=gen), torch.randn(32, 4, generator=gen) + 0.5
    kernel = DeepKernel(4, 8, 4, torch.Generator().manual_seed(3))
    start = {n: p.detach().clone() for n, p in kernel.named_parameters()}
    values = train_deep_kernel(kernel, x, y, steps=25)
    assert len(values) == 25 and values[-1] > values[0]
    assert any(not torch.equal(start[n], p) for n, p in kernel.named_parameters())


def _train_reference(kernel: DeepKernel, x: torch.Tensor, y: torch.Tensor, *, steps: int, lr: float,
                     semantics: str) -> list[float]:
    """The straightforward trainer: autograd through mmd_d_power (the full paired matrix H) and
    torch.optim.AdamW."""
    opt = torch.optim.AdamW(kernel.parameters(), lr=lr, weight_decay=0.01)
    values = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        power = mmd_d_power(x, y, kernel, semantics=semantics)
        (-power).backward()
        opt.step()
        values.append(power.item())
    return values


@pytest.mark.parametrize("semantics", ["official", "paper"])
@pytest.mark.parametrize("hidden,out_dim", [(6, 4), (3, 7)])
def test_train_deep_kernels_equal_the_straightforward_trainer(semantics: str, hidden: int, out_dim: int) -> None:
    """K kernels trained at once (stacked parameters, Ĵ from the Gram matrices' row sums, the
    AdamW step on the stacks) reach the weights and report the Ĵ values of K separate runs of
    autograd through mmd_d_power with torch.optim.AdamW, in float64; train_deep_kernel (one
    kernel) as well. The exception is φ's output bias: it shifts φ(a) and φ(b) alike, so its exact
    gradient is 0 and its float gradient is rounding noise that AdamW normalises into steps of at
    most lr each."""
    gen = torch.Generator().manual_seed(4)
    kernels = [DeepKernel(5, hidden, out_dim, gen, dtype=torch.float64) for _ in range(3)]
    xs = torch.randn(3, 12, 5, generator=gen, dtype=torch.float64)
    ys = torch.randn(3, 12, 5, generator=gen, dtype=torch.float64) * 1.2 + 0.5
    reference = [copy.deepcopy(k) for k in kernels]
    single = copy.deepcopy(kernels[1])
    start = [{n: p.detach().clone() for n, p in k.named_parameters()} for k in kernels]
    want_values = [_train_reference(k, x, y, steps=4, lr=0.01, semantics=semantics)
                   for k, x, y in zip(reference, xs, ys)]
    got_values = train_deep_kernels(kernels, xs, ys, steps=4, lr=0.01, semantics=semantics)
    assert got_values.shape == (4, 3)
    torch.testing.assert_close(got_values.T, torch.tensor(want_values, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    single_values = train_deep_kernel(single, xs[1], ys[1], steps=4, lr=0.01, semantics=semantics)
    assert single_values == pytest.approx(want_values[1], rel=1e-9)
    for got, want, first in zip(kernels + [single], reference + [reference[1]], start + [start[1]]):
        for (name, p), q in zip(got.named_parameters(), want.parameters()):
            if name == "featurizer.6.bias":
                assert float((p.detach() - first[name]).abs().max()) <= 4 * 0.01 * (1 + 1e-6)
            else:
                torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-11, msg=name)
        assert not torch.equal(got.featurizer[0].weight, first["featurizer.0.weight"])
    before = [k.eps_logit.clone() for k in kernels]
    assert train_deep_kernels(kernels, xs, ys, steps=0).shape == (0, 3)
    assert all(torch.equal(k.eps_logit, b) for k, b in zip(kernels, before))


@pytest.mark.parametrize("semantics", SEMANTICS)
@pytest.mark.parametrize("hidden,out_dim", [(5, 3), (3, 7)])
def test_stacked_power_and_gradient_equal_mmd_d_power(semantics: str, hidden: int, out_dim: int) -> None:
    """Ĵ from the row sums of the [x; y] Gram matrix (all kernels at once) equals mmd_d_power's
    value and parameter gradient (built on the full matrix H) in float64, also with a sample
    repeated (x_0 = y_0: the zero distances of a duplicated row); φ's output narrower than its
    hidden layers (distances of φ's outputs) and wider (distances of the hidden features under
    the metric WᵀW)."""
    gen = torch.Generator().manual_seed(11)
    kernels = [DeepKernel(4, hidden, out_dim, gen, dtype=torch.float64, eps=0.3) for _ in range(2)]
    xs = torch.randn(2, 9, 4, generator=gen, dtype=torch.float64)
    ys = torch.randn(2, 9, 4, generator=gen, dtype=torch.float64) * 0.8 + 0.3
    ys[:, 0] = xs[:, 0]
    names = [n for n, _ in kernels[0].named_parameters()]
    params = {n: torch.stack([dict(k.named_parameters())[n].detach() for k in kernels]).requires_grad_(True)
              for n in names}
    rows = torch.cat([xs, ys], 1)
    got = _stacked_power(kernels[0], params, rows, _blocks(torch.vmap(squared_distances)(rows)), semantics, 1e-8,
                         GramWorkspace())
    grads = torch.autograd.grad(got.sum(), list(params.values()), materialize_grads=True)
    for i, kernel in enumerate(kernels):
        want = mmd_d_power(xs[i], ys[i], kernel, semantics=semantics)
        torch.testing.assert_close(got[i], want.detach(), rtol=1e-12, atol=1e-14)
        for name, g, w in zip(names, grads, torch.autograd.grad(want, list(kernel.parameters()))):
            torch.testing.assert_close(g[i], w, rtol=1e-9, atol=1e-12, msg=name)


def _blocks(d2: torch.Tensor) -> torch.Tensor:
    """The blocks xx, xy, yy (K, 3, n, n) of (K, 2n, 2n) matrices."""
    n = d2.shape[1] // 2
    return torch.stack([d2[:, :n, :n], d2[:, :n, n:], d2[:, n:, n:]], 1)


def test_block_distances_equal_the_full_matrix() -> None:
    """The xx, xy, yy blocks of the [x; y] distances, exact zero diagonals in xx and yy (also
    with a repeated row, x_0 = y_0: a zero in xy's diagonal up to rounding)."""
    gen = torch.Generator().manual_seed(14)
    xs = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64)
    ys = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64) + 0.5
    ys[:, 0] = xs[:, 0]
    got = _block_distances(xs, ys, out=torch.empty(2, 3, 5, 5, dtype=torch.float64))
    want = _blocks(torch.vmap(squared_distances)(torch.cat([xs, ys], 1)))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.all(got[:, ::2].diagonal(dim1=2, dim2=3) == 0)


@pytest.mark.parametrize("official,metric", [(False, False), (True, False), (True, True)])
def test_row_sum_power_gradcheck(official: bool, metric: bool) -> None:
    """Ĵ from the signed row sums with its gradient formed in the forward pass: the value equals
    Ĵ of the dense Gram matrix (1 − ε)·exp(−c_φE [− c_qD]) + ε·exp(−c_qD) in float64 and the
    gradient matches finite differences, E the squared distances of features f (left = right = f)
    or of h under a metric M (left = hM); the buffers reused from call to call."""
    gen = torch.Generator().manual_seed(12)
    n, reg = 4, 1e-8
    h = torch.randn(2, 2 * n, 3, generator=gen, dtype=torch.float64)
    root = torch.randn(2, 3, 3, generator=gen, dtype=torch.float64)
    d2 = torch.vmap(squared_distances)(torch.randn(2, 2 * n, 4, generator=gen, dtype=torch.float64))
    c_phi = torch.tensor([0.3, 0.7], dtype=torch.float64)
    c_q = torch.tensor([0.2, 0.5], dtype=torch.float64)
    eps = torch.tensor([0.1, 0.4], dtype=torch.float64)
    k_xy = torch.rand(2, n, generator=gen, dtype=torch.float64)
    signs = torch.tensor([1.0] * n + [-1.0] * n, dtype=torch.float64)
    work = GramWorkspace()
    blocks = _blocks(d2)

    def power(h: torch.Tensor, root: torch.Tensor, c_phi: torch.Tensor, c_q: torch.Tensor, eps: torch.Tensor,
              k_xy: torch.Tensor) -> torch.Tensor:
        left = h @ (root.transpose(1, 2) @ root) if metric else h
        return _RowSumPower.apply(left, h, (left * h).sum(2), c_phi, c_q, eps, k_xy, blocks, official, reg, work)

    args = tuple(t.requires_grad_(True) for t in (h, root, c_phi, c_q, eps, k_xy))
    assert torch.autograd.gradcheck(power, args)
    e = torch.vmap(squared_distances)(h @ root.transpose(1, 2) if metric else h)
    a = torch.exp(-c_phi[:, None, None] * e - (c_q[:, None, None] * d2 if official else 0.0))
    gram = (1.0 - eps[:, None, None]) * a + eps[:, None, None] * torch.exp(-c_q[:, None, None] * d2)
    r = (gram @ signs)[:, :n] - (gram @ signs)[:, n:]
    mmd_u = (r.sum(1) - (2.0 - 2.0 * k_xy).sum(1)) / (n * (n - 1))
    var = 4.0 / n ** 3 * r.pow(2).sum(1) - 4.0 / n ** 4 * r.sum(1).pow(2)
    torch.testing.assert_close(power(*args), mmd_u / torch.sqrt(var + reg), rtol=1e-12, atol=1e-14)


def test_workspace_reuse_gives_the_same_training() -> None:
    """Kernels trained with one workspace across calls of different sample counts (its buffers
    grown, then handed out as smaller views) end exactly where fresh buffers take them."""
    gen = torch.Generator().manual_seed(21)
    data = [(torch.randn(2, m, 3, generator=gen), torch.randn(2, m, 3, generator=gen) + 0.5) for m in (6, 9, 4)]
    shared = GramWorkspace()
    kernels = [DeepKernel(3, 4, 5, torch.Generator().manual_seed(i)) for i in range(2)]
    twins = copy.deepcopy(kernels)
    for xs, ys in data:
        got = train_deep_kernels(kernels, xs, ys, steps=2, lr=0.01, workspace=shared)
        want = train_deep_kernels(twins, xs, ys, steps=2, lr=0.01)
        assert torch.equal(got, want)
    for k, t in zip(kernels, twins):
        assert all(torch.equal(p, q) for p, q in zip(k.parameters(), t.parameters()))
    big = shared.buffer("gram_a", (3, 3), torch.zeros(1))
    assert big.data_ptr() == shared.buffer("gram_a", (2, 2), torch.zeros(1)).data_ptr()
    assert shared.buffer("gram_a", (2, 2), torch.zeros(1, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("semantics", SEMANTICS)
@pytest.mark.parametrize("estimator,sizes", [("unbiased", (6, 6)), ("unbiased_two_sample", (6, 4)), ("biased", (3, 5))])
@pytest.mark.parametrize("hidden,out_dim", [(6, 4), (3, 7)])
def test_mmd_d_stacked_equals_each_kernel_alone(semantics: str, estimator: str, sizes: tuple[int, int], hidden: int,
                                                out_dim: int) -> None:
    """Three different kernels in one batched call: each value and each sample's gradient equal
    the float64 loop reference and mmd_d's, kernel by kernel; φ's output narrower than its hidden
    layers (distances of φ's outputs) and wider (distances of the hidden features under WᵀW)."""
    gen = torch.Generator().manual_seed(13)
    kernels = [DeepKernel(3, hidden, out_dim, gen, dtype=torch.float64, eps=0.1 + 0.2 * i) for i in range(3)]
    xs = torch.randn(3, sizes[0], 3, generator=gen, dtype=torch.float64).requires_grad_(True)
    ys = (torch.randn(3, sizes[1], 3, generator=gen, dtype=torch.float64) + 0.4).requires_grad_(True)
    got = mmd_d_stacked(xs, ys, kernels[0], stack_parameters(kernels), semantics=semantics, estimator=estimator)
    gx, gy = torch.autograd.grad(got.sum(), (xs, ys))
    for i, kernel in enumerate(kernels):
        assert float(got[i].detach()) == pytest.approx(_mmd_ref(kernel, xs[i], ys[i], semantics, estimator), rel=1e-9, abs=1e-12)
        x, y = xs[i].detach().requires_grad_(True), ys[i].detach().requires_grad_(True)
        wx, wy = torch.autograd.grad(mmd_d(x, y, kernel, semantics=semantics, estimator=estimator), (x, y))
        torch.testing.assert_close(gx[i], wx)
        torch.testing.assert_close(gy[i], wy)


@pytest.mark.parametrize("rows,dim", [(12, 3), (150, 4)])
def test_batched_distances_both_forms(rows: int, dim: int) -> None:
    """The per-step form (differences, small stacks) and the large-stack form agree with
    squared_distances per problem, zero diagonal included."""
    a = torch.randn(3, rows, dim, generator=torch.Generator().manual_seed(14), dtype=torch.float64)
    got = batched_self_distances(a)
    for k in range(3):
        torch.testing.assert_close(got[k], squared_distances(a[k]), rtol=1e-12, atol=1e-12)
        assert bool((got[k].diagonal() == 0).all())
