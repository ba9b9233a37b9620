"""A server that checks what it sums (federated.bound, federated.failures.screen): a client that skips
its clip and sends an update 10⁴ times too large is clipped again or dropped by privacy.over_bound
and counted, and the run ends within 2 points of the clean one; an honest client's clipped
message is never counted; a NaN put into a message after the client's own check goes through the
failure policy on the simulation, vectorized and Flower backends, instead of stopping the run."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent.federated.bound import enforce_bound
from fedlatent.federated.codec import ClipCodec, UpdateCodec, update_norm
from fedlatent.methods.parts import Upload
from tests.private_runs import small_config

CHEAT = 0  # the client that misbehaves


def _upload(cid: int, state: dict) -> Upload:
    return Upload(cid, state, 10, 1, 0.1, 0.0)


def test_an_update_over_the_bound_is_clipped_or_dropped_and_an_honest_clipped_one_passes_untouched() -> None:
    """C = 0.5 on a float32 model of 50 000 entries around ‖w̄‖ ≈ 220: an honest client's message
    (ClipCodec.encode of a large update, stored in float32) passes as the same object, not counted;
    an update 10⁴ times over is clipped to C (within float32 rounding) or dropped, and counted."""
    g = torch.Generator().manual_seed(0)
    reference = {"w": torch.randn(50_000, generator=g), "steps": torch.tensor(3)}
    big = {"w": reference["w"] + torch.randn(50_000, generator=g), "steps": torch.tensor(3)}
    honest = ClipCodec(0.5).encode(_upload(1, big), reference, (), {})
    cheat = _upload(CHEAT, {"w": reference["w"] + 1e4 * (big["w"] - reference["w"]), "steps": torch.tensor(3)})
    kept, dropped, over = enforce_bound([honest, cheat], reference, (), 0.5, "clip")
    assert kept[0] is honest and over == 1 and not dropped
    norm = update_norm({"w": kept[1].state["w"].double() - reference["w"].double()})
    assert abs(norm - 0.5) < 1e-3 and kept[1].state["w"].dtype == torch.float32
    assert torch.equal(kept[1].state["steps"], cheat.state["steps"])
    kept, dropped, over = enforce_bound([honest, cheat], reference, (), 0.5, "drop")
    assert kept == [honest] and over == 1 and [(d.client, d.kind) for d in dropped] == [(CHEAT, "over_bound")]


def test_withheld_and_integer_entries_are_not_measured() -> None:
    """The bound covers what the codec codes: a withheld entry (a client's own layer) or an integer
    buffer far from the reference does not count."""
    reference = {"w": torch.zeros(4), "own": torch.zeros(4), "n": torch.tensor(0)}
    upload = _upload(1, {"w": torch.full((4,), 0.1), "own": torch.full((4,), 1e6), "n": torch.tensor(10 ** 6)})
    kept, dropped, over = enforce_bound([upload], reference, ("own",), 1.0, "clip")
    assert kept == [upload] and over == 0


def _cheating(monkeypatch: pytest.MonkeyPatch, how) -> None:
    """Client CHEAT's message replaced, after its own check and encode, by ``how(message, reference)``."""
    for cls in (UpdateCodec, ClipCodec):
        original = cls.encode

        def encode(self, upload, reference, withheld, payload, *state_and_round, _original=original):
            message = _original(self, upload, reference, withheld, payload, *state_and_round)
            return how(message, upload, reference) if message.client_id == CHEAT else message
        monkeypatch.setattr(cls, "encode", encode)


def _unclipped_and_scaled(message: Upload, upload: Upload, reference: dict) -> Upload:
    """The client's own update, unclipped, times 10⁴ (the review's skipped clip)."""
    state = {k: reference[k] + 1e4 * (v - reference[k]) if v.is_floating_point() else v for k, v in upload.state.items()}
    return Upload(message.client_id, state, message.num_samples, message.steps, message.lr, message.momentum,
                  message.extras, message.metrics)


PRIVATE = ["train.rounds=30", "data.num_clients=10", "train.participation=0.5", "privacy.clip_norm=0.5", "privacy.noise_multiplier=0.3", "train.lr=0.1",
           'backend="simulation"']


def test_a_client_that_skips_its_clip_is_held_to_the_bound_and_the_run_ends_near_the_clean_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Digits, ten IID clients, five a round, σ = 0.3, C = 0.5, 30 rounds: client 0 sends its unclipped
    update × 10⁴ every round it is selected. Clipped again ("clip") or dropped ("drop"), the run ends
    within 2 points of the clean run's accuracy (measured 2026-12-02: clean 94.7 %, clip 94.7 %, drop
    94.4 %), and each metrics line counts client 0's update over the bound exactly in the rounds it
    was selected (a drop also named in ``dropped``)."""
    clean = fedlatent.run(small_config(*PRIVATE), tmp_path / "clean")
    _cheating(monkeypatch, _unclipped_and_scaled)
    results = {}
    for policy in ("clip", "drop"):
        out = tmp_path / policy
        results[policy] = fedlatent.run(small_config(*PRIVATE, f'privacy.over_bound="{policy}"'), out)
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        clean_lines = [json.loads(x) for x in (tmp_path / "clean" / "metrics.jsonl").read_text().splitlines()]
        selected = [CHEAT in c["clients"] for c in clean_lines]  # the selection does not depend on the updates
        assert any(selected)
        assert [x["privacy_over_bound"] for x in lines] == [int(s) for s in selected]
        if policy == "drop":
            assert all((CHEAT in x["clients"]) is False for x in lines)
            assert all([d["kind"] for d in x.get("dropped", [])] == (["over_bound"] if s else [])
                       for x, s in zip(lines, selected))
        assert abs(results[policy]["final"]["accuracy"] - clean["final"]["accuracy"]) <= 0.02, policy
    assert all(json.loads(x)["privacy_over_bound"] == 0
               for x in (tmp_path / "clean" / "metrics.jsonl").read_text().splitlines())


def _nan_after_the_check(message: Upload, upload: Upload, reference: dict) -> Upload:
    state = dict(message.state)
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name] = state[name].clone()
    state[name].view(-1)[0] = math.nan
    return Upload(message.client_id, state, message.num_samples, message.steps, message.lr, message.momentum,
                  message.extras, message.metrics)


BACKENDS = {"simulation": ['backend="simulation"'], "vectorized": ['backend="vectorized"'],
            "flower": ['backend="flower"', "flower.supernodes=2", "flower.cpus=2"]}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_nan_put_in_after_the_clients_own_check_goes_through_the_failure_policy(
        backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """train.on_nonfinite = "drop": client 0's message carries a NaN its own check never saw; the server
    screens it, drops the client in each round it was selected (named in ``dropped`` as non-finite) and
    the run completes on every backend."""
    if backend == "flower":
        pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedlatent[flower]')")
    _cheating(monkeypatch, _nan_after_the_check)
    config = small_config(*BACKENDS[backend], "train.rounds=2", 'train.on_nonfinite="drop"', "train.participation=1")
    if backend == "flower":
        from fedlatent.experiment import run as run_experiment
        from tests.flower_procs import InProcessGrid
        summary = run_experiment(config, tmp_path / "run", echo=None, grid=InProcessGrid(2))
    else:
        summary = fedlatent.run(config, tmp_path / "run")
    assert summary["status"] == "completed"
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(CHEAT not in x["clients"] for x in lines)
    assert all([(d["client"], d["kind"]) for d in x["dropped"]] == [(CHEAT, "nonfinite")] for x in lines)


def test_under_dp_metrics_lines_hold_no_per_client_training_loss(tmp_path: Path) -> None:
    """Each client's training loss is computed from its data without noise: under DP the metrics lines
    leave ``client_train_loss`` out (a plain run keeps it); global diagnostics stay allowed."""
    for name, extra in (("plain", []), ("private", ["privacy.clip_norm=0.5", "privacy.noise_multiplier=0.8"])):
        fedlatent.run(small_config("train.rounds=1", 'diagnostics.which=["alignment"]', *extra), tmp_path / name)
        line = json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])
        assert ("client_train_loss" in line) == (name == "plain") and line["train_loss"] is not None
