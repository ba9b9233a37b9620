"""The update rule's links (losses/transforms.py) one by one and chained, against torch.optim and
hand formulas in float64: SGD with momentum and L2 decay, Adam, AdamW, FedDyn's per-row decay,
Ditto's pull, SCAFFOLD's correction, the frozen-layer mask, a weight without a gradient, and a
stack's rows picked and written back."""
from __future__ import annotations

import pytest
import torch

from fedlatent.losses import transforms as tx
from fedlatent.losses.update import Links, Rule, chain_of

F64 = torch.float64
TORCH = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def _run(link: tx.Link, params: list[torch.Tensor], grads: list[list[torch.Tensor | None]],
         rows: tx.Rows = None, count: int = 0) -> object:
    """Steps of ``link`` on ``params`` in place (the state's rows picked and put back); the state."""
    state = link.init(params)
    for g in grads:
        picked = tx.pick_rows(state, rows)
        step, new = link.update(tx.Step(list(g), params), picked, params, rows, True)
        state = tx.put_rows(state, new, picked, rows, count)
        tx.apply(step)
    return state


def _weights(*shapes: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, 3, generator=g, dtype=F64) for s in shapes]


@pytest.mark.parametrize("kind, momentum, decay", [("sgd", 0.9, 0.01), ("sgd", 0.0, 0.1), ("adam", 0.0, 0.01),
                                                   ("adamw", 0.0, 0.05)])
def test_the_rules_chain_is_torch_optim_to_the_bit(kind: str, momentum: float, decay: float) -> None:
    """decay → momentum | Adam → AdamW's decay → −lr, four steps, against torch.optim in float64."""
    ours, theirs = _weights(4, 2), [w.clone().requires_grad_() for w in _weights(4, 2)]
    extra = {"momentum": momentum} if kind == "sgd" else {}
    reference = TORCH[kind](theirs, lr=0.1, weight_decay=decay, **extra)
    grads = [_weights(4, 2, seed=s) for s in range(1, 5)]
    _run(chain_of(Rule(kind, 0.1, momentum, decay)), ours, grads)
    for g in grads:
        for t, gt in zip(theirs, g):
            t.grad = gt.clone()
        reference.step()
    assert all(torch.equal(a, b.detach()) for a, b in zip(ours, theirs))


def test_feddyns_decay_is_per_row_and_joins_the_weight_decay() -> None:
    """Stacked rows with α_k = (0, 0.3): one SGD step is p − lr·(g + (wd + α_k)·p), row by row."""
    stacked = _weights(2)
    start, g = stacked[0].clone(), _weights(2, seed=1)[0]
    alpha = torch.tensor([0.0, 0.3], dtype=F64)
    _run(chain_of(Rule("sgd", 0.1, 0.0, 0.01), Links(extra_decay=alpha)), stacked, [[g]])
    for c in range(2):
        expect = start[c] - 0.1 * (g[c] + (0.01 + float(alpha[c])) * start[c])
        torch.testing.assert_close(stacked[0][c], expect, rtol=0, atol=1e-15)


@pytest.mark.parametrize("fused", [True, False])
def test_dittos_pull_adds_lambda_times_the_distance_to_the_anchor(fused: bool) -> None:
    """Ditto's personal step (Li et al. 2021, Algorithm 1): v − lr·(g + λ(v − w̄)), either form."""
    v, anchor, g = _weights(3), _weights(3, seed=1), _weights(3, seed=2)
    start = v[0].clone()
    _run(chain_of(Rule("sgd", 0.05), Links(pull=0.5, anchor=anchor, fused=fused)), v, [g])
    torch.testing.assert_close(v[0], start - 0.05 * (g[0] + 0.5 * (start - anchor[0])), rtol=0, atol=1e-15)


def test_dittos_pull_per_row_gives_each_row_its_own_lambda() -> None:
    """Stacked runs of different λ (rows λ = 0.5, 0, 2), the rows 0 and 2 picked as a slice and as
    indices: each row steps v − lr·(g + λ_row(v − w̄)), the row left out unchanged."""
    lam = torch.tensor([0.5, 0.0, 2.0], dtype=F64)
    for rows in (slice(0, 2), torch.tensor([0, 2])):
        v, anchor, g = _weights(3), _weights(3, seed=1), _weights(3, seed=2)
        start = v[0].clone()
        picked = [tx.row_pick(v[0], rows).clone()]
        _run(chain_of(Rule("sgd", 0.05), Links(pull=lam, anchor=anchor)), picked, [[tx.row_pick(g[0], rows)]], rows=rows)
        members = [0, 1] if isinstance(rows, slice) else [0, 2]
        for i, c in enumerate(members):
            expect = start[c] - 0.05 * (g[0][c] + float(lam[c]) * (start[c] - anchor[0][c]))
            torch.testing.assert_close(picked[0][i], expect, rtol=0, atol=1e-15)


