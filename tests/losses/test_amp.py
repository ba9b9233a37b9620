"""Mixed precision's pure pieces (:mod:`fedlatent.losses.amp`): the float32 terms under a bfloat16
autocast against float64 references, and fp16's dynamic loss scale (GradScaler's rule)."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from fedlatent.analysis.diagnostics import feature_moments
from fedlatent.calibration import ffc_solve, ffc_statistics
from fedlatent.calibration.ccvr import class_statistics
from fedlatent.losses import decorrelation, decov, mk_mmd, moon_contrastive, uniformity, variance
from fedlatent.losses.amp import BACKOFF, GROWTH, INIT_SCALE, INTERVAL, LossScale, in_float32
from fedlatent.methods.parts import task_loss


def _bf16(*shape: int, seed: int = 0) -> torch.Tensor:
    """Random values that bfloat16 holds exactly (the inputs a bf16 forward hands a term)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


LABELS = torch.arange(12) % 3
TERMS: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = {
    "uniformity": (uniformity, (_bf16(12, 5),)),
    "uniformity_stacked": (uniformity, (_bf16(2, 12, 5),)),
    "variance": (variance, (_bf16(12, 4),)),
    "decorrelation": (decorrelation, (_bf16(12, 5),)),
    "decov": (decov, (_bf16(12, 5),)),
    "mk_mmd": (mk_mmd, (_bf16(12, 5), _bf16(10, 5, seed=1))),
    "moon_contrastive": (lambda z, g, p: moon_contrastive(z, g, p, 0.5), (_bf16(12, 5), _bf16(12, 5, seed=1),
                                                                           _bf16(12, 5, seed=2))),
    "ffc_statistics": (lambda z: ffc_statistics(z, LABELS, 3), (_bf16(12, 5),)),
    "ccvr_statistics": (lambda z: class_statistics(z, LABELS, 3), (_bf16(12, 5),)),
    "collapse_moments": (lambda z: feature_moments(z)[1:], (_bf16(12, 5),)),
    "cross_entropy": (lambda logits: task_loss("ce", logits, LABELS), (_bf16(12, 3),)),
    "mse": (lambda logits: task_loss("mse", logits, LABELS), (_bf16(12, 3),)),
}


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return [getattr(out, f) for f in out.__dataclass_fields__ if isinstance(getattr(out, f), torch.Tensor)]


