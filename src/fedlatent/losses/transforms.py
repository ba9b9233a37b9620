"""The update rule as a chain of gradient transformations, in the manner of optax: each link has
``init(params) -> state`` and ``update(step, state, params, rows, again) -> (step, state)`` over
lists of tensors — one client's weights, or stacked clients' with a leading client axis, where a
per-client value (FedDyn's α_k, Adam's step count, the rows of Ditto's anchor and SCAFFOLD's
correction) has one entry per row — and :func:`chain` composes them. Links hold settings; their
state is passed in and out (:mod:`fedlatent.losses.update` keeps it in the client's state).

The arithmetic of each link is torch.optim's, in torch's order of operations, so that a chain
reproduces torch's optimisers to the bit: floating point is not associative (g + (λ₁ + λ₂)·p is
not g + λ₁·p + λ₂·p, an ``addcdiv`` not a division followed by an add). That is why the last
links' products stay unevaluated in the :class:`Step` until :func:`apply`, where torch's fused
in-place operations evaluate them as torch.optim does, and why FedDyn's α_k joins the weight
decay's coefficient instead of being a link of its own.

``rows``: the stack rows a step trains (None: all; a slice; an index tensor): the links pick
their per-row settings with it, the caller picks the state's rows (:func:`pick_rows`).
``again``: some of these rows step again after this step (a lazily made momentum buffer is kept
only then). The links run under the caller's ``torch.no_grad()`` (one for the whole step:
:meth:`fedlatent.losses.update.LocalOptimizer.step`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

import torch
from torch import Tensor

BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults
EPS = 1e-8
STEP = "step"  # Adam's step count in its state
Rows = Tensor | slice | None


@dataclass
class Step:
    """The update on its way down the chain, applied by :func:`apply` in this order:
    ``p ← p·shrink`` (AdamW's decoupled decay), then ``p ← p + factor·direction`` — or
    ``p ← p + factor·direction/denom`` (Adam: torch's ``addcdiv``), or per row
    ``p ← p − factor·direction/denom`` (Adam with a step count per row) — on ``targets``, then
    ``p ← p + correction_factor·correction`` on ``correction_targets`` (SCAFFOLD).

    ``direction`` may hold None (a weight without a gradient) until :class:`Present` drops it.
    ``bias``: Adam's 1 − β₁ᵗ (a number, or per row); ``decoupled``: AdamW's coefficient (a number,
    or per weight a per-row tensor). The factors are set by :class:`ScaleByLr`."""

    direction: list[Tensor | None]
    targets: list[Tensor]
    denom: list[Tensor] | None = None
    bias: float | Tensor | None = None
    decoupled: float | list[Tensor] = 0.0
    correction: list[Tensor] | None = None
    correction_targets: list[Tensor] = field(default_factory=list)
    shrink: float | list[Tensor] | None = None
    factor: float | list[Tensor] = 0.0
    correction_factor: float = 0.0

    def given(self) -> list[Tensor]:
        """The direction where every weight has one (past :class:`Present`, or a stack's)."""
        return cast(list[Tensor], self.direction)


class Link(Protocol):
    """A gradient transformation (optax's ``GradientTransformation``)."""

    def init(self, params: list[Tensor]) -> Any: ...

    def update(self, step: Step, state: Any, params: list[Tensor], rows: Rows, again: bool) -> tuple[Step, Any]: ...


class Chain:
    """Links applied one after another, each with its own state (optax's ``chain``)."""

    def __init__(self, *links: Link) -> None:
        self.links = links

    def init(self, params: list[Tensor]) -> tuple:
        return tuple(link.init(params) for link in self.links)

    def update(self, step: Step, state: tuple, params: list[Tensor], rows: Rows, again: bool) -> tuple[Step, tuple]:
        new = []
        for link, own in zip(self.links, state):
            step, own = link.update(step, own, params, rows, again)
            new.append(own)
        return step, tuple(new)


def chain(*links: Link) -> Chain:
    return Chain(*links)


class _Stateless:
    def init(self, params: list[Tensor]) -> None:
        return None


class DittoPull(_Stateless):
    """Ditto's personal objective's (λ/2)‖v − w̄‖² (Li et al. 2021, Eq. 2; Algorithm 1, line 7):
    its gradient λ(v − w̄) added to the loss gradient. ``anchor``: w̄ per weight (stacked: one row
    per client); ``fused``: the stack's form, one ``foreach`` add with α = λ; else one client's,
    g + λ·(v − w̄) weight by weight, a weight without a gradient left so. λ per row (a (C,) tensor:
    stacked runs of different λ): g + λ_row·(v − w̄)."""

    def __init__(self, lam: Tensor | float, anchor: list[Tensor], fused: bool) -> None:
        self.lam, self.anchor, self.fused = lam, anchor, fused

    def update(self, step: Step, state: None, params: list[Tensor], rows: Rows, again: bool) -> tuple[Step, None]:
        if isinstance(self.lam, Tensor):
            lam = row_pick(self.lam, rows)
            away = torch._foreach_sub(params, [row_pick(a, rows) for a in self.anchor])
            step.direction = [g + _per_row(lam, p).to(p.device, p.dtype) * d for g, p, d in zip(step.given(), params, away)]
        elif self.fused:
            away = torch._foreach_sub(params, [row_pick(a, rows) for a in self.anchor])
            step.direction = list(torch._foreach_add(step.given(), away, alpha=self.lam))
        else:
            step.direction = [g if g is None else g + self.lam * (p - a)
                              for g, p, a in zip(step.direction, params, self.anchor)]
        return step, None


class Present:
    """``inner`` on the weights that have a gradient: a weight without one (unused by the loss) is
    left as it is, its state too, as torch's optimisers leave it."""

    def __init__(self, inner: Link) -> None:
        self.inner = inner

    def init(self, params: list[Tensor]) -> Any:
        return self.inner.init(params)

    def update(self, step: Step, state: Any, params: list[Tensor], rows: Rows, again: bool) -> tuple[Step, Any]:
        if all(g is not None for g in step.direction):
            return self.inner.update(step, state, params, rows, again)
        used = [i for i, g in enumerate(step.direction) if g is not None]
        if _holds_none(state):
            raise ValueError("a lazy optimiser's weights all have gradients (stacked clients)")
        inner = replace(step, direction=[step.direction[i] for i in used], targets=[step.targets[i] for i in used])
        inner, new = self.inner.update(inner, _select(state, used), [params[i] for i in used], rows, again)
        return inner, _merge(state, new, used)


class Masked:
    """The frozen-layer mask: ``inner`` on the weights ``mask`` marks trainable, and only its
    state for them; a frozen weight gets no update (optax's ``masked`` with a zero update)."""

    def __init__(self, inner: Link, mask: list[bool]) -> None:
        self.inner, self.kept = inner, [i for i, m in enumerate(mask) if m]

    def init(self, params: list[Tensor]) -> Any:
        return self.inner.init([params[i] for i in self.kept])

    def update(self, step: Step, state: Any, params: list[Tensor], rows: Rows, again: bool) -> tuple[Step, Any]:
        kept = replace(step, direction=[step.direction[i] for i in self.kept],
                       targets=[step.targets[i] for i in self.kept])
        return self.inner.update(kept, state, [params[i] for i in self.kept], rows, again)


class AddDecayedWeights(_Stateless):
    """L2 weight decay coupled to the gradient, torch.optim's ``weight_decay`` of SGD and Adam:
    g + λ·p. λ = ``weight_decay`` + ``extra``: FedDyn's α_k (Acar et al. 2021, the (α/2)‖θ‖² of
    Eq. 1's local objective, as the authors' release adds it to the weight decay), a number, or
    per row a (C,) tensor; their sum is taken first, as one coefficient."""

    def __init__(self, weight_decay: float, extra: Tensor | float = 0.0) -> None:
        self.weight_decay, self.extra = weight_decay, extra

    def update(self, step: Step, state: None, params: list[Tensor], rows: Rows, again: bool) -> tuple[Step, None]:
        decay = _decay(self.weight_decay, row_pick(self.extra, rows), params)
        step.direction = _plus_decay(step.direction, params, decay)
        return step, None


class DecoupledWeightDecay(_Stateless):
    """AdamW's decoupled weight decay (Loshchilov & Hutter 2019, Algorithm 2, line 12; torch's
    ``AdamW``): p ← p·(1 − lr·λ) before Adam's step, λ as in :class:`AddDecayedWeights`."""

    def __init__(self, weight_decay: float, extra: Tensor | float = 0.0) -> None:
        self.weight_decay, self.extra = weight_decay, extra

    def update(self, step: Step, state: None, params: list[Tensor], rows: Rows, again: bool) -> tuple[Step, None]:
        step.decoupled = _decay(self.weight_decay, row_pick(self.extra, rows), params)
        return step, None


class Momentum:
    """SGD's momentum as torch.optim.SGD takes it (dampening 0, no Nesterov): b ← μ·b + d, the
    first step b = d. State ``{"momentum_buffer": [b, …]}``; ``lazy``: no buffers until a step
    needs them (None: all zero), and then kept only where ``again`` (stacked clients that take one
    step a round never need theirs)."""

    slots = ("momentum_buffer",)

    def __init__(self, momentum: float, lazy: bool = False) -> None:
        self.momentum, self.lazy = momentum, lazy

    def init(self, params: list[Tensor]) -> dict[str, list[Tensor] | None]:
        return {"momentum_buffer": None if self.lazy else [torch.zeros_like(p) for p in params]}

    def update(self, step: Step, state: dict, params: list[Tensor], rows: Rows, again: bool) -> tuple[Step, dict]:
        bufs = state["momentum_buffer"]
        d = step.given()
        if bufs is None:  # b = d, torch's first momentum step, the buffers kept only if needed
            if again and rows is None and not _separate(d):
                d = [t.clone(memory_format=torch.contiguous_format) for t in d]
            return step, {"momentum_buffer": d if again else None}
        torch._foreach_mul_(bufs, self.momentum)
        torch._foreach_add_(bufs, d)
        step.direction = list(bufs)
        return step, state


class ScaleByAdam:
    """Adam's scaling (Kingma & Ba 2015, Algorithm 1; torch.optim.Adam's arithmetic and order):
    m ← m + (1 − β₁)(g − m) (a ``lerp``), v ← β₂v + (1 − β₂)g², the step m̂/(√v̂ + ε) with the
    bias corrections 1 − βᵗ. State ``{"exp_avg", "exp_avg_sq", "step"}``; the count a number (one
    count for all: torch's scalar arithmetic), or per row a (C,) float64 tensor (kept states of
    different ages)."""

    slots = ("exp_avg", "exp_avg_sq")

    def init(self, params: list[Tensor]) -> dict[str, Any]:
        return {"exp_avg": [torch.zeros_like(p) for p in params],
                "exp_avg_sq": [torch.zeros_like(p) for p in params], STEP: 0}

    def update(self, step: Step, state: dict, params: list[Tensor], rows: Rows, again: bool) -> tuple[Step, dict]:
        beta1, beta2 = BETAS
        g = step.given()
        exp_avg, exp_avg_sq, count = state["exp_avg"], state["exp_avg_sq"], state[STEP]
        torch._foreach_lerp_(exp_avg, g, 1 - beta1)
        torch._foreach_mul_(exp_avg_sq, beta2)
        torch._foreach_addcmul_(exp_avg_sq, g, g, value=1 - beta2)
        count = count + 1
        step.direction = list(exp_avg)
        if isinstance(count, int):
            bc2 = 1 - beta2 ** count
            denom = torch._foreach_sqrt(exp_avg_sq)
            torch._foreach_div_(denom, bc2 ** 0.5)
            torch._foreach_add_(denom, EPS)
            step.denom, step.bias = list(denom), 1 - beta1 ** count
        else:
            root = (1 - beta2 ** count).sqrt()
            step.denom = [(v.sqrt() / _per_row(root, p).to(p.device, p.dtype)).add_(EPS) for p, v in zip(params, exp_avg_sq)]
            step.bias = 1 - beta1 ** count
        return step, {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, STEP: count}


class ScaffoldCorrection(_Stateless):
    """SCAFFOLD's drift correction (Karimireddy et al. 2020, Algorithm 1, line 10:
    y ← y − η(g − c_i + c)), the fedlatent form: w ← w − lr·(c − c_i) after each optimiser step,
    outside the optimiser's state, on every trainable weight. ``correction``: c − c_i per weight
    (stacked: one row per client)."""

    def __init__(self, correction: list[Tensor]) -> None:
        self.correction = correction

    def update(self, step: Step, state: None, params: list[Tensor], rows: Rows, again: bool) -> tuple[Step, None]:
        step.correction = [row_pick(c, rows) for c in self.correction]
        step.correction_targets = params
        return step, None


class ScaleByLr(_Stateless):
    """The learning rate (the round's, from the schedule): the factors :func:`apply` multiplies
    by, as torch.optim forms them — −lr for SGD, −lr/(1 − β₁ᵗ) for Adam (per row: lr/(1 − β₁ᵗ),
    subtracted), 1 − lr·λ for AdamW's decay, −lr for SCAFFOLD's correction."""

    def __init__(self, lr: float) -> None:
        self.lr = lr

    def update(self, step: Step, state: None, params: list[Tensor], rows: Rows, again: bool) -> tuple[Step, None]:
        lr = self.lr
        if isinstance(step.decoupled, list):
            step.shrink = [1 - lr * dec for dec in step.decoupled]
        elif step.decoupled:
            step.shrink = 1 - lr * step.decoupled
        if step.bias is None:
            step.factor = -lr
        elif isinstance(step.bias, Tensor):
            size = lr / step.bias
            step.factor = [_per_row(size, p).to(p.device, p.dtype) for p in step.targets]
        else:
            step.factor = -(lr / step.bias)
        step.correction_factor = -lr
        return step, None


def apply(step: Step) -> None:
    """Apply a chain's :class:`Step` to its targets in place, with torch.optim's operations (under
    ``torch.no_grad()`` where the targets are leaves that require gradients)."""
    params = step.targets
    if isinstance(step.shrink, list):
        for p, f in zip(params, step.shrink):
            p.mul_(f)
    elif step.shrink is not None:
        torch._foreach_mul_(params, step.shrink)
    direction = step.given()
    if step.denom is None:
        torch._foreach_add_(params, direction, alpha=step.factor)  # type: ignore[arg-type]
    elif isinstance(step.factor, list):
        for p, size, m, den in zip(params, step.factor, direction, step.denom):
            p.sub_(size * m / den)
    else:
        torch._foreach_addcdiv_(params, direction, step.denom, value=step.factor)
    if step.correction is not None:
        torch._foreach_add_(step.correction_targets, step.correction, alpha=step.correction_factor)


# the state's rows -----------------------------------------------------------------------------------
def row_pick(t: Any, rows: Rows) -> Any:
    """The ``rows`` of a stacked tensor (a slice: a view, so in-place updates reach the stack; an
    index tensor, on the tensor's device: a copy); anything else as it is."""
    if rows is None or not isinstance(t, Tensor):
        return t
    return t[rows] if isinstance(rows, slice) else t.index_select(0, rows)


def pick_rows(state: Any, rows: Rows) -> Any:
    """A chain state's ``rows``: every tensor picked (:func:`row_pick`), numbers and None as they are."""
    if rows is None:
        return state
    if isinstance(state, tuple):
        return tuple(pick_rows(s, rows) for s in state)
    if isinstance(state, dict):
        return {k: pick_rows(v, rows) for k, v in state.items()}
    if isinstance(state, list):
        return [row_pick(t, rows) for t in state]
    return row_pick(state, rows)


def put_rows(whole: Any, part: Any, picked: Any, rows: Rows, count: int) -> Any:
    """``whole`` with the rows ``rows`` of a step's new state ``part`` written into it (``picked``:
    what :func:`pick_rows` gave the step; views of a slice updated in place need no copy back; a
    state the step made where there was none is zero in the other rows of ``count``). Dicts are
    updated in place."""
    if rows is None:
        return part
    if isinstance(whole, tuple):
        return tuple(put_rows(w, p, k, rows, count) for w, p, k in zip(whole, part, picked))
    if isinstance(whole, dict):
        for key in whole:
            whole[key] = put_rows(whole[key], part[key], picked[key], rows, count)
        return whole
    if part is None or isinstance(part, (int, float)):
        return part if whole is None or part is not None else whole
    if isinstance(part, list):
        if whole is None:
            whole = [t.new_zeros((count, *t.shape[1:])) for t in part]
            picked = [None] * len(part)
        for w, p, k in zip(whole, part, picked):
            _write_rows(w, p, k, rows)
        return whole
    _write_rows(whole, part, picked, rows)
    return whole


def _write_rows(whole: Tensor, part: Tensor, picked: Tensor | None, rows: Rows) -> None:
    if isinstance(rows, Tensor):
        whole.index_copy_(0, rows, part)
    elif part is not picked:  # a slice's view updated in place is already there
        whole[rows] = part


def _holds_none(state: Any) -> bool:
    if isinstance(state, tuple):
        return any(_holds_none(s) for s in state)
    if isinstance(state, dict):
        return any(v is None for v in state.values())
    return False


def _select(state: Any, used: list[int]) -> Any:
    """A state's per-weight lists cut to the weights ``used``."""
    if isinstance(state, tuple):
        return tuple(_select(s, used) for s in state)
    if isinstance(state, dict):
        return {k: [v[i] for i in used] if isinstance(v, list) else v for k, v in state.items()}
    return state


def _merge(whole: Any, part: Any, used: list[int]) -> Any:
    """:func:`_select`'s inverse: the weights ``used`` of ``whole`` from ``part`` (dicts in place)."""
    if isinstance(whole, tuple):
        return tuple(_merge(w, p, used) for w, p in zip(whole, part))
    if isinstance(whole, dict):
        for k, v in part.items():
            if isinstance(v, list):
                for i, t in zip(used, v):
                    whole[k][i] = t
            else:
                whole[k] = v
        return whole
    return part


def _separate(tensors: list[Tensor]) -> bool:
    """Whether each tensor is dense and has memory of its own, so that it may be updated in place
    as a buffer: autograd may hand one tensor to two weights (the gradient of ``a + b``) or an
    expanded view (the gradient of a sum)."""
    return all(t.is_contiguous() for t in tensors) and len({t.data_ptr() for t in tensors}) == len(tensors)


def _per_row(v: Tensor, p: Tensor) -> Tensor:
    """A (C,) per-client value shaped to broadcast over stacked weights ``p`` (C, …)."""
    return v.view(-1, *[1] * (p.dim() - 1))


def _decay(base: float, extra: Tensor | float, params: list[Tensor]) -> list[Tensor] | float:
    """The weight decay of each weight: a number for all, or per client (a (C,) ``extra``) shaped
    per weight."""
    if isinstance(extra, Tensor):
        return [_per_row(extra + base, p).to(p.device, p.dtype) for p in params]
    return base + extra


def _plus_decay(grads: list, params: list[Tensor], decay: list[Tensor] | float) -> list:
    """g + wd·p (torch's L2 weight decay), the gradients themselves when there is none."""
    if isinstance(decay, list):
        return [g + p * wd for g, p, wd in zip(grads, params, decay)]
    return list(torch._foreach_add(grads, params, alpha=decay)) if decay else list(grads)
