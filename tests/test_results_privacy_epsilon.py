"""``results/privacy_epsilon.md`` prints what its committed per-run numbers say: each table and the
verdict record are what ``results/privacy_epsilon.py`` builds from ``results/privacy_epsilon/*.csv``
(the verdicts themselves are checked by ``tests/test_results_verdicts.py``)."""
from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _script():
    spec = importlib.util.spec_from_file_location("privacy_epsilon", RESULTS / "privacy_epsilon.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


script = _script()
TEXT = (RESULTS / "privacy_epsilon.md").read_text()


@pytest.mark.parametrize("name", list(script.DATASETS))
def test_each_table_is_the_one_its_runs_give(name: str) -> None:
    assert script.table(script.load(name)) in TEXT, f"the {name} table differs from privacy_epsilon/{name}.csv"


def test_the_verdict_record_is_the_one_its_runs_give() -> None:
    assert script.verdict_block(script.BUDGET) in TEXT
    assert (RESULTS / script.RAW).read_text() == script.paired_csv()


def test_the_figure_is_committed_and_small() -> None:
    png = RESULTS / "privacy_epsilon" / "accuracy_epsilon.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 250_000


def _row(method: str, sigma: str, seed: int, accuracy: float, before: str = "", epsilon: str = "") -> dict[str, str]:
    return {"method": method, "sigma": sigma, "seed": str(seed), "epsilon": epsilon, "epsilon_rounds": epsilon,
            "accuracy": str(accuracy), "uncalibrated_accuracy": before}


def test_a_cell_is_the_mean_and_sample_std_over_its_seeds_in_points() -> None:
    rows = [_row("fedavg", "1", s, a, epsilon="43.7352") for s, a in enumerate([0.80, 0.85, 0.93])]
    line = script.table(rows).splitlines()[-1]
    mean, std = statistics.mean([80.0, 85.0, 93.0]), statistics.stdev([80.0, 85.0, 93.0])  # 86.0, 6.56
    assert line == f"| FedAvg | 1 | 3 | 43.7 | {mean:.1f} ± {std:.1f} | – | – |"


def test_rows_run_plain_first_then_sigma_ascending_within_each_method() -> None:
    rows = [_row(m, s, 0, 0.5) for m in ("feduv", "fedavg") for s in ("8", "0.5", "plain", "0", "1.5")]
    order = [(line.split(" | ")[0][2:], line.split(" | ")[1]) for line in script.table(rows).splitlines()[2:]]
    sigmas = ["plain (no clip)", "0 (clipped)", "0.5", "1.5", "8"]
    assert order == [("FedAvg", s) for s in sigmas] + [("FedUV", s) for s in sigmas]


def test_differences_pair_seeds_and_skip_a_seed_one_side_lacks() -> None:
    rows = [_row("feduv", "1", 0, 0.90), _row("feduv", "1", 1, 0.80), _row("feduv", "1", 2, 0.70),
            _row("fedavg", "1", 0, 0.85), _row("fedavg", "1", 2, 0.75), _row("fedavg", "2", 1, 0.10)]
    assert script.differences(rows, "1", ("feduv", "accuracy"), ("fedavg", "accuracy")) == [5.0, -5.0]


def test_ffc_differences_compare_after_with_before_calibration_of_the_same_run() -> None:
    rows = [_row("spherefed+ffc", "1", 0, 0.50, before="0.80"), _row("spherefed+ffc", "1", 1, 0.90, before="0.85")]
    diffs = script.differences(rows, "1", ("spherefed+ffc", "accuracy"), ("spherefed+ffc", "uncalibrated_accuracy"))
    assert diffs == [-30.0, 5.0]
