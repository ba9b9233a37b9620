"""The end of a run evaluates the final global model once: the last round's evaluation is reused
(the same weights), and only a calibration after training adds a second one, of another model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import fedlatent
from fedlatent import load_config
from fedlatent.federated import driver

DIGITS_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"


@pytest.fixture
def evaluations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per evaluation of the global model on the global test set."""
    calls: list[int] = []
    real = driver.evaluate

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(driver, "evaluate", counting)
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
