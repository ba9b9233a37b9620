"""train.optimizer (sgd | adam | adamw), train.optimizer_state = 'kept' (per client, in its state,
through checkpoints and --resume) and train.local_steps."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import fedlatent
from fedlatent import load_config
from fedlatent.losses import update
from fedlatent.federated.client import LocalSettings, prefixed, rule_of, save_optimizer
from fedlatent.federated.state import client_tensors
from fedlatent.federated.trainer.schedule import epochs
from fedlatent.losses.update import LocalOptimizer, Rule

DIGITS = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"
KEPT = ["train.rounds=3", "data.num_clients=3", "algorithm.name=ditto", "train.optimizer=adamw",
        "train.optimizer_state=kept", "train.local_steps=4", "train.lr=0.001", "train.weight_decay=0.01"]


def _settings(**kw) -> LocalSettings:
    base = dict(epochs=2, batch_size=4, lr=0.1, momentum=0.0, weight_decay=0.0, drop_last=False, augment=False,
                num_classes=2)
    return LocalSettings(**{**base, **kw})


def test_epochs_mode_draws_the_same_batches_as_before() -> None:
    from fedlatent.federated.trainer.schedule import batches
    got = [b for e in epochs(10, _settings(), torch.Generator().manual_seed(3)) for b in e]
    g = torch.Generator().manual_seed(3)
    expect = [b for _ in range(2) for b in batches(10, 4, False, g)]
    assert len(got) == len(expect) == 6 and all(torch.equal(a, b) for a, b in zip(got, expect))


@pytest.mark.parametrize("steps, sizes", [(5, [4, 4, 2, 4, 4]), (3, [4, 4, 2]), (1, [4])])
def test_local_steps_run_epoch_after_epoch(steps: int, sizes: list[int]) -> None:
    drawn = list(epochs(10, _settings(steps=steps), torch.Generator().manual_seed(0)))
    assert [len(b) for e in drawn for b in e] == sizes
    assert all(sorted(torch.cat(e).tolist()) == list(range(10)) for e in drawn[:-1])  # full epochs first


TORCH = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


@pytest.mark.parametrize("kind, momentum, decay", [("sgd", 0.9, 0.01), ("sgd", 0.0, 0.0), ("adam", 0.0, 0.01),
                                                   ("adam", 0.0, 0.0), ("adamw", 0.0, 0.05)])
def test_one_clients_update_rule_is_torchs_to_the_bit(kind: str, momentum: float, decay: float) -> None:
    """The one update rule (federated.update) on one model's weights against torch.optim, five steps."""
    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    theirs.load_state_dict(ours.state_dict())
    extra = {"momentum": momentum} if kind == "sgd" else {}
    reference = TORCH[kind](theirs.parameters(), lr=0.1, weight_decay=decay, **extra)
    optimizer = LocalOptimizer(Rule(kind, 0.1, momentum, decay), list(ours.parameters()))
    for _ in range(5):
        x = torch.randn(4, 5)
        reference.zero_grad()
        theirs(x).square().sum().backward()
        reference.step()
        optimizer.step(list(ours.parameters()), list(torch.autograd.grad(ours(x).square().sum(), list(ours.parameters()))))
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_stacked_update_equals_each_clients_own(kind: str) -> None:
    """Stacked weights (two clients, an extra decay and an Adam age each) take the update each
    client's own optimiser takes, up to rounding."""
    torch.manual_seed(1)
    rule = Rule(kind, 0.05, 0.9 if kind == "sgd" else 0.0, 0.01)
    weights = [torch.randn(2, 3, 4), torch.randn(2, 3)]
    grads = [[torch.randn(2, 3, 4), torch.randn(2, 3)] for _ in range(3)]
    extra = torch.tensor([0.0, 0.2])
    stacked = [w.clone() for w in weights]
    together = LocalOptimizer(rule, stacked, steps=torch.tensor([0.0, 4.0], dtype=torch.float64))
    for g in grads:
        together.step(stacked, g, extra_decay=extra)
    for c in range(2):
        own = [w[c].clone() for w in weights]
        alone = LocalOptimizer(Rule(kind, rule.lr, rule.momentum, rule.weight_decay + float(extra[c])), own,
                               steps=[0, 4][c])
        for g in grads:
            alone.step(own, [x[c] for x in g])
        assert all(torch.allclose(a, b[c], atol=1e-6) for a, b in zip(own, stacked))


@pytest.mark.parametrize("shared", [False, True], ids=["own-gradients", "one-gradient-for-two"])
def test_a_lazy_first_step_keeps_momentum_buffers_of_its_own(shared: bool) -> None:
    """Stacked SGD with momentum, lazily: the first step's gradients become the buffers, unless two
    weights were handed one tensor (the gradient of a + b) — then each gets its own. Three steps
    equal torch's SGD on each weight, in float64."""
    torch.manual_seed(2)
    weights = [torch.randn(2, 3, dtype=torch.float64) for _ in range(2)]
    steps = [torch.randn(2, 3, dtype=torch.float64) for _ in range(3)]
    ours = [w.clone() for w in weights]
    optimizer = LocalOptimizer(Rule("sgd", 0.1, 0.9), ours, steps=torch.zeros(2, dtype=torch.float64), lazy=True)
    for g in steps:
        grads = [g.clone()] * 2 if shared else [g.clone(), 2 * g]
        optimizer.step(ours, grads, again=True)
    buffers = optimizer.slots["momentum_buffer"]
    assert buffers[0].data_ptr() != buffers[1].data_ptr()
    for k, w in enumerate(weights):
        theirs = w.clone().requires_grad_(True)
        reference = torch.optim.SGD([theirs], lr=0.1, momentum=0.9)
        for g in steps:
            theirs.grad = g.clone() if shared or k == 0 else 2 * g
            reference.step()
        torch.testing.assert_close(ours[k], theirs.detach(), rtol=0, atol=1e-15)


