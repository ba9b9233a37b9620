"""The update rule, written once for every trainer: SGD (momentum, weight decay), Adam and AdamW on
a list of weights, as a chain of gradient transformations (:mod:`fedlatent.losses.transforms`)
with the method's links around it — Ditto's pull, FedDyn's α_k, SCAFFOLD's correction, the
frozen-layer mask — and its state kept in named slots. A pure function of tensors (no config, no
I/O), beside the losses so that every layer above uses it: the client trainer (local and Ditto's
personal model) and the MMD-D deep kernels' training (:mod:`fedlatent.losses.mmd_d`).

:meth:`LocalOptimizer.step` is the one "gradients → chain → apply" point. The trainer applies it
to one model's parameters or to stacked parameters with a leading client axis, where a client's own
extra weight decay (FedDyn's α_k) and its own Adam step count are per-row values. The arithmetic is
torch.optim's (``SGD`` with dampening 0 and no Nesterov; ``Adam``/``AdamW`` with β = (0.9, 0.999),
ε = 1e-8, the defaults), in the same order, so that a one-client update equals torch's to the bit.
A state kept across rounds (``train.optimizer_state = "kept"``) is stored in the client's state
under a prefix, one entry per weight and slot (``<prefix><weight>.<slot>``) and the Adam step count
(``<prefix>step``), the same for every trainer, so a run may resume on another backend.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from fedlatent.losses import transforms as tx
from fedlatent.losses.transforms import STEP, Rows

SLOTS = {"sgd": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq"), "adamw": ("exp_avg", "exp_avg_sq")}


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


@dataclass(frozen=True)
class Links:
    """The method's links around the rule for a round (each absent by default): FedDyn's α_k as
    extra weight decay (a number, or per row); Ditto's pull λ (a number, or per row) towards ``anchor`` (per weight;
    ``fused``: the stack's arithmetic, see :class:`~fedlatent.losses.transforms.DittoPull`);
    SCAFFOLD's correction c − c_i per weight; the frozen-layer mask over the weights given (the
    rule's state then covers only the trainable ones)."""

    extra_decay: Tensor | float = 0.0
    pull: Tensor | float = 0.0
    anchor: list[Tensor] | None = None
    fused: bool = True
    correction: list[Tensor] | None = None
    mask: list[bool] | None = None


def chain_of(rule: Rule, links: Links | None = None, lazy: bool = False) -> tx.Link:
    """The chain of ``rule`` with ``links``: [Ditto's pull] → the rule on the weights with a
    gradient (L2 decay with FedDyn's α_k → momentum | Adam's scaling → AdamW's decay) →
    [SCAFFOLD's correction] → −lr, inside the frozen-layer mask where a weight is frozen.
    ``lazy``: SGD's momentum buffers made when a step needs them (stacked clients)."""
    links = links or Links()
    extra = links.extra_decay
    core: list[tx.Link] = []
    if rule.kind != "adamw" and (rule.weight_decay or isinstance(extra, Tensor) or extra):
        core.append(tx.AddDecayedWeights(rule.weight_decay, extra))
    if rule.kind == "sgd":
        if rule.momentum:
            core.append(tx.Momentum(rule.momentum, lazy))
    else:
        core.append(tx.ScaleByAdam())
        if rule.kind == "adamw":
            core.append(tx.DecoupledWeightDecay(rule.weight_decay, extra))
    outer: list[tx.Link] = []
    if isinstance(links.pull, Tensor) or links.pull:
        outer.append(tx.DittoPull(links.pull, links.anchor or [], links.fused))
    outer.append(tx.Present(tx.chain(*core)))
    if links.correction is not None:
        outer.append(tx.ScaffoldCorrection(links.correction))
    outer.append(tx.ScaleByLr(rule.lr))
    whole = tx.chain(*outer)
    if links.mask is not None and not all(links.mask):
        return tx.Masked(whole, links.mask)
    return whole


