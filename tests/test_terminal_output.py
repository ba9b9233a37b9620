"""What the terminal shows stays short for any number of clients: the partition and a personalised
run's per-client results as a summary beyond 20 clients, every client's row up to 20."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedlatent.analysis.tables import (FULL_TABLE_CLIENTS, partition_overview, partition_summary, per_client_table,
                                       summary_table)
from fedlatent.cli import main

ROOT = Path(__file__).resolve().parents[1]
DITTO_SYNTHETIC = ROOT / "configs" / "ditto" / "paper_synthetic00_ditto.toml"
THOUSAND = ["--set", "data.num_clients=1000", "--set", "data.samples_per_client=20"]


def _client_rows(printed: str) -> list[list[str]]:
    """The rows of a table that start with a client id."""
    return [line.split() for line in printed.splitlines() if line.split() and line.split()[0].isdigit()]


def test_partition_of_1000_clients_prints_a_short_summary(capsys) -> None:
    assert main(["partition", str(DITTO_SYNTHETIC), *THOUSAND]) == 0
    printed = capsys.readouterr().out
    assert len(printed.splitlines()) <= 12, printed
    assert printed.startswith("1000 clients, 10 classes")
    assert "skew" in printed and "--full" in printed        # the skew, and how to see every row
    assert main(["partition", str(DITTO_SYNTHETIC), *THOUSAND, "--full"]) == 0
    assert len(_client_rows(capsys.readouterr().out)) == 1000


def test_up_to_20_clients_the_full_table(digits_config: Path, capsys) -> None:
    assert main(["partition", str(digits_config), "--set", f"data.num_clients={FULL_TABLE_CLIENTS}"]) == 0
    printed = capsys.readouterr().out
    assert printed.split()[0] == "client\\class"  # both axes named
    assert [int(r[0]) for r in _client_rows(printed)] == list(range(FULL_TABLE_CLIENTS))


def test_partition_summary_values() -> None:
    counts = np.array([[4, 0, 0], [2, 2, 0], [1, 1, 1], [0, 0, 0]] * 6)       # 24 clients, 6 of them empty
    lines = partition_summary(counts).splitlines()
    assert lines[0] == "24 clients, 3 classes, 66 training samples"
    rows = {" ".join(line.split()[:3]): line.split()[3:] for line in lines if line.startswith(("samples", "classes"))}
    assert rows["samples per client"] == ["0", "3.5", "4"]
    assert rows["classes per client"] == ["0", "1.5", "3"]
    # the largest class's share, over the clients holding samples: (1 + 1/2 + 1/3) / 3
    assert "mean 0.61" in lines[-2] and lines[-1] == "6 client(s) hold no training sample"
    assert partition_overview(counts[:FULL_TABLE_CLIENTS]).splitlines()[0].split()[0] == "client\\class"
    assert partition_overview(counts, full="here").endswith("full table (client × class): here")


def _per_client(n: int) -> list[dict[str, float]]:
    rng = np.random.default_rng(0)
    return [{"client": c, "accuracy": float(a), "balanced_accuracy": float(a) / 2, "majority_baseline": 0.5}
            for c, a in enumerate(rng.uniform(0.1, 1.0, n))]


def test_per_client_results_of_1000_clients_are_statistics_and_the_worst() -> None:
    rows = _per_client(1000)
    printed = per_client_table(rows)
    assert len(printed.splitlines()) <= 25, printed
    stats = {line.split()[0]: float(line.split()[1]) for line in printed.splitlines()
             if line.split()[:1] and line.split()[0] in ("mean", "std", "min", "median", "max")}
    accs = np.array([r["accuracy"] for r in rows])
    assert stats == pytest.approx({"mean": accs.mean(), "std": accs.std(), "min": accs.min(),
                                   "median": np.median(accs), "max": accs.max()}, abs=5e-5)
    worst = [int(r[0]) for r in _client_rows(printed.split("lowest accuracy")[1])]
    assert worst == [int(c) for c in np.argsort(accs)[:5]]


def test_per_client_results_up_to_20_clients_are_every_client() -> None:
    printed = per_client_table(_per_client(FULL_TABLE_CLIENTS))
    assert [int(r[0]) for r in _client_rows(printed)] == list(range(FULL_TABLE_CLIENTS))
    summary = {"final": {"personalized_accuracy": 0.5, "per_client": _per_client(3)}}
    assert summary_table(summary).endswith(per_client_table(_per_client(3)))
    assert "per client" not in summary_table({"final": {"accuracy": 0.5}})


def test_the_printed_names_are_the_summarys_keys_and_a_global_run_says_what_they_hold() -> None:
    final = {"accuracy": 0.75, "loss": 0.3, "personalized_accuracy": 0.8, "personalized_accuracy_std": 0.1,
             "majority_baseline_accuracy": 0.5, "new_client_accuracy": 0.7, "new_client_personal_mean": 0.7,
             "per_client": _per_client(3)}
    globally = summary_table({"final": final, "personalized": False})
    labels = [line.split()[0] for line in globally.splitlines() if line.split()]
    assert {k for k in final if k != "per_client"} <= set(labels)           # summary.json's keys, as they are
    assert "(this method does not personalise: personalized_* and new_client_personal_* hold the global model" in globally
    assert "per client (the global model on its test split)" in globally
    personal = summary_table({"final": final, "personalized": True})
    assert "does not personalise" not in personal and "its personalised model" in personal
    assert "note:" not in globally + personal                  # 0.8 is above the baseline 0.5


@pytest.mark.parametrize("mine, theirs", [("personalized_accuracy", "accuracy"),
                                          ("new_client_personal_mean", "new_client_accuracy")])
def test_personal_models_below_the_global_model_get_a_note(mine: str, theirs: str) -> None:
    final = {"accuracy": 0.8, "personalized_accuracy": 0.85, "new_client_accuracy": 0.7, "new_client_personal_mean": 0.75,
             mine: 0.5, theirs: 0.6}
    notes = [line for line in summary_table({"final": final, "personalized": True}).splitlines()
             if line.startswith("note:")]
    assert len(notes) == 1 and f"0.5000 ({mine}), below" in notes[0] and f"0.6000 ({theirs})" in notes[0]
    assert not [line for line in summary_table({"final": final, "personalized": False}).splitlines()
                if line.startswith("note:") and mine in line]      # the global model against itself: no note


def test_fedbn_on_a_model_without_batchnorm_says_it_trains_as_fedavg() -> None:
    from fedlatent.config import load_config
    from fedlatent.experiment.runner.notes import setup_notes
    from fedlatent.experiment.runner.validation import validate
    mlp = load_config(None, ['algorithm.name="fedbn"'])
    assert mlp.model.arch == "mlp"
    notes = setup_notes(mlp, validate(mlp), (1, 8, 8), 10)
    assert len(notes) == 1 and "it has no BatchNorm layer" in notes[0] and "exactly as FedAvg" in notes[0]
    cnn = load_config(None, ['algorithm.name="fedbn"', 'model.arch="resnet32"'])
    assert setup_notes(cnn, validate(cnn), (3, 32, 32), 10) == []   # BatchNorm layers: its own entries
    fedavg = load_config(None, [])
    assert setup_notes(fedavg, validate(fedavg), (1, 8, 8), 10) == []


@pytest.mark.parametrize("personalized,why", [(False, "one global model cannot"), (True, "have not yet learned")])
def test_a_mean_accuracy_below_the_majority_baseline_is_explained(personalized: bool, why: str) -> None:
    final = {"accuracy": 0.1, "personalized_accuracy": 0.1, "majority_baseline_accuracy": 0.87}
    notes = [line for line in summary_table({"final": final, "personalized": personalized}).splitlines()
             if line.startswith("note:")]
    assert len(notes) == 1
    assert "0.1000 is below their majority-class baseline 0.8700" in notes[0] and why in notes[0]


def test_a_1000_client_run_prints_fewer_than_40_lines_before_its_result(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["run", str(DITTO_SYNTHETIC), *THOUSAND, "--set", "train.rounds=1", "--set", "train.local_epochs=1",
                 "--no-progress", "--no-figures", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    before, result = printed.split("ditto on synthetic")
    assert len(before.splitlines()) < 40, before                # the partition, before the first round
    assert len(result.splitlines()) < 50, result                # the result table and the per-client summary
    assert f"{out / 'partition.txt'}" in before
    assert len(json.loads((out / "partition.json").read_text())["counts"]) == 1000
    assert len((out / "partition.txt").read_text().splitlines()) == 1000 + 3   # header, rule, total
