"""The update rule, written once for every trainer: SGD (momentum, weight decay), Adam and AdamW on
a list of weights, with the per-weight state kept in named slots. A pure function of tensors (no
config, no I/O), beside the losses so that every layer above uses it: the client trainer (local and
Ditto's personal model) and the MMD-D deep kernels' training (:mod:`fedlatent.losses.mmd_d`).

The trainer applies it to one model's parameters or to stacked parameters with a leading client
axis, where a client's own extra weight decay (FedDyn's α_k) and
its own Adam step count are per-row values. The arithmetic is torch.optim's (``SGD`` with dampening 0
and no Nesterov; ``Adam``/``AdamW`` with β = (0.9, 0.999), ε = 1e-8, the defaults), in the same order,
so that a one-client update equals torch's to the bit. A state kept across rounds
(``train.optimizer_state = "kept"``) is stored in the client's state under a prefix, one entry per
weight and slot (``<prefix><weight>.<slot>``) and the Adam step count (``<prefix>step``), the same
for every trainer, so a run may resume on another backend.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults
EPS = 1e-8
SLOTS = {"sgd": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq"), "adamw": ("exp_avg", "exp_avg_sq")}
STEP = "step"  # the Adam step count's entry under the prefix


@dataclass(frozen=True)
class Rule:
    """An optimiser's settings: ``kind`` sgd | adam | adamw, the learning rate, SGD's momentum and
    the weight decay (L2 for SGD and Adam, decoupled for AdamW)."""

    kind: str
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0

    def slots(self) -> tuple[str, ...]:
        """The per-weight state this rule keeps (none for plain SGD)."""
        if self.kind == "sgd" and not self.momentum:
            return ()
        return SLOTS[self.kind]


class LocalOptimizer:
    """One rule's state for a list of weights (one client's, or stacked clients' with a leading
    axis): each slot zero at the start (the first step then computes what torch's optimisers do on
    theirs), or loaded from a kept state; the Adam step count, a number or, per client, a tensor.
    With ``lazy``, fresh SGD momentum buffers are made only when some client steps again after its
    first step (stacked clients that take one step a round never need theirs)."""

    def __init__(self, rule: Rule, params: list[Tensor], slots: dict[str, list[Tensor]] | None = None,
                 steps: Tensor | int = 0, lazy: bool = False) -> None:
        self.rule = rule
        self.lazy = lazy and rule.kind == "sgd" and slots is None
        self.template = params  # the shapes a lazy buffer takes
        if slots is None:
            slots = {} if self.lazy else {s: [torch.zeros_like(p) for p in params] for s in rule.slots()}
        self.slots = slots
        self.steps = steps

    def step(self, params: list[Tensor], grads: list[Tensor | None], extra_decay: Tensor | float = 0.0,
             rows: Tensor | slice | None = None, first: bool = False, again: bool = True) -> None:
        """One update of ``params`` in place from ``grads``. ``extra_decay``: weight decay added to
        the rule's (a per-client (C,) tensor for stacked weights); ``rows``: the rows of the
        stacked state that ``params`` are (None: all; a slice: views, updated in place; an index
        tensor: copies, written back). A weight without a gradient (None: unused by the loss) is
        left as it is, its state too, as torch's optimisers leave it. ``first``: the clients' first
        step of the round, ``again``: some of them step again (a lazy optimiser's hints; its first
        step may keep ``grads`` as its momentum buffers: the caller does not use them afterwards)."""
        r = self.rule
        if self.lazy and r.momentum:
            if first:  # b = d, torch's first momentum step, the buffers kept only if needed
                self._first_sgd(params, grads, extra_decay, rows, again)
                return
            if not self.slots:  # zero buffers: the general step then is torch's first step too
                self.slots = {"momentum_buffer": [torch.zeros_like(p) for p in self.template]}
        slots = {k: [_rows(t, rows) for t in v] for k, v in self.slots.items()}
        used = [i for i, g in enumerate(grads) if g is not None]
        if len(used) < len(grads):
            params = [params[i] for i in used]
            slots = {k: [v[i] for i in used] for k, v in slots.items()}
        given = [g for g in grads if g is not None]
        with torch.no_grad():
            decay = _decay(r.weight_decay, extra_decay, params)
            if r.kind == "sgd":
                self._sgd(params, given, decay, slots)
            else:
                self._adam(params, given, decay, slots, rows)
        if isinstance(rows, Tensor):
            for k, v in slots.items():
                for whole, part in zip(self.slots[k], v):
                    whole.index_copy_(0, rows, part)

    def _first_sgd(self, params: list[Tensor], grads: list[Tensor | None], extra_decay: Tensor | float,
                   rows: Tensor | slice | None, again: bool) -> None:
        """A lazy SGD-momentum step on fresh buffers (all zero): p −= lr·d, d then the buffers' rows
        (for all rows: the tensors d themselves, which the trainer's gradients are, its own)."""
        if any(g is None for g in grads):
            raise ValueError("a lazy optimiser's weights all have gradients (stacked clients)")
        given = [g for g in grads if g is not None]
        with torch.no_grad():
            d = _plus_decay(given, params, _decay(self.rule.weight_decay, extra_decay, params))
            torch._foreach_add_(params, d, alpha=-self.rule.lr)
            if not again:
                return
            if not self.slots and rows is None and _separate(d):
                self.slots = {"momentum_buffer": d}  # the step's own gradients: they become the buffers
                return
            if not self.slots:
                self.slots = {"momentum_buffer": [torch.zeros_like(p) for p in self.template]}
            for whole, part in zip(self.slots["momentum_buffer"], d):
                if isinstance(rows, Tensor):
                    whole.index_copy_(0, rows, part)
                else:
                    _rows(whole, rows).copy_(part)

    def _sgd(self, params: list[Tensor], grads: list[Tensor], decay: list | float, slots: dict[str, list[Tensor]]) -> None:
        r = self.rule
        d = _plus_decay(grads, params, decay)
        if r.momentum:
            bufs = slots["momentum_buffer"]
            torch._foreach_mul_(bufs, r.momentum)
            torch._foreach_add_(bufs, d)
            d = bufs
        torch._foreach_add_(params, d, alpha=-r.lr)

    def _adam(self, params: list[Tensor], grads: list[Tensor], decay: list | float,
              slots: dict[str, list[Tensor]], rows: Tensor | slice | None) -> None:
        r = self.rule
        beta1, beta2 = BETAS
        if r.kind == "adamw":
            if isinstance(decay, list):
                for p, dec in zip(params, decay):
                    p.mul_(1 - r.lr * dec)
            elif decay:
                torch._foreach_mul_(params, 1 - r.lr * decay)
            g = list(grads)
        else:
            g = _plus_decay(grads, params, decay)
        exp_avg, exp_avg_sq = slots["exp_avg"], slots["exp_avg_sq"]
        torch._foreach_lerp_(exp_avg, g, 1 - beta1)
        torch._foreach_mul_(exp_avg_sq, beta2)
        torch._foreach_addcmul_(exp_avg_sq, g, g, value=1 - beta2)
        if isinstance(self.steps, int):  # one count for all: torch's scalar arithmetic, to the bit
            self.steps += 1
            bc1, bc2 = 1 - beta1 ** self.steps, 1 - beta2 ** self.steps
            denom = torch._foreach_sqrt(exp_avg_sq)
            torch._foreach_div_(denom, bc2 ** 0.5)
            torch._foreach_add_(denom, EPS)
            torch._foreach_addcdiv_(params, exp_avg, denom, value=-(r.lr / bc1))
            return
        steps = self.steps
        counts = _rows(steps, rows) + 1  # a count per client (kept states of different ages)
        if isinstance(rows, Tensor):
            steps.index_copy_(0, rows, counts)
        elif rows is None:
            self.steps = counts
        else:
            steps[rows] = counts
        bias1: Tensor = 1 - beta1 ** counts
        bias2: Tensor = 1 - beta2 ** counts
        for p, m, v in zip(params, exp_avg, exp_avg_sq):
            size, root = _per_row(r.lr / bias1, p), _per_row(bias2.sqrt(), p)
            p.sub_(size.to(p.dtype) * m / ((v.sqrt() / root.to(p.dtype)).add_(EPS)))

    # the state kept across rounds -----------------------------------------------------------------
    def save(self, names: list[str], prefix: str, client: int | None = None) -> dict[str, Tensor]:
        """The state as client-state entries (``client``: that row of stacked weights)."""
        out = {}
        for slot, values in self.slots.items():
            for n, v in zip(names, values):
                out[f"{prefix}{n}.{slot}"] = (v if client is None else v[client]).detach().to("cpu", copy=True)
        if self.rule.kind != "sgd":
            steps = self.steps if client is None or isinstance(self.steps, int) else self.steps[client]
            out[prefix + STEP] = torch.as_tensor(steps, dtype=torch.float64).clone()
        return out


def clear(state: dict[str, Tensor], prefix: str) -> None:
    """Remove a kept optimiser state from a client's state (before saving a new one)."""
    for key in [k for k in state if k.startswith(prefix)]:
        del state[key]


def restore(rule: Rule, params: list[Tensor], names: list[str], saved: list[dict[str, Tensor]],
            stacked: bool) -> LocalOptimizer:
    """The optimiser of ``params`` (one client's, or stacked: ``saved`` per client) starting from the
    clients' kept states ``saved`` (their entries under the prefix, prefix removed); a client with
    none starts from zero slots and step 0. A kept state of another rule's slots (the optimiser
    changed) is an error."""
    if not any(saved):
        return LocalOptimizer(rule, params, steps=torch.zeros(len(saved), dtype=torch.float64) if stacked else 0,
                              lazy=stacked)
    for own in saved:
        extra = {k.rsplit(".", 1)[1] for k in own if k != STEP} - set(rule.slots())
        if extra:
            raise ValueError(f"kept optimiser state holds {sorted(extra)}, not the state of '{rule.kind}'")
    slots = {}
    for slot in rule.slots():
        per_param = []
        for n, p in zip(names, params):
            rows = [own[f"{n}.{slot}"].to(p.device, p.dtype) if own else torch.zeros_like(p[0] if stacked else p)
                    for own in saved]
            per_param.append(torch.stack(rows) if stacked else rows[0].clone())
        slots[slot] = per_param
    counts = [int(own[STEP]) if STEP in own else 0 for own in saved]
    steps: Tensor | int = torch.tensor(counts, dtype=torch.float64) if stacked else counts[0]
    return LocalOptimizer(rule, params, slots, steps)


def _rows(t: Tensor, rows: Tensor | slice | None) -> Tensor:
    if rows is None:
        return t
    return t[rows] if isinstance(rows, slice) else t.index_select(0, rows)


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
        return [_per_row(extra + base, p).to(p.dtype) for p in params]
    return base + extra


def _plus_decay(grads: list[Tensor], params: list[Tensor], decay: list[Tensor] | float) -> list[Tensor]:
    """g + wd·p (torch's L2 weight decay), the gradients themselves when there is none."""
    if isinstance(decay, list):
        return [g + p * wd for g, p, wd in zip(grads, params, decay)]
    return list(torch._foreach_add(grads, params, alpha=decay)) if decay else list(grads)