class LocalOptimizer:
    """One rule's chain and its state for a list of weights (one client's, or stacked clients' with
    a leading axis): each slot zero at the start (the first step then computes what torch's
    optimisers do on theirs), or loaded from a kept state (``slots``); the Adam step count, a
    number or, per client, a tensor on the weights' device (a step combines it with them). With ``lazy``, fresh SGD momentum buffers are made only when
    some client steps again after its first step (stacked clients that take one step a round never
    need theirs)."""

    def __init__(self, rule: Rule, params: list[Tensor], slots: dict[str, list[Tensor]] | None = None,
                 steps: Tensor | int = 0, lazy: bool = False, links: Links | None = None) -> None:
        self.rule, self.links = rule, links or Links()
        self.lazy = lazy and slots is None
        self.count = len(params[0]) if params and self.lazy else 0  # stack rows, for lazily made buffers
        self.chain = chain_of(rule, self.links, self.lazy)
        self.state = self.chain.init(params)
        self._own = _slot_state(self.state)  # the rule's state: its slots (and Adam's count), updated in place
        if self._own is not None:
            if slots is not None:
                self._own.update(slots)
            if STEP in self._own:
                self._own[STEP] = steps
        self._extra = self.links.extra_decay

    @property
    def slots(self) -> dict[str, list[Tensor]]:
        """The per-weight state made so far, by slot (a lazy optimiser's buffers once made)."""
        own = self._own or {}
        return {k: v for k, v in own.items() if k != STEP and v is not None}

    @property
    def steps(self) -> Tensor | int:
        """Adam's step count: a number, or per client a (C,) tensor."""
        return (self._own or {}).get(STEP, 0)

    def step(self, params: list[Tensor], grads: list[Tensor | None], extra_decay: Tensor | float | None = None,
             rows: Rows = None, again: bool = True) -> None:
        """The one "gradients → chain → apply" point: one update of ``params`` in place from
        ``grads``. ``extra_decay``: weight decay added to the rule's for this step (a per-client
        (C,) tensor for stacked weights; by default the links' own); ``rows``: the rows of the
        stacked state that ``params`` are (None: all; a slice: views, updated in place; an index
        tensor: copies, written back). A weight without a gradient (None: unused by the loss) is
        left as it is, its state too, as torch's optimisers leave it. ``again``: some of these
        clients step again (a lazy optimiser's hint: it may keep ``grads`` as its momentum buffers,
        which the caller does not use afterwards). A round's first step needs no flag: fresh buffers
        are zero, and a lazy optimiser's are made at the first step."""
        if extra_decay is not None and extra_decay is not self._extra:  # another FedDyn α_k: the chain anew
            self._extra = extra_decay
            self.chain = chain_of(self.rule, replace(self.links, extra_decay=extra_decay), self.lazy)
        with torch.no_grad():
            picked = tx.pick_rows(self.state, rows)
            step, new = self.chain.update(tx.Step(list(grads), params), picked, params, rows, again)
            self.state = tx.put_rows(self.state, new, picked, rows, self.count)
            self._own = _slot_state(self.state)
            tx.apply(step)

    def snapshot(self) -> Any:
        """A copy of the state as it is, for :meth:`restore_rows`."""
        return _clone(self.state)

    def restore_rows(self, kept: Any, rows: Tensor) -> None:
        """Put the stack rows ``rows`` of the state back as :meth:`snapshot` saw them (fp16's skipped
        steps); a slot made since then is zero there, as it was."""
        with torch.no_grad():
            _restore(self.state, kept, rows)

    # the state kept across rounds -----------------------------------------------------------------
    def save(self, names: list[str], prefix: str, client: int | None = None) -> dict[str, Tensor]:
        """The state as client-state entries (``client``: that row of stacked weights)."""
        out = {}
        for slot, values in self.slots.items():
            for n, v in zip(names, values):
                out[f"{prefix}{n}.{slot}"] = (v if client is None else v[client]).detach().to("cpu", copy=True)
        if self.rule.kind != "sgd":
            steps = self.steps if client is None or isinstance(self.steps, int) else self.steps[client]
            out[prefix + STEP] = torch.as_tensor(steps, dtype=torch.float64).to("cpu", copy=True)
        return out


def clear(state: dict[str, Tensor], prefix: str) -> None:
    """Remove a kept optimiser state from a client's state (before saving a new one)."""
    for key in [k for k in state if k.startswith(prefix)]:
        del state[key]


def restore(rule: Rule, params: list[Tensor], names: list[str], saved: list[dict[str, Tensor]],
            stacked: bool, links: Links | None = None) -> LocalOptimizer:
    """The optimiser of ``params`` (one client's, or stacked: ``saved`` per client) starting from the
    clients' kept states ``saved`` (their entries under the prefix, prefix removed); a client with
    none starts from zero slots and step 0. ``names``: the trainable weights' (those ``links.mask``
    keeps). A kept state of another rule's slots (the optimiser changed) is an error."""
    device = params[0].device if params else torch.device("cpu")  # the counts combine with the weights
    if not any(saved):
        return LocalOptimizer(rule, params, steps=torch.zeros(len(saved), dtype=torch.float64, device=device)
                              if stacked else 0, lazy=stacked, links=links)
    for own in saved:
        extra = {k.rsplit(".", 1)[1] for k in own if k != STEP} - set(rule.slots())
        if extra:
            raise ValueError(f"kept optimiser state holds {sorted(extra)}, not the state of '{rule.kind}'")
    links = links or Links()
    trained = params if links.mask is None else [p for p, m in zip(params, links.mask) if m]
    slots = {}
    for slot in rule.slots():
        per_param = []
        for n, p in zip(names, trained):
            rows = [own[f"{n}.{slot}"].to(p.device, p.dtype) if own else torch.zeros_like(p[0] if stacked else p)
                    for own in saved]
            per_param.append(torch.stack(rows) if stacked else rows[0].clone())
        slots[slot] = per_param
    counts = [int(own[STEP]) if STEP in own else 0 for own in saved]
    steps: Tensor | int = torch.tensor(counts, dtype=torch.float64, device=device) if stacked else counts[0]
    return LocalOptimizer(rule, params, slots, steps, links=links)


def _slot_state(state: Any) -> dict | None:
    """The rule's own state in a chain's state: the first dict (momentum's or Adam's)."""
    if isinstance(state, dict):
        return state
    if isinstance(state, tuple):
        for s in state:
            found = _slot_state(s)
            if found is not None:
                return found
    return None


def _clone(state: Any) -> Any:
    if isinstance(state, tuple):
        return tuple(_clone(s) for s in state)
    if isinstance(state, dict):
        return {k: _clone(v) for k, v in state.items()}
    if isinstance(state, list):
        return [t.clone() for t in state]
    return state.clone() if isinstance(state, Tensor) else state


def _restore(now: Any, kept: Any, rows: Tensor) -> None:
    if isinstance(now, tuple):
        for n, k in zip(now, kept):
            _restore(n, k, rows)
    elif isinstance(now, dict):
        for key, value in now.items():
            if isinstance(value, list):
                for i, whole in enumerate(value):
                    if kept[key] is None:
                        whole.index_fill_(0, rows, 0)
                    else:
                        whole.index_copy_(0, rows, kept[key][i].index_select(0, rows))
            elif isinstance(value, Tensor) and isinstance(kept[key], Tensor):
                value.index_copy_(0, rows, kept[key].index_select(0, rows))
