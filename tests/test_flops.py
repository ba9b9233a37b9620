"""FLOPs: the per-sample counter against hand counts for the MLP (frozen layers included), each
client's round count (plain, Ditto with a constraint, FedRep's two phases) from both embedded
trainers, and the ``flops`` diagnostic of a run on either backend."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent import load_config
from fedlatent.backends import simulation
from fedlatent.data.federation import build_federation
from fedlatent.federated.trainer import lockstep_update
from fedlatent.methods import resolve
from fedlatent.models.flops import per_sample_flops
from fedlatent.models.mlp import build

DIGITS_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"
IN, H, C = 64, 32, 10


def test_mlp_counts_by_hand() -> None:
    model = build((1, 8, 8), C, hidden=[H])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # forward: two matrix products, 2 FLOPs per multiply-add; backward: both weight gradients and
    # the classifier's input gradient (the input itself needs none)
    assert per_sample_flops(model, (1, 8, 8)) == (2 * (IN * H + H * C), 2 * IN * H + 4 * H * C)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    model.classifier.weight.requires_grad_(False)
    model.classifier.bias.requires_grad_(False)  # a fixed head: still backpropagated through
    assert per_sample_flops(model, (1, 8, 8))[1] == 2 * IN * H + 2 * H * C
    for p in model.layers.parameters():  # only the head trains: its weight gradient alone
        p.requires_grad_(False)
    model.classifier.weight.requires_grad_(True)
    assert per_sample_flops(model, (1, 8, 8))[1] == 2 * H * C


TRAINERS = {"simulation": simulation.train_in_turn, "vectorized": lockstep_update}


def _round(name: str, trainer: str = "simulation", **algorithm):
    config = fedlatent.load_config(None, ["seed=1", "data.num_clients=3", "train.rounds=1", f"model.hidden=[{H}]",
                                          "train.local_epochs=2", "data.local_test_fraction=0.2"])
    config.algorithm = {"name": name, **algorithm}
    fed = build_federation(config.data, config.data_seed)
    spec = resolve(config.algorithm)
    spec.count_flops = True
    s = simulation.setup(config, fed, spec)
    outcomes = []
    s.trainer = lambda *args: outcomes.extend(TRAINERS[trainer](*args)) or outcomes
    simulation.run_round(s, 0)
    return {u.client_id: u.metrics["flops"] for u in outcomes}, [len(c.train) for c in fed.clients]


@pytest.mark.parametrize("name, keys, per_sample", [
    ("fedavg", {}, 2 * (IN * H + H * C) + 2 * IN * H + 4 * H * C),
    # Ditto + cosine: the global step, the personal step and a forward of the frozen global model
    ("ditto_cosine", {}, 2 * (2 * (IN * H + H * C) + 2 * IN * H + 4 * H * C) + 2 * (IN * H + H * C)),
])
@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_client_round_count(name: str, keys: dict, per_sample: int, trainer: str) -> None:
    flops, sizes = _round(name, trainer, **keys)
    for cid, n in enumerate(sizes):  # 2 epochs over every sample (no batch of one is dropped here)
        assert flops[cid] == 2 * n * per_sample


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_fedrep_counts_both_phases(trainer: str) -> None:
    flops, sizes = _round("fedrep", trainer, head_epochs=1, body_epochs=1)
    head_phase = 2 * (IN * H + H * C) + 2 * H * C  # body frozen: the head's weight gradient only
    body_phase = 2 * (IN * H + H * C) + 2 * IN * H + 2 * H * C  # head frozen
    for cid, n in enumerate(sizes):
        assert flops[cid] == n * (head_phase + body_phase)


@pytest.mark.usefixtures("no_figures")
@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_flops_diagnostic_in_a_run(tmp_path, backend: str) -> None:
    config = load_config(DIGITS_CONFIG, ["train.rounds=2", "data.num_clients=4", "train.participation=0.5",
                                         f"model.hidden=[{H}]", 'diagnostics.which=["flops"]', "diagnostics.clients=true",
                                         f"backend={backend}"])
    fedlatent.run(config, tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run" / "diagnostics.jsonl").read_text().splitlines()]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for line in metrics:
        rows = {r["model"]: r["flops"] for r in records if r["round"] == line["round"]}
        assert set(rows) == {"global"} | {f"client{c}" for c in line["clients"]}
        assert rows["global"] == sum(rows[f"client{c}"] for c in line["clients"]) > 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["backend"] == backend


