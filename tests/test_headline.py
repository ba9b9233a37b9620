"""The headline metric: a data set's trait (Fed-ISIC2019: balanced accuracy, FLamby's metric) that
summaries and tables name and put first."""
from __future__ import annotations

import json
from pathlib import Path

from fedlatent.analysis.tables import summary_table
from fedlatent.experiment.runner.single import headline_metric
from fedlatent.experiment.studies.store import cell_table, run_row


def test_headline_by_data_set_trait() -> None:
    assert headline_metric("fed_isic2019") == "balanced_accuracy"
    assert headline_metric("rxrx1") == "accuracy"
    assert headline_metric("digits") == "accuracy"


def test_summary_table_marks_the_headline() -> None:
    summary = {"final": {"accuracy": 0.5, "balanced_accuracy": 0.25}, "headline": "balanced_accuracy"}
    rows = {line.split()[0]: line.split()[1] for line in summary_table(summary).splitlines()[2:]}
    assert rows["headline"] == "balanced_accuracy" and float(rows["balanced_accuracy"]) == 0.25
    assert {line.split()[0]: line.split()[1] for line in summary_table({"final": {}}).splitlines()[2:]}[
        "headline"] == "accuracy"


def _run(tmp_path: Path, name: str, seed: int, final: dict, headline: str) -> dict:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"final": final, "headline": headline, "rounds_completed": 1,
                                                     "wall_seconds": 1.0}))
    return run_row(name, {"method": "fedavg", "seed": str(seed)}, "done", folder)


def test_cell_table_puts_balanced_accuracy_first_when_it_is_the_headline(tmp_path: Path) -> None:
    rows = [_run(tmp_path, f"r{s}", s, {"accuracy": 0.5 + s / 10, "balanced_accuracy": 0.2 + s / 10},
                 "balanced_accuracy") for s in (0, 1)]
    header, body = cell_table(rows, ["method", "seed"])
    assert header[header.index("seeds") + 1] == "balanced_accuracy"
    assert body[0][header.index("balanced_accuracy")].startswith("0.2500 ± 0.0707")
    plain = [_run(tmp_path, "p0", 0, {"accuracy": 0.5, "balanced_accuracy": 0.2}, "accuracy")]
    header, _ = cell_table(plain, ["method", "seed"])
    assert "balanced_accuracy" not in header


def test_reproduce_compares_a_balanced_headline_by_balanced_accuracy() -> None:
    from fedlatent.experiment.studies.reproduce import comparison, load_spec
    study = load_spec("ditto_table1")
    rows = [{"setting": "isic2019", "method": "fedavg", "seed": "2021", "status": "done", "headline": "balanced_accuracy",
             "personalized_accuracy": 0.9, "personalized_balanced_accuracy": 0.5, "majority_baseline_accuracy": 0.3},
            {"setting": "rxrx1", "method": "fedavg", "seed": "2021", "status": "done", "headline": "accuracy",
             "personalized_accuracy": 0.4, "personalized_balanced_accuracy": 0.2, "majority_baseline_accuracy": 0.1}]
    table = comparison(study, rows)
    isic = next(line for line in table.splitlines() if "isic2019" in line).split("|")
    rxrx1 = next(line for line in table.splitlines() if "rxrx1" in line).split("|")
    assert isic[3].strip() == "64.06" and isic[4].strip() == "50.00"   # balanced, beside the paper's 64.057
    assert rxrx1[4].strip() == "40.00"
