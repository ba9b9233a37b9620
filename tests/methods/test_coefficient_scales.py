"""Each preset's coefficient is applied on the scale it was tuned on (configs/AUDIT.md, "Coefficient
scales"): the default penalty, at the published coefficient, equals the reference form of the paper
or release that published it, with its gradient (float64). FedDecorr's case is pinned in
``test_feddecorr_strength.py``."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedlatent.losses.decov import decov
from fedlatent.methods import resolve
from fedlatent.methods.fedproto import PRESENT, PROTO, _Prototypes
from fedlatent.methods.parts import ClientRound, TermContext, task_loss
from fedlatent.models.base import ModelOutput

GEN = torch.Generator().manual_seed(22)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN, dtype=torch.float64)


def _part(preset: str, name: str, **opts):
    (part,) = [p for p in resolve({"name": preset, **opts}).all_parts() if p.name == name]
    return part


def _ctx(z: torch.Tensor, logits: torch.Tensor, y: torch.Tensor, **kw) -> TermContext:
    fields = dict(params={}, global_params={}, global_out=None, prev_out=None, state={}, payload={})
    fields.update(kw)
    return TermContext(out=ModelOutput(logits=logits, z=z), y=y, num_classes=logits.shape[1], **fields)


def _value_and_grad(fn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    value = fn(x)
    (grad,) = torch.autograd.grad(value, x)
    return value.detach(), grad


@pytest.mark.parametrize("mu", [0.01, 0.001])
def test_fedprox_is_half_mu_squared_distance_over_all_weights(mu: float) -> None:
    """FedProx paper Eq. 2 and the MOON / FedUV releases: (μ/2)·Σ_tensors ‖w − w_g‖², a sum over
    the whole model (not a mean per parameter): μ 0.01 (preset), 0.001 (FedDecorr, SphereFed)."""
    shapes = {"a.weight": (5, 3), "a.bias": (5,), "b.weight": (2, 5)}
    params = {n: _randn(*s).requires_grad_(True) for n, s in shapes.items()}
    global_params = {n: _randn(*s) for n, s in shapes.items()}
    part = _part("fedprox", "prox", mu=mu)
    z = _randn(4, 3)
    ours = part.weight * part.loss(_ctx(z, z, torch.zeros(4, dtype=torch.long), params=params,
                                        global_params=global_params))
    reference = sum((mu / 2) * torch.linalg.norm(params[n] - global_params[n]) ** 2 for n in shapes)
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=0)
    ours_grad = torch.autograd.grad(ours, list(params.values()))
    ref_grad = torch.autograd.grad(reference, list(params.values()))
    for a, b in zip(ours_grad, ref_grad):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0)


@pytest.mark.parametrize("mu,tau", [(1.0, 0.5), (5.0, 0.5), (1.0, 1.0)])
def test_moon_is_mu_times_batch_mean_cross_entropy_of_cosines(mu: float, tau: float) -> None:
    """MOON release: logits = [cos(z, z_glob), cos(z, z_prev)] / τ, μ·CrossEntropyLoss (mean over
    the batch) with the positive at index 0; μ 1 / 5, τ 0.5 (1 in the FedDecorr release)."""
    z, z_glob, z_prev = _randn(8, 6), _randn(8, 6), _randn(8, 6)
    part = _part("moon", "moon", mu=mu, tau=tau)
    y = torch.zeros(8, dtype=torch.long)

    def ours(x):
        ctx = _ctx(x, x, y, global_out=ModelOutput(logits=z_glob, z=z_glob), prev_out=ModelOutput(logits=z_prev, z=z_prev))
        return part.weight * part.loss(ctx)

    def release(x):
        logits = torch.stack([F.cosine_similarity(x, z_glob, dim=-1), F.cosine_similarity(x, z_prev, dim=-1)], 1)
        return mu * F.cross_entropy(logits / tau, y)

    for a, b in zip(_value_and_grad(ours, z), _value_and_grad(release, z)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


def test_fedproto_default_is_the_release_mse_at_lambda_1() -> None:
    """FedProto release: λ·MSELoss(z, z with each row of a class with a global prototype replaced by
    it), a mean over N·d; λ = 1. Rows without a prototype count in the denominator."""
    z, protos = _randn(10, 4), _randn(3, 4)
    present = torch.tensor([True, False, True])
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 2])
    part = _part("fedproto", "fedproto")

    def ours(x):
        return part.weight * part.loss(_ctx(x, x[:, :3], y, payload={PROTO: protos, PRESENT: present},
                                               scratch={"fedproto": _Prototypes()}))

    def release(x):
        target = x.detach().clone()
        target[present[y]] = protos[y[present[y]]]
        return 1.0 * F.mse_loss(x, target)

    for a, b in zip(_value_and_grad(ours, z), _value_and_grad(release, z)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


def _feduv_release(z: torch.Tensor, logits: torch.Tensor, mu: float, lam: float) -> torch.Tensor:
    """The FedUV release's two terms: μ·mean_{i<j} exp(−‖z_i − z_j‖²/σ) (σ the torch.median of the
    non-zero squared distances) + λ·mean_c relu(γ − std_batch(p_c)) with γ = mean std of I_C."""
    sq = torch.pdist(z).pow(2)
    sigma = torch.median(sq[sq > 0])
    uniformity = torch.exp(-sq / sigma).mean()
    num_classes = logits.shape[1]
    gamma = torch.eye(num_classes, dtype=z.dtype).std(0).mean()
    variance = F.relu(gamma - F.softmax(logits, 1).std(0)).mean()
    return mu * uniformity + lam * variance


def test_feduv_defaults_are_the_release_terms_at_c_10() -> None:
    """μ 0.5 and λ = C/4 (the default λ = −1) are the release's μ 0.5, λ 2.5 at C = 10; both
    terms are means (over pairs, over classes) in the paper and the release alike."""
    z, logits = _randn(12, 5), _randn(12, 10) * 0.3
    spec = resolve({"name": "feduv"})
    y = torch.zeros(12, dtype=torch.long)

    def ours(x):
        ctx = _ctx(x, logits, y)
        return sum(p.weight * p.loss(ctx) for p in spec.all_parts() if p.name == "uniformity") + \
            sum(p.loss(ctx) for p in spec.all_parts() if p.name == "variance")

    def ours_logits(x):
        ctx = _ctx(z, x, y)
        return sum(p.loss(ctx) for p in spec.all_parts() if p.name == "variance")

    for a, b in zip(_value_and_grad(ours, z), _value_and_grad(lambda x: _feduv_release(x, logits, 0.5, 2.5), z)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
    _, ours_grad = _value_and_grad(ours_logits, logits)
    _, ref_grad = _value_and_grad(lambda x: _feduv_release(z, x, 0.5, 2.5), logits)
    torch.testing.assert_close(ours_grad, ref_grad, rtol=1e-12, atol=1e-15)


def test_spherefed_mse_is_the_mean_over_batch_and_classes() -> None:
    """SphereFed's MSE (1/C)‖Wz − onehot(y)‖², averaged over the batch, is torch's MSELoss: the
    scale its learning rates (Table 16) were tuned on."""
    logits, y = _randn(7, 5), torch.tensor([0, 1, 2, 3, 4, 0, 1])
    reference = ((logits - torch.eye(5, dtype=torch.float64)[y]).square().sum(1) / 5).mean()
    torch.testing.assert_close(task_loss("mse", logits, y), reference, rtol=1e-12, atol=0)


def test_decov_is_a_sum_over_pairs_about_d_squared_over_2n_times_feddecorr() -> None:
    """Why FedDecorr's β = 0.1 does not carry over to DeCov (no published coefficient): on
    standardised features (biased variance) DeCov = ½·Σ_{i≠j} K_ij² = ½·d(d−1)·mean_{i≠j} K_ij²,
    while the FedDecorr release's loss is ≈ N·mean_{i≠j} K_ij²: DeCov at the same β is
    d(d−1)/(2N) times stronger (≈ 1.3·10⁴ at d = 1280, N = 64)."""
    n, d = 64, 16
    h = _randn(n, d) @ _randn(d, d)
    standardised = (h - h.mean(0)) / h.std(0, unbiased=False)
    k = standardised.T @ standardised / n
    off = ~torch.eye(d, dtype=torch.bool)
    torch.testing.assert_close(decov(standardised), 0.5 * d * (d - 1) * k[off].square().mean(), rtol=1e-12, atol=0)


def test_feddyn_gradient_is_the_release_at_alpha_0_01() -> None:
    """FedDyn release: α_k = α / (n_k·K/Σn), loss += α_k·Σ_params θ·(λ_k − θ_srv) (a sum over the
    whole model) and weight decay α_k; α = 0.01. The preset's term plus its extra weight decay
    give the same gradient: α_k·(λ_k − θ_srv + θ)."""
    model = torch.nn.Linear(3, 2).double()
    names = [n for n, _ in model.named_parameters()]
    global_params = {n: _randn(*p.shape) for n, p in model.named_parameters()}
    lam = {n: _randn(*p.shape) for n, p in model.named_parameters()}
    part = _part("feddyn", "feddyn")
    rc = ClientRound(0, model, global_params, {f"feddyn.lambda.{n}": lam[n] for n in names}, {}, 0.1,
                     num_samples=30, num_clients=4, total_samples=200, momentum=0.0)
    part.begin(rc)
    params = dict(model.named_parameters())
    z = _randn(5, 2)
    ctx = _ctx(z, z, torch.zeros(5, dtype=torch.long), params=params, global_params=global_params, rc=rc)
    ours = torch.autograd.grad(part.weight * part.loss(ctx), [params[n] for n in names])
    alpha_k = 0.01 / (30 * 4 / 200)
    assert rc.extra_weight_decay == pytest.approx(alpha_k, rel=1e-12)
    release = alpha_k * sum((params[n] * (-global_params[n] + lam[n])).sum() for n in names)
    reference = torch.autograd.grad(release, [params[n] for n in names])
    for n, a, b in zip(names, ours, reference):
        torch.testing.assert_close(a + rc.extra_weight_decay * params[n].detach(),
                                   b + alpha_k * params[n].detach(), rtol=1e-12, atol=1e-15)
