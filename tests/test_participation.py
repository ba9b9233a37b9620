"""Two behaviours every table leans on: how many clients a round samples (``train.participation``)
and where the majority-class baseline beside personalised accuracies comes from.

- A round samples ⌊ρ·N⌋ of the N clients, at least 1 — the seed papers' ``int(N·ρ)`` — with the
  float product read as the whole number it stands for (0.29 × 100 = 28.999… → 29). Pinned on the
  function, on both embedded backends and on Flower's ServerApp (``metrics.jsonl``'s ``clients``).
- The baseline is each client's majority *training* class scored on that client's *test* split:
  clients whose two majorities differ, the rates computed by hand, at the function and through
  whole runs (``final.majority_baseline_accuracy``).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import fedlatent
from fedlatent.experiment import run as run_experiment
from fedlatent.federated.evaluation import majority_rate
from fedlatent.federated.round import clients_per_round, sample_clients

# (N, ρ) → clients a round. The first four give one more under round(ρ·N) (10 × 0.15 → 2,
# 10 × 0.35 → 4, 10 × 0.19 → 2, 10 × 0.29 → 3); 100 × 0.29 and 100 × 0.57 are 28.999… and
# 56.999… in floats, one fewer under a bare floor.
COUNTS = [(10, 0.15, 1), (10, 0.35, 3), (10, 0.19, 1), (10, 0.29, 2), (100, 0.29, 29), (100, 0.57, 57),
          (10, 1.0, 10), (10, 0.01, 1), (10, 0.25, 2), (10, 0.1, 1), (30, 0.1, 3), (50, 0.2, 10),
          (100, 0.1, 10), (5, 0.8, 4), (4, 0.75, 3), (3, 0.999, 2), (1, 0.5, 1)]
# run through every backend: small, and the ones where the two rules part
RUN_COUNTS = [(10, 0.15, 1), (10, 0.35, 3), (100, 0.29, 29), (10, 1.0, 10), (10, 0.01, 1)]


@pytest.mark.parametrize("n,rho,expected", COUNTS)
def test_a_round_samples_the_floor_of_rho_n_clients_and_at_least_one(n, rho, expected) -> None:
    assert clients_per_round(n, rho) == expected
    for rnd in range(3):
        chosen = sample_clients(7, rnd, n, rho)
        assert len(chosen) == expected and chosen == sorted(set(chosen)) and all(0 <= c < n for c in chosen)


def test_every_whole_number_of_clients_is_reachable_as_m_over_n() -> None:
    """ρ = m/N samples m clients for every m (what to set for a count the old rounding gave)."""
    for n in (3, 7, 10, 29, 100, 1000):
        assert [clients_per_round(n, m / n) for m in range(1, n + 1)] == list(range(1, n + 1))
        assert [clients_per_round(n, m / 100) for m in range(1, 101)] == [max(1, m * n // 100) for m in range(1, 101)]


def _digits(n: int | str, rho: float, backend: str, *extra: str) -> fedlatent.RunConfig:
    return fedlatent.load_config(None, ['data.dataset="digits"', 'data.partition="iid"', f"data.num_clients={n}",
                                        'model.arch="mlp"', "model.hidden=[8]", "train.rounds=2",
                                        f"train.participation={rho}", "eval.every=2", 'eval.personalized="never"',
                                        f'backend="{backend}"', *extra])


def _clients_per_round(out: Path) -> list[list[int]]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [line["clients"] for line in lines if "clients" in line]


@pytest.mark.parametrize("backend", ["simulation", "vectorized"])
@pytest.mark.parametrize("n,rho,expected", RUN_COUNTS)
def test_embedded_backends_aggregate_that_many_clients_a_round(backend, n, rho, expected, tmp_path) -> None:
    fedlatent.run(_digits(n, rho, backend), tmp_path / "run")
    rounds = _clients_per_round(tmp_path / "run")
    assert len(rounds) == 2
    assert rounds == [sample_clients(0, rnd, n, rho) for rnd in range(2)]
    assert [len(r) for r in rounds] == [expected, expected]


def test_the_count_is_of_the_clients_the_data_has_when_num_clients_is_auto(tmp_path) -> None:
    """data.num_clients = "auto" (the data's own count; 10 for a pool like digits): ρ applies to the
    clients built."""
    fedlatent.run(_digits("auto", 0.35, "simulation"), tmp_path / "run")
    assert [len(r) for r in _clients_per_round(tmp_path / "run")] == [3, 3]


@pytest.mark.parametrize("n,rho,expected", [(10, 0.15, 1), (10, 0.35, 3), (100, 0.29, 29)])
def test_flower_server_app_trains_that_many_clients_a_round(n, rho, expected, tmp_path) -> None:
    """The ServerApp's own round loop (fedlatent's ClientApp called in this process, two nodes)."""
    pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedlatent[flower]')")
    from tests.flower_procs import InProcessGrid
    config = _digits(n, rho, "flower", "flower.supernodes=2", "flower.cpus=2")
    run_experiment(config, tmp_path / "run", echo=None, grid=InProcessGrid(2))
    rounds = _clients_per_round(tmp_path / "run")
    assert rounds == [sample_clients(0, rnd, n, rho) for rnd in range(2)]
    assert [len(r) for r in rounds] == [expected, expected]


# Per client: training labels, test labels, and the baseline by hand — the training majority's
# share of the test labels. Each client's test majority is another class, whose share is given
# second: what the baseline would read from the test labels.
CLIENTS = [([0, 0, 0, 0, 1, 1, 2], [1, 1, 1, 0], 1 / 4, 3 / 4),
           ([2, 2, 2, 2, 2, 0, 0, 0], [0, 0, 0, 0, 2], 1 / 5, 4 / 5),
           ([1, 1, 1, 1, 2], [2, 2, 1], 1 / 3, 2 / 3)]


@pytest.mark.parametrize("train,test,by_hand,from_test", CLIENTS)
def test_the_majority_baseline_is_the_training_majority_scored_on_the_test_split(train, test, by_hand,
                                                                                from_test) -> None:
    train_y, test_y = torch.tensor(train), torch.tensor(test)
    assert majority_rate(train_y, test_y, 3) == pytest.approx(by_hand)
    assert by_hand != pytest.approx(from_test)
    assert majority_rate(test_y, test_y, 3) == pytest.approx(from_test)  # what reading the test labels gives


def test_the_majority_baseline_breaks_ties_towards_the_lower_class_and_is_nan_without_data() -> None:
    assert majority_rate(torch.tensor([2, 2, 1, 1]), torch.tensor([1, 2, 2]), 3) == pytest.approx(1 / 3)
    assert np.isnan(majority_rate(torch.tensor([0]), torch.tensor([], dtype=torch.long), 3))
    assert np.isnan(majority_rate(torch.tensor([], dtype=torch.long), torch.tensor([0]), 3))


def _arrays(tmp_path: Path) -> Path:
    """The three clients of CLIENTS as an ``arrays`` file: random 4-feature inputs, the labels given."""
    rng = np.random.default_rng(0)
    arrays = {}
    for i, (train, test, _, _) in enumerate(CLIENTS):
        for split, y in (("train", train), ("test", test)):
            arrays[f"client{i}_{split}_x"] = rng.standard_normal((len(y), 4)).astype(np.float32)
            arrays[f"client{i}_{split}_y"] = np.asarray(y, dtype=np.int64)
    path = tmp_path / "clients.npz"
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("backend", ["simulation", "vectorized", "flower"])
def test_a_runs_majority_baseline_is_each_clients_training_majority_on_its_test_split(backend, tmp_path) -> None:
    if backend == "flower":
        pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedlatent[flower]')")
    path = _arrays(tmp_path)
    config = fedlatent.load_config(None, ['data.dataset="arrays"', 'data.partition="given"', f'data.path="{path}"',
                                          'model.arch="mlp"', "model.hidden=[8]", "train.rounds=1",
                                          "train.batch_size=4", 'eval.personalized="always"', f'backend="{backend}"',
                                          *(["flower.supernodes=2", "flower.cpus=2"] if backend == "flower" else [])])
    if backend == "flower":
        from tests.flower_procs import InProcessGrid
        summary = run_experiment(config, tmp_path / "run", echo=None, grid=InProcessGrid(2))
    else:
        summary = fedlatent.run(config, tmp_path / "run")
    final = summary["final"]
    assert [row["majority_baseline"] for row in final["per_client"]] == pytest.approx([c[2] for c in CLIENTS])
    assert final["majority_baseline_accuracy"] == pytest.approx(np.mean([c[2] for c in CLIENTS]))
