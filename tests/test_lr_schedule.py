"""Learning rate over rounds: constant, cosine and multi-step (× gamma at milestones)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent.backends.simulation import round_lr
from fedlatent.errors import ConfigError


def _train(*overrides: str):
    return fedlatent.load_config(None, list(overrides)).train


def test_multistep_default_is_a_tenth_every_40_rounds() -> None:
    t = _train("train.lr_schedule=multistep", "train.lr=0.1", "train.rounds=100")
    lrs = [round_lr(t, r) for r in range(100)]
    assert lrs[0] == lrs[39] == 0.1
    assert lrs[40] == pytest.approx(0.01) and lrs[79] == pytest.approx(0.01)
    assert lrs[80] == pytest.approx(0.001) and lrs[99] == pytest.approx(0.001)


def test_multistep_matches_torch_multisteplr_stepped_once_a_round() -> None:
    t = _train("train.lr_schedule=multistep", "train.lr=0.2", "train.rounds=30",
               "train.lr_milestones=[5, 12, 20]", "train.lr_gamma=0.5")
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.2)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[5, 12, 20], gamma=0.5)
    for r in range(30):
        assert round_lr(t, r) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12)
        opt.step()
        sched.step()


def test_constant_and_cosine_unchanged() -> None:
    assert round_lr(_train("train.lr=0.3"), 17) == 0.3
    t = _train("train.lr_schedule=cosine", "train.lr=0.1", "train.rounds=10", "train.lr_min=0.01")
    assert round_lr(t, 0) == pytest.approx(0.1)
    assert round_lr(t, 5) == pytest.approx(0.01 + 0.045 * (1 + math.cos(math.pi / 2)))


@pytest.mark.parametrize(("rounds", "lr_min"), [(100, 0.0), (60, 0.0), (7, 0.002)])
def test_cosine_matches_torch_cosineannealinglr_stepped_once_a_round(rounds: int, lr_min: float) -> None:
    """FedUV's release: CosineAnnealingLR(optimizer, T_max = rounds) (eta_min 0), round r trained at
    get_last_lr(), step() after each round (train_fl.py); torch's scheduler works in Python floats (float64)."""
    t = _train("train.lr_schedule=cosine", "train.lr=0.01", f"train.rounds={rounds}", f"train.lr_min={lr_min}")
    opt = torch.optim.SGD([torch.zeros(1, dtype=torch.float64, requires_grad=True)], lr=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=rounds, eta_min=lr_min)
    for r in range(rounds):
        assert round_lr(t, r) == pytest.approx(sched.get_last_lr()[0], rel=1e-12, abs=1e-15), r
        opt.step()
        sched.step()
    assert round_lr(t, 0) == 0.01 and round_lr(t, rounds - 1) > lr_min


@pytest.mark.parametrize("value", ["[0]", "[5, 3]", "[4, 4]", "[1.5]", '["a"]'])
def test_bad_milestones_are_rejected(value: str) -> None:
    with pytest.raises(ConfigError, match="train.lr_milestones"):
        _train(f"train.lr_milestones={value}")


def test_a_run_records_the_schedule(tmp_path: Path) -> None:
    cfg = fedlatent.load_config(None, ["train.rounds=3", "train.lr=0.1", "train.lr_schedule=multistep",
                                       "train.lr_milestones=[1, 2]", "data.num_clients=2", "model.hidden=[8]"])
    fedlatent.run(cfg, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows] == pytest.approx([0.1, 0.01, 0.001])