@pytest.mark.parametrize("name", sorted(TERMS))
def test_float32_terms_under_bf16_autocast_match_float64(name: str) -> None:
    """Under a bfloat16 autocast, fed bfloat16 inputs, a float32 term returns float32 (at least:
    statistics accumulated in float64 stay so) equal to its float64 value to float32 rounding."""
    fn, inputs = TERMS[name]
    reference = _tensors(fn(*(x.double() for x in inputs)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _tensors(fn(*inputs))
    assert len(got) == len(reference)
    for g, r in zip(got, reference):
        if not g.is_floating_point():  # counts
            assert torch.equal(g, r)
            continue
        assert g.dtype in (torch.float32, torch.float64), name
        torch.testing.assert_close(g.double(), r, rtol=2e-5, atol=1e-6, msg=name)


def test_ffc_solve_under_autocast_is_float32() -> None:
    stats = ffc_statistics(_bf16(30, 4).float(), torch.arange(30) % 3, 3)
    reference = ffc_solve(tuple(t.double() for t in stats), ridge=0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = ffc_solve(stats, ridge=0.1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference, rtol=1e-4, atol=1e-5)


def test_in_float32_leaves_float32_and_float64_calls_alone() -> None:
    """Outside autocast a float32 or float64 call is the function's own (same object out); a
    matrix product inside stays float32 under autocast (it would be bfloat16 without the guard)."""
    @in_float32
    def gram(z: torch.Tensor) -> torch.Tensor:
        return z @ z.T

    for dtype in (torch.float32, torch.float64):
        z = torch.randn(4, 3, dtype=dtype)
        assert gram(z).dtype == dtype
        assert torch.equal(gram(z), z @ z.T)
    z = torch.randn(4, 3)
    expected = z @ z.T
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (z @ z.T).dtype == torch.bfloat16
        assert torch.equal(gram(z), expected)
    half = z.bfloat16()
    assert torch.equal(gram(half), half.float() @ half.float().T)


def test_in_float32_keeps_the_gradient_flowing_to_bf16_inputs() -> None:
    z = torch.randn(6, 3).bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = uniformity(z)
    (grad,) = torch.autograd.grad(value, z)
    assert grad.dtype == torch.bfloat16
    reference = z.detach().double().requires_grad_()
    (expected,) = torch.autograd.grad(uniformity(reference), reference)
    torch.testing.assert_close(grad.double(), expected, rtol=1e-2, atol=1e-3)  # bf16 gradient


# fp16's dynamic loss scale ------------------------------------------------------------------------
def _tiny() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(4, 3, dtype=torch.float64, generator=g).requires_grad_()
    b = torch.randn(3, dtype=torch.float64, generator=g).requires_grad_()
    x = torch.randn(8, 4, dtype=torch.float64, generator=g)
    y = torch.arange(8) % 3
    return w, b, x, y


def test_scaled_then_unscaled_gradients_equal_the_plain_ones_in_float64() -> None:
    """The scale is a power of two: scaling the loss and unscaling the gradients changes no bit,
    so the SGD step equals the unscaled (fp32-arithmetic) step."""
    w, b, x, y = _tiny()
    loss = torch.nn.functional.cross_entropy(x @ w + b, y)
    plain = torch.autograd.grad(loss, [w, b], retain_graph=True)
    scale = LossScale.restore([{}], stacked=False, device=torch.device("cpu"))
    assert float(scale.scale) == INIT_SCALE
    scaled = torch.autograd.grad(scale.scaled(loss), [w, b])
    grads, finite = scale.unscale(list(scaled))
    assert bool(finite)
    for got, want in zip(grads, plain):
        assert got is not None
        assert torch.equal(got, want)
        assert torch.equal(w.detach() - 0.1 * got, w.detach() - 0.1 * want)


def test_a_non_finite_gradient_is_reported_and_halves_the_scale() -> None:
    scale = LossScale.restore([{}], stacked=False, device=torch.device("cpu"))
    grads, finite = scale.unscale([torch.tensor([1.0, float("inf")]), None, torch.ones(2, 2)])
    assert not bool(finite)
    scale.update(finite)
    assert float(scale.scale) == INIT_SCALE * BACKOFF and int(scale.good) == 0
    _, finite = scale.unscale([torch.tensor([float("nan")])])
    scale.update(finite)
    assert float(scale.scale) == INIT_SCALE * BACKOFF ** 2


def test_the_scale_grows_after_interval_finite_steps() -> None:
    scale = LossScale.restore([{"scale": torch.tensor(8.0), "good_steps": torch.tensor(INTERVAL - 2)}],
                              stacked=False, device=torch.device("cpu"))
    ok = torch.tensor(True)
    scale.update(ok)
    assert float(scale.scale) == 8.0 and int(scale.good) == INTERVAL - 1
    scale.update(ok)
    assert float(scale.scale) == 8.0 * GROWTH and int(scale.good) == 0


def test_a_stack_scales_and_skips_per_row() -> None:
    """One scale per client row: row 1's overflow halves only its scale; the others count on; a
    slice and an index group update only their rows; saved rows restore as they were."""
    saved = [{}, {"scale": torch.tensor(4.0), "good_steps": torch.tensor(7)}, {}]
    scale = LossScale.restore(saved, stacked=True, device=torch.device("cpu"))
    assert scale.scale.tolist() == [INIT_SCALE, 4.0, INIT_SCALE]
    losses = torch.tensor([1.0, 2.0, 3.0])
    assert float(scale.scaled(losses)) == INIT_SCALE * 1 + 4.0 * 2 + INIT_SCALE * 3
    grads = torch.ones(3, 2, 2)
    grads[1, 0, 1] = float("inf")
    unscaled, finite = scale.unscale([grads])
    assert finite.tolist() == [True, False, True]
    assert unscaled[0] is not None and torch.equal(unscaled[0][0], torch.full((2, 2), 1 / INIT_SCALE))
    scale.update(finite)
    assert scale.scale.tolist() == [INIT_SCALE, 2.0, INIT_SCALE] and scale.good.tolist() == [1, 0, 1]
    scale.update(torch.tensor([False]), slice(2, 3))
    scale.update(torch.tensor([True]), torch.tensor([1]))
    assert scale.scale.tolist() == [INIT_SCALE, 2.0, INIT_SCALE * BACKOFF] and scale.good.tolist() == [1, 1, 0]
    again = LossScale.restore([scale.save("", c) for c in range(3)], stacked=True, device=torch.device("cpu"))
    assert torch.equal(again.scale, scale.scale) and torch.equal(again.good, scale.good)
