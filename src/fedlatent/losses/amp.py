"""Mixed precision's two pure pieces, beside the update rule they serve: terms computed in float32
whatever autocast is active around them (:func:`in_float32`), and fp16's dynamic loss scale
(:class:`LossScale`, the arithmetic of ``torch.amp.GradScaler`` for a trainer that calls
``torch.autograd.grad`` instead of ``backward`` and may hold a stack of clients).

Why float32 for some terms: sums of exponentials (uniformity, Gaussian kernels), correlation and
covariance matrices, variances and ``median``/``sqrt`` of small differences lose most of their
digits in bfloat16's 8-bit mantissa (a relative step of 2⁻⁸ ≈ 0.4 %) and overflow or underflow in
float16's range (``exp(-d)`` below 6e-8 is 0, a squared distance above 65504 is inf). They are a
small share of a step's work; the model's forward is where mixed precision saves time.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import torch
from torch import Tensor

HALF = (torch.float16, torch.bfloat16)
# torch.amp.GradScaler's defaults
INIT_SCALE = 2.0 ** 16
GROWTH = 2.0
BACKOFF = 0.5
INTERVAL = 2000
SCALE, GOOD = "scale", "good_steps"  # a kept scale's entries under its prefix in the client's state

P = ParamSpec("P")
R = TypeVar("R")


def _tensors(values: Any) -> list[Tensor]:
    """The tensors among ``values`` (an argument, a list, tuple or dict of them), one level deep."""
    if isinstance(values, Tensor):
        return [values]
    if isinstance(values, dict):
        values = list(values.values())
    if isinstance(values, (list, tuple)):
        return [v for v in values if isinstance(v, Tensor)]
    return []


def _up(value: Any) -> Any:
    """``value`` with its float16/bfloat16 tensors (one level deep) cast to float32."""
    if isinstance(value, Tensor):
        return value.float() if value.dtype in HALF else value
    if isinstance(value, dict):
        return {k: _up(v) if isinstance(v, Tensor) else v for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_up(v) if isinstance(v, Tensor) else v for v in value)
    return value


def in_float32(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` computed in float32 (at least): its float16/bfloat16 tensor arguments cast to float32
    and its body run with autocast off on their devices, so that its matrix products stay float32.
    Float32 and float64 arguments outside autocast call ``fn`` as it is (the same numbers, to the
    bit); float64 stays float64 (the references the tests compare with)."""
    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        tensors = [t for a in (*args, *kwargs.values()) for t in _tensors(a)]
        kinds = {t.device.type for t in tensors}
        active = [k for k in kinds if torch.amp.is_autocast_available(k) and torch.is_autocast_enabled(k)]
        if not active and not any(t.dtype in HALF for t in tensors):
            return fn(*args, **kwargs)
        with ExitStack() as off:
            for kind in active:
                off.enter_context(torch.autocast(kind, enabled=False))
            return fn(*_up(args), **_up(kwargs))
    return run


def _rows(t: Tensor, rows: Tensor | slice | None) -> Tensor:
    if rows is None:
        return t
    return t[rows] if isinstance(rows, slice) else t.index_select(0, rows)


def _per_row(v: Tensor, g: Tensor) -> Tensor:
    """A 0-d or (C,) value shaped to broadcast over a gradient ``g`` (C, …) (0-d: as it is)."""
    return v if v.dim() == 0 else v.view(-1, *[1] * (g.dim() - 1))


@dataclass
class LossScale:
    """fp16's dynamic loss scale of one client (0-d tensors) or of a stack's clients ((C,), one per
    row): the loss is multiplied by ``scale`` before the backward, the gradients divided by it after;
    a step whose unscaled gradients are not all finite is skipped and the scale halved, and after
    :data:`INTERVAL` finite steps in a row it doubles (Micikevicius et al. 2018, "Mixed Precision
    Training", Sec. 3.2; ``torch.amp.GradScaler``'s defaults: 2¹⁶, ×0.5, ×2, 2000)."""

    scale: Tensor  # float32
    good: Tensor   # int64: finite steps since the last change

    @classmethod
    def restore(cls, saved: list[dict[str, Tensor]], stacked: bool, device: torch.device) -> LossScale:
        """The scales of the clients whose kept entries (prefix removed) are ``saved`` (one per
        client; a client with none starts at :data:`INIT_SCALE`); ``stacked``: (C,) rows."""
        scale = [float(own[SCALE]) if SCALE in own else INIT_SCALE for own in saved]
        good = [int(own[GOOD]) if GOOD in own else 0 for own in saved]
        if not stacked:
            scale, good = scale[:1], good[:1]
        shape = (len(scale),) if stacked else ()
        return cls(torch.tensor(scale, dtype=torch.float32, device=device).reshape(shape),
                   torch.tensor(good, dtype=torch.int64, device=device).reshape(shape))

    def save(self, prefix: str, client: int | None = None) -> dict[str, Tensor]:
        """The state as client-state entries (``client``: that row of a stack's)."""
        pick = (lambda t: t) if client is None else (lambda t: t[client])
        return {prefix + SCALE: pick(self.scale).detach().to("cpu", copy=True),
                prefix + GOOD: pick(self.good).detach().to("cpu", copy=True)}

    def scaled(self, loss: Tensor, rows: Tensor | slice | None = None) -> Tensor:
        """Σ of ``loss`` (0-d, or (C,) per client of ``rows``) times each client's scale."""
        return (loss * _rows(self.scale, rows)).sum()

    def unscale(self, grads: list[Tensor | None], rows: Tensor | slice | None = None) -> tuple[list[Tensor | None], Tensor]:
        """The gradients divided by their rows' scales (times the float32 reciprocal, as
        GradScaler unscales) and which rows are finite: a 0-d or (C,) bool tensor."""
        inverse = _rows(self.scale, rows).double().reciprocal().float()
        out = [None if g is None else g * _per_row(inverse, g) for g in grads]
        finite = torch.ones_like(inverse, dtype=torch.bool)
        for g in out:
            if g is not None:
                finite = finite & (torch.isfinite(g) if g.dim() == finite.dim() else
                                   torch.isfinite(g).flatten(finite.dim()).all(-1))
        return out, finite

    def update(self, finite: Tensor, rows: Tensor | slice | None = None) -> None:
        """After a step of ``rows``: halve the scale of the rows not ``finite`` (their count back to
        0), count the others' step and double the scale of those reaching :data:`INTERVAL`."""
        scale, good = _rows(self.scale, rows), _rows(self.good, rows)
        good = torch.where(finite, good + 1, 0)
        grow = good >= INTERVAL
        scale = torch.where(finite, torch.where(grow, scale * GROWTH, scale), scale * BACKOFF)
        good = torch.where(grow, 0, good)
        if rows is None:
            self.scale, self.good = scale, good
        elif isinstance(rows, slice):
            self.scale[rows], self.good[rows] = scale, good
        else:
            self.scale.index_copy_(0, rows, scale)
            self.good.index_copy_(0, rows, good)