def test_a_weight_without_gradient_is_left_alone() -> None:
    w, unused = torch.ones(3), torch.ones(2)
    optimizer = LocalOptimizer(Rule("sgd", 0.1, 0.9, 0.5), [w, unused])
    optimizer.step([w, unused], [torch.ones(3), None])
    assert torch.equal(unused, torch.ones(2)) and not torch.equal(w, torch.ones(3))
    assert torch.equal(optimizer.slots["momentum_buffer"][1], torch.zeros(2))


def test_kept_state_round_trips_through_the_client_state() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    names, leaves = ["weight", "bias"], [model.weight, model.bias]
    optimizer = update.restore(rule_of(_settings(optimizer="adam")), leaves, names, [{}], stacked=False)
    for _ in range(3):
        optimizer.step(leaves, list(torch.autograd.grad(model(torch.randn(4, 3)).square().sum(), leaves)))
    state: dict[str, torch.Tensor] = {"personal.x": torch.zeros(1)}
    save_optimizer(optimizer, names, state, "optim.")
    assert sorted(state) == ["optim.bias.exp_avg", "optim.bias.exp_avg_sq", "optim.step", "optim.weight.exp_avg",
                             "optim.weight.exp_avg_sq", "personal.x"]
    again = update.restore(optimizer.rule, leaves, names, [prefixed(state, "optim.")], stacked=False)
    assert again.steps == 3
    assert all(torch.equal(a, b) for slot in optimizer.slots for a, b in zip(optimizer.slots[slot], again.slots[slot]))
    stacked = update.restore(optimizer.rule, [torch.stack([p.detach()] * 2) for p in leaves], names,
                             [prefixed(state, "optim."), {}], stacked=True)  # a client with none starts at zero
    assert stacked.steps.tolist() == [3.0, 0.0]
    assert all(torch.equal(s[0], a) and not s[1].any()
               for slot in optimizer.slots for a, s in zip(optimizer.slots[slot], stacked.slots[slot]))


def _metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time_") and "seconds" not in k} for r in rows]


def _latest(out: Path, name: str) -> dict[str, torch.Tensor]:
    folder = out / "checkpoints" / json.loads((out / "checkpoints" / "latest.json").read_text())["folder"]
    return client_tensors(folder) if name == "clients" else load_file(str(folder / name))


@pytest.mark.slow
def test_kept_adamw_state_survives_a_checkpoint_and_resume(tmp_path: Path, crash_at_round_2,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "crashed"
    with pytest.raises(KeyboardInterrupt):
        fedlatent.run(load_config(DIGITS, KEPT), out)
    monkeypatch.undo()
    reference = tmp_path / "reference"
    summary = fedlatent.run(load_config(DIGITS, KEPT), reference)
    clients = _latest(reference, "clients")
    # every client's AdamW counts all its steps (3 rounds × 4), for the global and the personal model
    assert {float(v) for k, v in clients.items() if k.endswith("optim.step")} == {12.0}
    assert any("/personal_optim." in k and k.endswith("exp_avg_sq") for k in clients)
    resumed = fedlatent.run(load_config(DIGITS, KEPT), out, resume=True)
    assert resumed["final"] == summary["final"]
    assert _metrics(out) == _metrics(reference)
    for name in ("global.safetensors", "clients"):
        a, b = _latest(out, name), _latest(reference, name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_kept_state_changes_the_run_and_fresh_keeps_none(tmp_path: Path) -> None:
    fedlatent.run(load_config(DIGITS, KEPT), tmp_path / "kept")
    fedlatent.run(load_config(DIGITS, [*KEPT, "train.optimizer_state=fresh"]), tmp_path / "fresh")
    kept, fresh = _latest(tmp_path / "kept", "global.safetensors"), _latest(tmp_path / "fresh", "global.safetensors")
    assert any(not torch.equal(kept[k], fresh[k]) for k in kept)
    assert not any("optim." in k for k in _latest(tmp_path / "fresh", "clients"))


def test_batch_count_is_the_number_of_batches_drawn() -> None:
    """:func:`batch_count` (used to plan lockstep steps before drawing) against the batches drawn,
    and the batches against the permutation's chunks: incomplete last dropped under drop_last, a
    trailing single sample dropped, an empty epoch one empty batch without drop_last."""
    from fedlatent.federated.trainer.schedule import batch_count, batches

    for n in range(0, 41):
        for size in (1, 2, 3, 7, 16, 32):
            for drop_last in (False, True):
                drawn = batches(n, size, drop_last, torch.Generator().manual_seed(n))
                assert len(drawn) == batch_count(n, size, drop_last)
                order = torch.randperm(n, generator=torch.Generator().manual_seed(n))
                assert torch.equal(torch.cat(drawn) if drawn else order[:0], order[:sum(len(b) for b in drawn)])
    assert batch_count(33, 32, False) == 1 and batch_count(34, 32, False) == 2  # a single trailing sample
    assert batch_count(40, 32, True) == 1 and batch_count(64, 32, True) == 2
    assert batch_count(0, 32, False) == 1 and batch_count(0, 32, True) == 0
    assert batch_count(5, 1, False) == 4  # batches of one: the last one is a single trailing sample
