"""A sampled evaluation (``eval.clients``, ``eval.final_clients``) on Flower: the embedded backend's
numbers, and messages to the sampled clients' nodes alone.

Where the global test split is the clients' test splits together (Synthetic: no node holds a share
of it) a round's test, the final personalised reports and the held-out clients' evaluation ask only
the SuperNodes serving sampled clients, each for those clients, and the server combines their
tallies as the embedded backend combines the same clients' (:mod:`fedlatent.federated.sampled`).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedlatent[flower]')")

import fedlatent  # noqa: E402
from fedlatent.backends.flower import client_app  # noqa: E402
from fedlatent.experiment import run as run_experiment  # noqa: E402
from tests.flower_procs import InProcessGrid  # noqa: E402

# 30 clients of Synthetic(0.5, 0.5), 6 of them held out: 24 train; a round's evaluation takes 4 of
# the 24 and 4 of the 6 held out, the final one 5 of each
SAMPLED = ["seed=1", 'data.dataset="synthetic"', 'data.partition="given"', "data.num_clients=30",
           "data.holdout_clients=6", "data.samples_per_client=50", "data.synthetic_alpha=0.5",
           "data.synthetic_beta=0.5", "model.hidden=[20]", "train.rounds=2", "train.batch_size=10", "train.lr=0.05",
           "train.threads=1", "train.participation=0.25", "eval.clients=4", "eval.final_clients=5"]
# the test split's mean loss: the embedded backend evaluates the clients' test splits joined, in
# batches of eval.batch_size across clients; the nodes each client's alone (as in a full evaluation),
# so the batch sums' float rounding differs
LOSSES = ("test_loss", "loss")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _same(ours: dict, theirs: dict, where: str) -> None:
    assert ours.keys() == theirs.keys(), where
    for key in ours:
        if key in LOSSES:
            assert theirs[key] == pytest.approx(ours[key], rel=1e-6), (where, key)
        elif not key.startswith(("time", "bytes")):
            assert theirs[key] == ours[key], (where, key)


def test_a_sampled_evaluation_on_flower_is_the_embedded_one_from_the_sampled_nodes(tmp_path, monkeypatch):
    """Every number of every round's line and of the final evaluation is the embedded backend's
    (the test split's loss to its float rounding: :data:`LOSSES`) — the sampled test accuracy and
    its standard error, the validation, personalised and held-out clients' estimates — and each
    evaluation messages as many nodes as it samples clients (one client a node)."""
    monkeypatch.setattr(client_app, "_BUILT", {})  # no job kept from an earlier test
    embedded = fedlatent.run(fedlatent.load_config(None, [*SAMPLED, 'backend="simulation"']), tmp_path / "embedded")
    grid = InProcessGrid(30)
    flower = run_experiment(fedlatent.load_config(None, [*SAMPLED, 'backend="flower"']), tmp_path / "flower",
                            echo=None, grid=grid)
    ours, theirs = (_lines(tmp_path / name / "metrics.jsonl") for name in ("embedded", "flower"))
    assert len(ours) == len(theirs) == 2
    for mine, other in zip(ours, theirs):
        assert mine["val_clients"] == 4 and "test_accuracy_se" in mine and "new_client_accuracy_se" in mine
        _same(mine, other, f"round {mine['round']}")
    assert "accuracy_se" in embedded["final"] and "personalized_accuracy_se" in embedded["final"]
    assert len(embedded["final"]["new_clients"]) == 5
    _same(embedded["final"], flower["final"], "final")
    for kind in ("evaluate.test", "evaluate.validate", "evaluate.new"):
        assert grid.sent.count(kind) == 4 + 4 + 5, kind  # rounds 1 and 2, then the final evaluation
    assert grid.sent.count("evaluate.report") == 5


def test_the_simulation_engines_grid_polls_less_often_when_many_replies_are_outstanding():
    """Flower's in-memory grid checks every outstanding message at each poll: 0.1 s between polls
    (Flower's default) up to 1,000 messages, 0.1 ms a message above, at most 1 s; another grid is
    left as it is."""
    from flwr.superlink.grid import InMemoryGrid

    from fedlatent.backends.flower import server_app
    grid = InMemoryGrid.__new__(InMemoryGrid)  # its link state is not needed to pace it
    for outstanding, interval in ((1, 0.1), (1000, 0.1), (5000, 0.5), (10_000, 1.0), (100_000, 1.0)):
        server_app.pace(grid, outstanding)
        assert grid.pull_interval == pytest.approx(interval), outstanding
    other = InProcessGrid(1)
    server_app.pace(other, 10_000)
    assert not hasattr(other, "pull_interval")
