"""The end of a run evaluates the final global model once: the last round's evaluation is reused
(the same weights), and only a calibration after training adds a second one, of another model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import fedlatent
from fedlatent import load_config
from fedlatent.backends import simulation

DIGITS_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"


@pytest.fixture
def evaluations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per evaluation of the global model on the global test set."""
    calls: list[int] = []
    real = simulation.evaluate

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(simulation, "evaluate", counting)
    return calls


@pytest.mark.parametrize("every,evaluated_rounds", [(1, 3), (2, 2), (5, 1)])
def test_the_final_round_is_evaluated_once(evaluations: list[int], tmp_path: Path, every: int,
                                           evaluated_rounds: int) -> None:
    config = load_config(DIGITS_CONFIG, ["train.rounds=3", f"eval.every={every}", 'backend="simulation"'])
    summary = fedlatent.run(config, tmp_path / "run")
    assert len(evaluations) == evaluated_rounds                # rounds 1-3, 2-3 or 3 alone: none again at the end
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert summary["final"]["accuracy"] == last["test_accuracy"]
    assert summary["final"]["loss"] == last["test_loss"]


def test_a_calibrated_run_evaluates_the_calibrated_model_too(evaluations: list[int], tmp_path: Path) -> None:
    config = load_config(DIGITS_CONFIG, ["train.rounds=2", 'algorithm.name="spherefed"', 'backend="simulation"'])
    summary = fedlatent.run(config, tmp_path / "run")
    assert len(evaluations) == 2 + 1                            # each round, then the calibrated model
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert summary["final"]["uncalibrated_accuracy"] == last["test_accuracy"]


def test_a_resumed_run_with_no_round_left_evaluates_at_the_end(evaluations: list[int], tmp_path: Path) -> None:
    """Killed after the last checkpoint, before the summary: the resume plays no round, so the
    final evaluation is computed (and equals the uninterrupted run's)."""
    config = load_config(DIGITS_CONFIG, ["train.rounds=2", 'backend="simulation"'])
    first = fedlatent.run(config, tmp_path / "run")
    (tmp_path / "run" / "summary.json").unlink()
    evaluations.clear()
    again = fedlatent.run(config, tmp_path / "run", resume=True)
    assert len(evaluations) == 1
    assert again["final"]["accuracy"] == first["final"]["accuracy"]


@pytest.mark.parametrize("count", [1, 2, 3, 7, 40])
def test_shares_of_a_split_score_as_the_whole_to_the_bit(count: int) -> None:
    """The global test split evaluated in ``count`` contiguous shares (the Flower nodes' shares; more
    shares than batches leaves some empty), their tallies added in order, scores exactly as the split
    evaluated in one piece; and the scores are the hand-computed ones."""
    import torch

    from fedlatent.config import ModelConfig
    from fedlatent.data.types import Split
    from fedlatent.federated import evaluation
    from fedlatent.models import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="mlp", hidden=[16]), (1, 8, 8), 10)
    split = Split(torch.randn(1033, 1, 8, 8), torch.randint(0, 9, (1033,)))  # class 9 absent
    whole = evaluation.evaluate(model, split, 10, batch_size=100)
    parts = [evaluation.tally(model, split, 10, 100, batches=evaluation.shard(len(split), 100, i, count))
             for i in range(count)]
    assert sorted(b for p in parts for b in p.losses) == sorted(evaluation.tally(model, split, 10, 100).losses)
    assert evaluation.scores(parts) == whole
    with torch.no_grad():
        logits = model(split.x).logits.double()
    pred, y = logits.argmax(1), split.y
    recall = [float((pred[y == c] == c).double().mean()) for c in range(9)]
    assert whole["accuracy"] == pytest.approx(float((pred == y).double().mean()), abs=1e-12)
    assert whole["balanced_accuracy"] == pytest.approx(sum(recall) / 9, abs=1e-12)
    assert whole["loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)), rel=1e-5)