def test_scaffolds_correction_follows_the_optimiser_step_outside_its_state() -> None:
    """SGD with momentum, then w −= lr·(c − c_i), two steps: the buffers hold the gradients only."""
    w, corr = _weights(3), _weights(3, seed=9)
    grads = [_weights(3, seed=s) for s in (1, 2)]
    start = w[0].clone()
    state = _run(chain_of(Rule("sgd", 0.1, 0.9), Links(correction=corr)), w, grads)
    b1 = grads[0][0]
    b2 = 0.9 * b1 + grads[1][0]
    torch.testing.assert_close(w[0], start - 0.1 * b1 - 0.1 * corr[0] - 0.1 * b2 - 0.1 * corr[0], rtol=0, atol=1e-14)
    torch.testing.assert_close(state[0][0]["momentum_buffer"][0], b2, rtol=0, atol=1e-15)


def test_a_frozen_weight_is_left_alone_and_has_no_state() -> None:
    w, fixed = _weights(2, 3)
    before = fixed.clone()
    link = chain_of(Rule("adam", 0.1), Links(mask=[True, False]))
    state = _run(link, [w, fixed], [[torch.ones_like(w), torch.ones_like(fixed)]])
    assert torch.equal(fixed, before) and not torch.equal(w, _weights(2, 3)[0])
    own = state[0][0]  # the mask keeps the chain's state: the rule on the present weights, Adam's first
    assert len(own["exp_avg"]) == 1 and own[tx.STEP] == 1


def test_a_weight_without_gradient_keeps_its_adam_state() -> None:
    w, unused = _weights(2, 3)
    before = unused.clone()
    state = _run(chain_of(Rule("adam", 0.1)), [w, unused], [[torch.ones_like(w), None]] * 2)
    own = state[0][0]
    assert torch.equal(unused, before) and not own["exp_avg"][1].any() and own[tx.STEP] == 2


@pytest.mark.parametrize("rows", [slice(1, 3), torch.tensor([0, 2])], ids=["slice", "index"])
def test_a_groups_rows_step_and_the_others_keep_theirs(rows: tx.Rows) -> None:
    """Lazily made momentum buffers and a per-row Adam count for some rows of a stack of 4: the
    group's rows equal torch's per client in float64, the other rows' state stays zero."""
    members = list(range(4))[rows] if isinstance(rows, slice) else rows.tolist()
    for kind in ("sgd", "adam"):
        stack = _weights(4)
        start = stack[0].clone()
        grads = [_weights(4, seed=s) for s in (1, 2)]
        link = chain_of(Rule(kind, 0.1, 0.9 if kind == "sgd" else 0.0), lazy=True)
        state = link.init(stack)
        if kind == "adam":
            state[0][0][tx.STEP] = torch.zeros(4, dtype=F64)
        for g in grads:
            group = [tx.row_pick(stack[0], rows)]
            picked = tx.pick_rows(state, rows)
            step, new = link.update(tx.Step([tx.row_pick(g[0], rows)], group), picked, group, rows, True)
            state = tx.put_rows(state, new, picked, rows, 4)
            tx.apply(step)
            if isinstance(rows, torch.Tensor):
                stack[0].index_copy_(0, rows, group[0])
        own = state[0][0]
        slot = own["momentum_buffer"] if kind == "sgd" else own["exp_avg"]
        for c in range(4):
            if c not in members:
                assert torch.equal(stack[0][c], start[c]) and not slot[0][c].any()
                continue
            theirs = start[c].clone().requires_grad_()
            reference = TORCH[kind]([theirs], lr=0.1, **({"momentum": 0.9} if kind == "sgd" else {}))
            for g in grads:
                theirs.grad = g[0][c].clone()
                reference.step()
            torch.testing.assert_close(stack[0][c], theirs.detach(), rtol=0, atol=1e-15)
        if kind == "adam":
            assert own[tx.STEP].tolist() == [2.0 if c in members else 0.0 for c in range(4)]
