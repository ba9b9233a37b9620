"""MMD-D: MMD with a learned deep kernel (Liu et al. 2020, "Learning Deep Kernels for
Non-Parametric Two-Sample Tests", ICML), the second Ditto feature-drift constraint.

The kernel, with φ a small MLP, κ(u, v) = exp(−‖u − v‖²/σ_φ²), q(a, b) = exp(−‖a − b‖²/σ_q²)
and ε ∈ (0, 1):

* ``semantics="official"`` (Liu et al. Eq. 8 and the authors' release):
  k(a, b) = [(1 − ε) κ(φ(a), φ(b)) + ε] · q(a, b);
* ``semantics="paper"`` (the seed paper's text):
  k(a, b) = (1 − ε) κ(φ(a), φ(b)) + ε · q(a, b).

φ, σ_φ, σ_q and ε are trained by maximising the test-power proxy
Ĵ = MMD²_u / sqrt(σ̂²_H1 + 1e-8) (Liu et al. Eq. 4–5) with AdamW.

Example::

    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> kern = DeepKernel(4, 16, 4, g)
    >>> x, y = torch.randn(32, 4, generator=g), torch.randn(32, 4, generator=g) + 1.0
    >>> values = train_deep_kernel(kern, x, y, steps=3)
    >>> len(values), bool(mmd_d(x, y, kern) > 0)
    (3, True)
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from fedlatent.losses.mmd import _LOG2E, batched_self_distances, squared_distances
from fedlatent.losses.update import LocalOptimizer, Rule
from fedlatent.losses.amp import in_float32

__all__ = ["DeepKernel", "GramWorkspace", "deep_kernel_matrix", "mmd_d", "mmd_d_power", "mmd_d_stacked", "stack_parameters",
           "train_deep_kernel", "train_deep_kernels"]

_SEMANTICS = ("official", "paper")
_ESTIMATORS = ("unbiased", "unbiased_two_sample", "biased")


class DeepKernel(nn.Module):
    """Parameters of the MMD-D kernel: featuriser φ, log σ_φ, log σ_q, and ε = sigmoid(ε_logit).

    φ = Linear(in_dim, hidden) → Softplus → Linear(hidden, hidden) → Softplus →
    Linear(hidden, hidden) → Softplus → Linear(hidden, out_dim), the architecture of Liu et al.'s
    release. Initialisation draws only from ``generator`` (never from torch's global RNG), so a
    seeded generator gives identical kernels: weights and biases ~ U(−1/√fan_in, 1/√fan_in)
    (torch's default ``nn.Linear`` ranges). Bandwidths default to σ = sqrt(2·dim) of the space
    they act on (‖a − b‖² ≈ 2·dim for unit-variance coordinates). ε defaults to 0.01; Liu et al.
    start near 1e-10, which leaves ε practically untrained through the sigmoid.

    Args:
        in_dim: flattened feature size of the inputs.
        hidden: width of the three hidden layers.
        out_dim: size of φ's output.
        generator: the torch.Generator (CPU) used for the initial weights.
        sigma_phi: initial σ_φ (> 0); default sqrt(2·out_dim).
        sigma_q: initial σ_q (> 0); default sqrt(2·in_dim).
        eps: initial ε in (0, 1).
        dtype: parameter dtype (default: torch's default dtype).
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, generator: torch.Generator, *,
                 sigma_phi: float | None = None, sigma_q: float | None = None, eps: float = 0.01,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if min(in_dim, hidden, out_dim) < 1:
            raise ValueError(f"in_dim, hidden, out_dim must be ≥ 1, got {in_dim}, {hidden}, {out_dim}")
        if not 0.0 < eps < 1.0:
            raise ValueError(f"eps = {eps}: must be in (0, 1)")
        sigma_phi = math.sqrt(2.0 * out_dim) if sigma_phi is None else sigma_phi
        sigma_q = math.sqrt(2.0 * in_dim) if sigma_q is None else sigma_q
        if not (sigma_phi > 0 and sigma_q > 0):
            raise ValueError(f"sigma_phi and sigma_q must be > 0, got {sigma_phi}, {sigma_q}")
        dtype = dtype or torch.get_default_dtype()
        self.in_dim = in_dim
        sizes = [in_dim, hidden, hidden, hidden, out_dim]
        layers: list[nn.Module] = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            if i:
                layers.append(nn.Softplus())
            layers.append(_seeded_linear(fan_in, fan_out, generator, dtype))
        self.featurizer = nn.Sequential(*layers)
        self.log_sigma_phi = nn.Parameter(torch.tensor(math.log(sigma_phi), dtype=dtype))
        self.log_sigma_q = nn.Parameter(torch.tensor(math.log(sigma_q), dtype=dtype))
        self.eps_logit = nn.Parameter(torch.tensor(math.log(eps / (1.0 - eps)), dtype=dtype))

    @property
    def sigma_phi(self) -> Tensor:
        return self.log_sigma_phi.exp()

    @property
    def sigma_q(self) -> Tensor:
        return self.log_sigma_q.exp()

    @property
    def eps(self) -> Tensor:
        return torch.sigmoid(self.eps_logit)

    def forward(self, a: Tensor) -> Tensor:
        """φ(a) for a batch (N, …) flattened to (N, in_dim)."""
        return self.featurizer(_flatten(a, self.in_dim))


def deep_kernel_matrix(kernel: DeepKernel, a: Tensor, b: Tensor | None = None, *,
                       semantics: str = "official") -> Tensor:
    """Gram matrix k(a_i, b_j), (n, m); ``b=None`` for k(a_i, a_j) with exact zero self-distances.

    "official": k = [(1 − ε)·exp(−‖φ(a) − φ(b)‖²/σ_φ²) + ε] · exp(−‖a − b‖²/σ_q²);
    "paper":    k = (1 − ε)·exp(−‖φ(a) − φ(b)‖²/σ_φ²) + ε · exp(−‖a − b‖²/σ_q²).
    Distances on the raw inputs use the rows flattened to ``in_dim``.
    """
    if semantics not in _SEMANTICS:
        raise ValueError(f"semantics = {semantics!r}: expected 'official' or 'paper'")
    a = _flatten(a, kernel.in_dim)
    if b is None:
        d2_phi = squared_distances(kernel(a))
        d2_raw = squared_distances(a)
    else:
        b = _flatten(b, kernel.in_dim)
        d2_phi = squared_distances(kernel(a), kernel(b))
        d2_raw = squared_distances(a, b)
    # exp(d² · (−1/σ²)) with −1/σ² = −exp(−2 log σ) as one scalar: one pass over the matrix
    kappa = torch.exp(d2_phi * -torch.exp(-2.0 * kernel.log_sigma_phi))
    q = torch.exp(d2_raw * -torch.exp(-2.0 * kernel.log_sigma_q))
    eps = kernel.eps
    if semantics == "official":
        return ((1.0 - eps) * kappa + eps) * q
    return (1.0 - eps) * kappa + eps * q


@in_float32
def mmd_d(x: Tensor, y: Tensor, kernel: DeepKernel, *, semantics: str = "official",
          estimator: str = "unbiased") -> Tensor:
    """MMD² under the deep kernel; differentiable in x, y and the kernel's parameters.

    Estimators, with K the Gram matrices and H_ij = K^xx_ij + K^yy_ij − K^xy_ij − K^xy_ji:

    * ``"unbiased"`` (Liu et al. Eq. 2, their release): (1/(n(n−1))) Σ_{i≠j} H_ij. Needs n = m ≥ 2
      (it pairs x_i with y_i and so also leaves out the k(x_i, y_i) terms).
    * ``"unbiased_two_sample"`` (Gretton et al. 2012 JMLR Eq. 3): Σ_{i≠j}K^xx/(n(n−1)) +
      Σ_{i≠j}K^yy/(m(m−1)) − 2 mean(K^xy); any n, m ≥ 2.
    * ``"biased"``: the V-statistic mean(K^xx) + mean(K^yy) − 2 mean(K^xy); any n, m ≥ 1.
    """
    x, y = _flatten(x, kernel.in_dim), _flatten(y, kernel.in_dim)
    return mmd_d_stacked(x[None], y[None], kernel, stack_parameters([kernel]), semantics=semantics,
                         estimator=estimator)[0]


def stack_parameters(kernels: list[DeepKernel]) -> dict[str, Tensor]:
    """The parameters of kernels of one shape, by name, stacked along a new leading axis (K, …);
    differentiable in each kernel's parameters."""
    named = [dict(k.named_parameters()) for k in kernels]
    return {n: torch.stack([own[n] for own in named]) for n in named[0]}


@in_float32
def mmd_d_stacked(xs: Tensor, ys: Tensor, template: DeepKernel, params: dict[str, Tensor], *,
                  semantics: str = "official", estimator: str = "unbiased") -> Tensor:
    """:func:`mmd_d` of K kernels at once, kernel k (``params`` stacked as by
    :func:`stack_parameters`, ``template`` one of them or of their shape) on ``xs[k]``, ``ys[k]``
    ((K, n, …), (K, m, …)): the featuriser and the Gram matrices as batched products. (K,)"""
    if estimator not in _ESTIMATORS:
        raise ValueError(f"estimator = {estimator!r}: expected one of {', '.join(map(repr, _ESTIMATORS))}")
    if semantics not in _SEMANTICS:
        raise ValueError(f"semantics = {semantics!r}: expected 'official' or 'paper'")
    n, m = xs.shape[1], ys.shape[1]
    if estimator == "unbiased":
        _require_equal(n, m, "estimator='unbiased' (Liu et al. Eq. 2); use 'unbiased_two_sample' for n ≠ m")
    elif estimator == "unbiased_two_sample" and min(n, m) < 2:
        raise ValueError(f"the unbiased estimators need batch sizes ≥ 2, got {n} and {m}")
    rows = torch.cat([xs.flatten(2), ys.flatten(2)], 1)
    h, last = _stacked_hidden(template, params, rows.transpose(1, 2))
    h = h.transpose(1, 2)
    w = params[f"featurizer.{last}.weight"]
    if w.shape[1] > w.shape[2] and rows.shape[1] ** 2 * w.shape[2] <= 1 << 16:
        # φ wider than h: the distances of the hidden features under the metric WᵀW (see
        # _stacked_power), from their differences (exact zero diagonal) in h's smaller space
        diff = h[:, :, None] - h[:, None]
        d2_phi = (diff @ (w.transpose(1, 2) @ w)[:, None] * diff).sum(-1)
    else:
        d2_phi = batched_self_distances(torch.baddbmm(params[f"featurizer.{last}.bias"][:, None, :], h, w.transpose(1, 2)))
    d2_raw = batched_self_distances(rows)
    kappa = torch.exp(d2_phi * -torch.exp(-2.0 * params["log_sigma_phi"])[:, None, None])
    q = torch.exp(d2_raw * -torch.exp(-2.0 * params["log_sigma_q"])[:, None, None])
    eps = torch.sigmoid(params["eps_logit"])[:, None, None]
    k = ((1.0 - eps) * kappa + eps) * q if semantics == "official" else (1.0 - eps) * kappa + eps * q
    kxx, kyy, kxy = k[:, :n, :n], k[:, n:, n:], k[:, :n, n:]
    if estimator == "biased":
        return kxx.mean((1, 2)) + kyy.mean((1, 2)) - 2.0 * kxy.mean((1, 2))
    if estimator == "unbiased":
        h = kxx + kyy - kxy - k[:, n:, :n]
        return (h.sum((1, 2)) - h.diagonal(dim1=1, dim2=2).sum(1)) / (n * (n - 1))
    return ((kxx.sum((1, 2)) - kxx.diagonal(dim1=1, dim2=2).sum(1)) / (n * (n - 1))
            + (kyy.sum((1, 2)) - kyy.diagonal(dim1=1, dim2=2).sum(1)) / (m * (m - 1)) - 2.0 * kxy.mean((1, 2)))


@in_float32
def mmd_d_power(x: Tensor, y: Tensor, kernel: DeepKernel, *, semantics: str = "official",
                reg: float = 1e-8) -> Tensor:
    """Test-power proxy Ĵ = MMD²_u / sqrt(σ̂²_H1 + reg) (Liu et al. Eq. 4–5).

    MMD²_u = (1/(n(n−1))) Σ_{i≠j} H_ij and σ̂²_H1 = 4/n³ Σ_i (Σ_j H_ij)² − 4/n⁴ (Σ_ij H_ij)², sums
    over all j (diagonal included), clamped at 0 against rounding. Needs n = m ≥ 2.
    """
    _require_equal(_flatten(x, kernel.in_dim).shape[0], _flatten(y, kernel.in_dim).shape[0],
                   "mmd_d_power (Liu et al. Eq. 5 pairs x_i with y_i)")
    return _power(_paired_h(x, y, kernel, semantics), reg)


@in_float32
def train_deep_kernel(kernel: DeepKernel, x: Tensor, y: Tensor, *, steps: int, lr: float = 1e-3,
                      semantics: str = "official", weight_decay: float = 0.01,
                      reg: float = 1e-8) -> list[float]:
    """Maximise :func:`mmd_d_power` over the kernel's parameters with AdamW for ``steps`` steps.

    Updates ``kernel`` in place; ``x`` and ``y`` are detached (no gradient reaches the features).
    A fresh AdamW (torch defaults besides ``lr``, ``weight_decay``) is used per call. This is
    :func:`train_deep_kernels` for one kernel. Returns Ĵ evaluated before each step (length ``steps``).
    """
    _require_equal(_flatten(x, kernel.in_dim).shape[0], _flatten(y, kernel.in_dim).shape[0],
                   "train_deep_kernel (Liu et al. Eq. 5 pairs x_i with y_i)")
    values = train_deep_kernels([kernel], x[None], y[None], steps=steps, lr=lr, semantics=semantics,
                                weight_decay=weight_decay, reg=reg)
    return values[:, 0].tolist()


@in_float32
def train_deep_kernels(kernels: list[DeepKernel], xs: Tensor, ys: Tensor, *, steps: int, lr: float = 1e-3,
                       semantics: str = "official", weight_decay: float = 0.01, reg: float = 1e-8,
                       workspace: GramWorkspace | None = None) -> Tensor:
    """Maximise Ĵ (:func:`mmd_d_power`) for K kernels of one shape at once, kernel k on ``xs[k]``,
    ``ys[k]`` ((K, N, …) each), with the clients' update rule (:mod:`fedlatent.losses.update`:
    ``torch.optim.AdamW``'s step, torch defaults besides ``lr`` and ``weight_decay``, fresh moments)
    applied to the stacked parameters as multi-tensor operations. Updates the kernels in place and returns Ĵ before each step, (steps, K).

    Per step: φ of all 2N rows of every kernel in one batched pass, and Ĵ from the Gram matrices'
    row sums only (:func:`_stacked_power`), with its gradient formed kernel by kernel beside the
    Gram matrices and no other N×N matrix (:class:`_RowSumPower`). Equal to autograd through
    :func:`mmd_d_power` with ``torch.optim.AdamW`` up to float rounding. The raw inputs'
    distances are taken once per call; they and the Gram matrices live in the buffers of
    ``workspace`` (a fresh one when None): pass one that lives across calls so that this memory
    is allocated once, not at every call.
    """
    if steps < 0:
        raise ValueError(f"steps = {steps}: must be ≥ 0")
    if semantics not in _SEMANTICS:
        raise ValueError(f"semantics = {semantics!r}: expected 'official' or 'paper'")
    xs = xs.detach().flatten(2)
    ys = ys.detach().flatten(2)
    _require_equal(xs.shape[1], ys.shape[1], "train_deep_kernels (Liu et al. Eq. 5 pairs x_i with y_i)")
    if not steps:
        return xs.new_zeros(0, len(kernels))
    template = kernels[0]
    stacked = stack_parameters(kernels)
    names, params = list(stacked), [p.detach() for p in stacked.values()]
    rows = torch.cat([xs, ys], 1)
    work = workspace or GramWorkspace()
    # the raw inputs are fixed during the training: their distances are taken once for all steps
    raw_d2 = _block_distances(xs, ys, out=work.buffer("raw", (len(kernels), 3) + (xs.shape[1],) * 2, rows))
    optimizer = LocalOptimizer(Rule("adamw", lr, weight_decay=weight_decay), params)  # fresh moments
    values = []
    for _ in range(steps):
        leaves = [p.requires_grad_(True) for p in params]
        power = _stacked_power(template, dict(zip(names, leaves)), rows, raw_d2, semantics, reg, work)
        # φ's output bias cancels from every distance: exactly zero gradient (unused when the
        # distances are taken before the last layer), so AdamW applies only its weight decay to it
        grads = torch.autograd.grad(-power.sum(), leaves, materialize_grads=True)
        values.append(power.detach())
        params = [p.detach() for p in leaves]
        optimizer.step(params, list(grads))
    with torch.no_grad():
        for i, kernel in enumerate(kernels):
            own = dict(kernel.named_parameters())
            for n, p in zip(names, params):
                own[n].copy_(p[i])
    return torch.stack(values)


def _stacked_power(template: DeepKernel, params: dict[str, Tensor], rows: Tensor, raw_d2: Tensor,
                   semantics: str, reg: float, work: GramWorkspace) -> Tensor:
    """Ĵ of K kernels with stacked ``params`` (``template``'s names, a leading K axis) on ``rows`` =
    [x; y] (K, 2n, d), ``raw_d2`` their squared distances as the blocks xx, xy, yy of
    :func:`_block_distances` (K, 3, n, n). (K,)

    With s = [1_n; −1_n] and K the [x; y] Gram matrix, the row sums of the paired matrix H are
    r_i = (Ks)_i − (Ks)_{n+i}, Σ_ij H_ij = Σ_i r_i and H_ii = 2 − 2k(x_i, y_i) (k(a, a) = 1), so
    MMD²_u and σ̂²_H1 (Liu et al. Eq. 2, 5; see :func:`_power`) need only Ks: for "paper"
    (1 − ε)·κs + ε·qs, for "official" (1 − ε)·(κ⊙q)s + ε·qs.

    φ ends in a Linear layer φ(a) = W h(a) + b, so ‖φ(a) − φ(b)‖² = (h_a − h_b)ᵀ WᵀW (h_a − h_b):
    when φ's output is wider than h (50 against 10 in the Ditto presets) the distances are taken
    in h's space under the metric WᵀW, a smaller matrix product with the same values. The
    features are computed as columns (K, features, 2n). ``work`` holds the Gram matrices (see :class:`_RowSumPower`).
    """
    n = rows.shape[1] // 2
    h, last = _stacked_hidden(template, params, rows.transpose(1, 2))
    w, b = params[f"featurizer.{last}.weight"], params[f"featurizer.{last}.bias"]
    c_phi = torch.exp(-2.0 * params["log_sigma_phi"])
    c_q = torch.exp(-2.0 * params["log_sigma_q"])
    eps = torch.sigmoid(params["eps_logit"])[:, None]
    if w.shape[1] > w.shape[2]:
        columns = (w.transpose(1, 2) @ w) @ h, h  # (hM)ᵀ = Mhᵀ, M = WᵀW symmetric
    else:
        columns = (torch.baddbmm(b[:, :, None], w, h),) * 2
    norms = (columns[0] * columns[1]).sum(1)
    left, right = (c.transpose(1, 2) for c in columns)
    official = semantics == "official"
    # the paired distances ‖φ(x_i) − φ(y_i)‖² = (l_i − l_{n+i})·(r_i − r_{n+i}) in the same space
    l_t, r_t = columns
    kappa_xy = torch.exp(-c_phi[:, None] * ((l_t[:, :, :n] - l_t[:, :, n:]) * (r_t[:, :, :n] - r_t[:, :, n:])).sum(1))
    q_xy = torch.exp(-c_q[:, None] * raw_d2[:, 1].diagonal(dim1=1, dim2=2))
    k_xy = ((1.0 - eps) * kappa_xy + eps) * q_xy if official else (1.0 - eps) * kappa_xy + eps * q_xy
    return _RowSumPower.apply(left, right, norms, c_phi, c_q, eps[:, 0], k_xy, raw_d2, official, reg,
                              work)


def _stacked_hidden(template: DeepKernel, params: dict[str, Tensor], columns: Tensor) -> tuple[Tensor, int]:
    """φ of K kernels at once up to its last Linear layer, on the rows as columns:
    (K, in_dim, N) → (K, hidden, N), and that layer's index; ``params`` stacked as in
    :func:`_stacked_power`, each Linear layer one batched product W·h + b (for φ's narrow layers
    several times faster than the row layout's h·Wᵀ)."""
    h = columns
    layers = list(template.featurizer)
    for i, layer in enumerate(layers[:-1]):
        if isinstance(layer, nn.Linear):
            h = torch.baddbmm(params[f"featurizer.{i}.bias"][:, :, None], params[f"featurizer.{i}.weight"], h)
        else:
            h = layer(h)
    return h, len(layers) - 1


class _RowSumPower(torch.autograd.Function):
    """Ĵ = MMD²_u / sqrt(σ̂²_H1 + reg) per kernel (Liu et al. Eq. 4–5) from the signed row sums
    Ks, s = [1_n; −1_n], of the [x; y] Gram matrix K = (1 − ε)·A + ε·B (see :func:`_stacked_power`),
    with A_ab = exp(−c_φ·E_ab [− c_q·D_ab when ``official``]) and B_ab = exp(−c_q·D_ab):
    E_ab = ‖·‖²_a + ‖·‖²_b − 2 l_a·r_b (``norms``, ``left``, ``right``: (K, 2n), (K, 2n, p),
    (K, 2n, p)) a squared distance written as an inner product (l = r = f for ‖f_a − f_b‖²; l = hM,
    r = h for (h_a − h_b)ᵀM(h_a − h_b)), clamped at 0 with an exact zero diagonal as
    :func:`squared_distances`; D the fixed raw-input distances as the blocks xx, xy, yy
    (K, 3, n, n) of :func:`_block_distances`; ``k_xy`` (K, n) the paired values k(x_i, y_i).
    Differentiable in left, right, norms, c_φ, c_q, ε and k_xy.

    The matrices are symmetric: only their blocks xx, xy and yy are formed (yx = xyᵀ), three
    quarters of the exponentials. Ĵ_k depends on kernel k's matrices only, so the gradient is
    formed with the forward pass, kernel by kernel, while A and B are in cache (buffers of
    ``work``, reused): with r = (Ks)_{:n} − (Ks)_{n:}, T = Σr, m = MMD²_u, V = σ̂²_H1 and
    σ = sqrt(V + reg), ∂Ĵ/∂r = 1/(σn(n−1)) − m/(2σ³)·(8r/n³ − 8T/n⁴) (0 for the second term where
    V < 0 is clamped), ∂Ĵ/∂k_xy = 2/(σn(n−1)), g = ∂Ĵ/∂(Ks) = [∂Ĵ/∂r; −∂Ĵ/∂r]. The gradient never
    forms g sᵀ: with v = As and g_A = (1 − ε)g, ∂Ĵ/∂l_a = 2c_φ g_a (A(s∘r))_a,
    ∂Ĵ/∂r_a = 2c_φ s_a (A(g∘l))_a, ∂Ĵ/∂‖·‖²_a = −c_φ(g_a v_a + s_a (Ag)_a),
    ∂Ĵ/∂c_φ = −Σ_ab g_a s_b A_ab E_ab (E expanded as above, gᵀA(s∘‖·‖²) read as (s∘‖·‖²)ᵀ(Ag)),
    all from one product of A with 2p + 1 columns, and ∂Ĵ/∂c_q = −g_Aᵀ(A⊙D)s [official] − εgᵀ(B⊙D)s.
    The backward pass scales the stored gradients by the incoming one."""

    @staticmethod
    def forward(ctx, left: Tensor, right: Tensor, norms: Tensor, c_phi: Tensor, c_q: Tensor, eps: Tensor,
                k_xy: Tensor, d2: Tensor, official: bool, reg: float, work: GramWorkspace) -> Tensor:
        count, size, p = left.shape
        n = size // 2
        a = work.buffer("gram_a", (3, n, n), d2)
        b = work.buffer("gram_b", (3, n, n), d2)
        scratch = work.buffer("scratch", (3, n, n), d2)
        signs = torch.cat([left.new_ones(n), -left.new_ones(n)])
        # −scale·E's blocks from one batched product each: [2·scale·l, −scale·‖·‖², −scale]·[r, 1, ‖·‖²]ᵀ,
        # scale = c_φ·log2 e; exp(t) as 2^(t·log2 e) (torch's exp2 runs ~4x faster than its exp
        # on CPU and agrees with it to float rounding)
        phi_scale, q_scale = -c_phi * _LOG2E, -c_q * _LOG2E
        factors, others = _block_factors(left, right, norms)
        factors = phi_scale[:, None, None, None] * factors
        sr = (signs[:, None] * right).transpose(1, 2)
        # per kernel: As, Bs, g = ∂Ĵ/∂(Ks), the product [g, s∘r, g∘l]ᵀA and (B⊙D)s [(A⊙D)s];
        # the gradients are assembled from them for all kernels at once afterwards
        v_a, v_b, g, u_b = (left.new_empty(count, size) for _ in range(4))
        u_a = left.new_empty(count, size) if official else None
        prods = left.new_empty(count, 2 * p + 1, size)
        eps_of, pair_terms = eps.tolist(), (2.0 - 2.0 * k_xy).sum(1).tolist()
        pairs = n * (n - 1)
        values, sigmas = [], []
        for k in range(count):
            torch.bmm(factors[k], others[k], out=a)
            a.clamp_max_(0.0)
            a[::2].diagonal(dim1=1, dim2=2).zero_()
            if official:
                a.addcmul_(d2[k], q_scale[k])
            _block_row_sums(a.exp2_(), out=v_a[k])
            _block_row_sums(torch.mul(d2[k], q_scale[k], out=b).exp2_(), out=v_b[k])
            ks = torch.add(v_a[k] * (1.0 - eps_of[k]), v_b[k], alpha=eps_of[k])
            r = ks[:n] - ks[n:]
            total, square = r.sum().item(), r.dot(r).item()
            mmd_u = (total - pair_terms[k]) / pairs
            var = 4.0 / n ** 3 * square - 4.0 / n ** 4 * total ** 2
            sigma = math.sqrt(max(var, 0.0) + reg)
            values.append(mmd_u / sigma)
            sigmas.append(sigma)
            slope = mmd_u / (2.0 * sigma ** 3) * 8.0 / n ** 3 if var >= 0 else 0.0
            torch.add(r * -slope, 1.0 / (pairs * sigma) + slope * total / n, out=g[k, :n])
            torch.neg(g[k, :n], out=g[k, n:])
            # [g, s∘r, g∘l]ᵀ A (A symmetric: the columns of A [g, s∘r, g∘l]), by blocks
            cols = torch.cat([g[k, None], sr[k], (g[k, :, None] * left[k]).T])
            torch.cat([torch.addmm(cols[:, :n] @ a[0], cols[:, n:], a[1].T),
                       torch.addmm(cols[:, :n] @ a[1], cols[:, n:], a[2])], 1, out=prods[k])
            _block_row_sums(torch.mul(b, d2[k], out=scratch), out=u_b[k])
            if u_a is not None:
                _block_row_sums(torch.mul(a, d2[k], out=scratch), out=u_a[k])
        keep = (1.0 - eps)[:, None]
        g_a, a_g = g * keep, prods[:, 0] * keep
        a_sr, a_gl = prods[:, 1:p + 1].transpose(1, 2), prods[:, p + 1:].transpose(1, 2) * keep[:, :, None]
        c = c_phi[:, None]
        grad_q = -eps * (g * u_b).sum(1) - ((g_a * u_a).sum(1) if u_a is not None else 0.0)
        ctx.save_for_backward(
            2.0 * c[:, :, None] * g_a[:, :, None] * a_sr, 2.0 * c[:, :, None] * signs[:, None] * a_gl,
            -c * (g_a * v_a + signs * a_g),
            -((g_a * norms * v_a).sum(1) + (signs * norms * a_g).sum(1) - 2.0 * (g_a[:, :, None] * left * a_sr).sum((1, 2))),
            grad_q, (g * (v_b - v_a)).sum(1),
            (2.0 / pairs / torch.tensor(sigmas, dtype=k_xy.dtype, device=k_xy.device))[:, None].expand_as(k_xy))
        return torch.tensor(values, dtype=c_phi.dtype, device=c_phi.device)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        scaled = tuple(t * grad.view(-1, *[1] * (t.dim() - 1)) for t in ctx.saved_tensors)
        return scaled + (None,) * 4


def _block_row_sums(blocks: Tensor, *, out: Tensor) -> Tensor:
    """Ms into ``out`` (2n,) for the symmetric [[M_xx, M_xy], [M_xyᵀ, M_yy]] given as its blocks
    (3, n, n) and s = [1_n; −1_n]: [M_xx 1 − M_xy 1; M_xyᵀ 1 − M_yy 1]."""
    n = blocks.shape[1]
    rows = blocks.sum(2)
    torch.sub(rows[0], rows[1], out=out[:n])
    return torch.sub(blocks[1].sum(0), rows[2], out=out[n:])


class GramWorkspace:
    """Work buffers of :func:`train_deep_kernels` (the Gram matrices of every kernel and the raw
    inputs' distances, tens of MB), kept from call to call: allocating them afresh at each of
    thousands of steps costs more in page faults than the arithmetic on them. A buffer grows to
    the largest size asked for and is handed out as a view of its first elements."""

    def __init__(self) -> None:
        self._buffers: dict[str, Tensor] = {}

    def buffer(self, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """The buffer ``name`` as an uninitialised tensor of ``shape`` with ``like``'s dtype and device."""
        size = math.prod(shape)
        held = self._buffers.get(name)
        if held is None or held.numel() < size or held.dtype != like.dtype or held.device != like.device:
            held = self._buffers[name] = like.new_empty(size)
        return held[:size].view(shape)


def _block_factors(left: Tensor, right: Tensor, norms: Tensor) -> tuple[Tensor, Tensor]:
    """[−2l, ‖·‖², 1] and [r, 1, ‖·‖²]ᵀ for the blocks xx, xy, yy (K, 3, n, p + 2), (K, 3, p + 2, n)."""
    n = left.shape[1] // 2
    ones = norms[:, :, None].new_ones(()).expand_as(norms[:, :, None])
    a = torch.cat([left * -2.0, norms[:, :, None], ones], 2)
    b = torch.cat([right, ones, norms[:, :, None]], 2)
    return (torch.stack([a[:, :n], a[:, :n], a[:, n:]], 1),
            torch.stack([b[:, :n], b[:, n:], b[:, n:]], 1).transpose(2, 3))


def _block_distances(xs: Tensor, ys: Tensor, *, out: Tensor) -> Tensor:
    """The blocks xx, xy, yy of the squared distances of the rows of each [xs[k]; ys[k]]
    ((K, n, d) each) into ``out`` (K, 3, n, n), as :func:`squared_distances` (clamped at 0, exact
    zero diagonals in xx and yy) for all blocks in one batched product; yx is xy transposed."""
    rows = torch.cat([xs, ys], 1)
    torch.matmul(*_block_factors(rows, rows, rows.pow(2).sum(2)), out=out).clamp_min_(0.0)
    out[:, ::2].diagonal(dim1=2, dim2=3).zero_()
    return out


# ---------------------------------------------------------------------------------------------

def _seeded_linear(fan_in: int, fan_out: int, generator: torch.Generator, dtype: torch.dtype) -> nn.Linear:
    layer = torch.nn.utils.skip_init(nn.Linear, fan_in, fan_out, dtype=dtype)  # no global-RNG draw
    bound = 1.0 / math.sqrt(fan_in)
    with torch.no_grad():
        for p in (layer.weight, layer.bias):
            u = torch.rand(p.shape, generator=generator, dtype=torch.float64)
            p.copy_((2.0 * u - 1.0) * bound)
    return layer


def _flatten(a: Tensor, in_dim: int) -> Tensor:
    if a.ndim == 0 or a.shape[0] == 0:
        raise ValueError(f"expected a non-empty batch (N, …), got shape {tuple(a.shape)}")
    a = a.reshape(a.shape[0], -1)
    if a.shape[1] != in_dim:
        raise ValueError(f"the deep kernel expects {in_dim} features per row, got {a.shape[1]}")
    return a


def _paired_h(x: Tensor, y: Tensor, kernel: DeepKernel, semantics: str) -> Tensor:
    """H_ij = K^xx_ij + K^yy_ij − K^xy_ij − K^xy_ji, the last read off the symmetric [x; y] Gram
    matrix's lower-left block (no transposed copy)."""
    x, y = _flatten(x, kernel.in_dim), _flatten(y, kernel.in_dim)
    n = x.shape[0]
    k = deep_kernel_matrix(kernel, torch.cat([x, y]), semantics=semantics)
    return k[:n, :n] + k[n:, n:] - k[:n, n:] - k[n:, :n]


def _power(h: Tensor, reg: float) -> Tensor:
    """Ĵ = MMD²_u / sqrt(σ̂²_H1 + reg) from the paired matrix H (Liu et al. Eq. 4–5)."""
    n = h.shape[0]
    var = (4.0 / n ** 3 * h.sum(1).pow(2).sum() - 4.0 / n ** 4 * h.sum().pow(2)).clamp_min(0.0)
    return _mmd_u(h) / torch.sqrt(var + reg)


def _mmd_u(h: Tensor) -> Tensor:
    n = h.shape[0]
    return (h.sum() - h.diagonal().sum()) / (n * (n - 1))


def _require_equal(n: int, m: int, what: str) -> None:
    if n != m or n < 2:
        raise ValueError(f"{what} needs equal batch sizes ≥ 2, got {n} and {m}")
