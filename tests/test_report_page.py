"""``report.html`` and the comparison with a paper: the verdict rules (pure functions), the
comparison figure's structure (bars, labels, the majority mark only for personalised tables, the
data a reduced tier ran on), ``reproduce``'s record of its spec, and the page: self-contained,
opening with what was run, a verdict per row where a paper is compared."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from matplotlib.container import BarContainer

from fedlatent.analysis.compare import (DID_NOT_TRAIN, DIRECTION_ONLY, HOLDS, NOT_JUDGED, REVERSE_HOLDS, UNRESOLVED,
                                       Compared, baseline_label, did_train, paired_differences, paired_text,
                                       paired_verdict, sign, verdict)
from fedlatent.analysis.study_plots import comparison_figure
from fedlatent.config import to_toml
from fedlatent.errors import UserInputError
from fedlatent.experiment.studies import page, reproduce
from fedlatent.experiment.studies.report import report
from fedlatent.experiment.studies.sweep import write_manifest


def _row(ours: list[float], paper: float | None = 70.0, std: float | None = None, **labels: str) -> Compared:
    return Compared(labels or {"method": "m"}, paper, std, ours)


# --- the verdict rules ---------------------------------------------------------------------------

@pytest.mark.parametrize("ours, std, within", [
    ([71.5, 72.5], 2.0, True),    # mean 72.0: within the paper's ± 2
    ([72.5, 72.7], 2.0, False),   # mean 72.6: outside
    ([70.9], 0.1, True),          # the paper's std is smaller than the tolerance: ± 1 applies
    ([68.8], 0.1, False),
    ([70.5], None, True),         # no std given: ± 1
])
def test_value_is_within_the_papers_std_or_the_tolerance(ours: list[float], std: float | None, within: bool) -> None:
    found = verdict(_row(ours, 70.0, std), None, same_data=True)
    assert found.value is within
    assert ("within" if within else "outside") in found.value_text


def test_value_is_not_asked_on_other_data_nor_without_numbers() -> None:
    assert verdict(_row([70.0]), None, same_data=False).value is None   # a reduced tier
    assert verdict(_row([]), None, same_data=True).value is None        # no seed finished
    assert verdict(_row([70.0], paper=None), None, same_data=True).value is None


@pytest.mark.parametrize("ours, paper, agrees", [
    ((72.0, 70.0), (78.0, 70.0), True),     # both up
    ((68.0, 70.0), (78.0, 70.0), False),    # ours down, the paper's up
    ((70.3, 70.0), (70.02, 70.0), True),    # both within ± 0.5: no difference on either side
    ((73.0, 70.0), (70.02, 70.0), False),   # ours up, the paper's no difference
])
def test_direction_compares_the_signs_against_the_baseline_row(ours: tuple, paper: tuple, agrees: bool) -> None:
    row, base = _row([ours[0]], paper[0]), _row([ours[1]], paper[1])
    found = verdict(row, base, same_data=False)
    assert found.direction is agrees
    assert found.direction_text.startswith("agrees" if agrees else "differs")


def test_direction_needs_a_baseline_row_with_both_numbers() -> None:
    assert verdict(_row([72.0]), None, same_data=True).direction is None
    assert verdict(_row([72.0]), _row([70.0], paper=None), same_data=True).direction is None
    assert verdict(_row([72.0]), _row([]), same_data=True).direction is None
    assert (sign(0.5), sign(0.51), sign(-0.6)) == (0, 1, -1)


@pytest.mark.parametrize("differences, direction, expected", [
    ([3.0, 4.0, 5.0], 1, HOLDS),              # every seed up, mean 4 > std 1
    ([-3.0, -4.0, -5.0], -1, HOLDS),          # the claim is "lower": every seed down
    ([2.0, 2.0], 1, HOLDS),                   # std 0: any mean of the claimed sign exceeds it
    ([0.5, 8.0, 0.5], 1, DIRECTION_ONLY),     # every seed up but mean 3 < std 4.33: the spread covers zero
    ([3.0, 8.0, -1.0], 1, DIRECTION_ONLY),    # mean 3.33 > 0 with a seed against
    ([4.0, 4.0, 0.0], 1, DIRECTION_ONLY),     # a tie at zero is no agreement
    ([1.0, -1.0], 1, UNRESOLVED),             # mean exactly zero
    ([-3.0, -4.0, -5.0], 1, REVERSE_HOLDS),   # every seed down, mean −4 beyond std 1: the other claim holds
    ([2.0, 3.0], -1, REVERSE_HOLDS),
    ([-0.5, -8.0, -0.5], 1, UNRESOLVED),      # every seed down but the spread covers zero
    ([-3.0, -8.0, 1.0], 1, UNRESOLVED),       # a mean of the other sign with a seed for the claim
    ([9.0], 1, UNRESOLVED),                   # one seed neither holds ...
    ([-9.0], 1, UNRESOLVED),                  # ... nor refutes
    ([], 1, UNRESOLVED),
])
def test_the_paired_verdict_rule(differences: list[float], direction: int, expected: str) -> None:
    assert paired_verdict(differences, direction) == expected
    assert paired_text(differences, direction).startswith(expected)


def test_the_paired_verdict_text_and_its_bad_direction() -> None:
    assert paired_text([3.0, 4.0, 5.0]) == "holds: +4.00 ± 1.00, 3/3 seeds +"
    assert paired_text([-1.0, 2.0], -1) == "unresolved: +0.50 ± 2.12, 1/2 seeds −"
    assert paired_text([9.0]) == "unresolved: +9.00, 1/1 seeds +"
    assert paired_text([]) == "unresolved: no paired seeds"
    with pytest.raises(ValueError, match="direction"):
        paired_verdict([1.0, 2.0], 0)


def test_a_claim_on_a_run_that_did_not_train_is_evidence_for_nothing() -> None:
    assert did_train([49.6, 70.0], floor=64.0) is False and did_train([64.1, 70.0], floor=64.0) is True
    assert did_train([64.0], floor=64.0) is False                                # at the floor is not above it
    assert paired_verdict([30.0, 35.0, 36.0], 1, trained=False) == DID_NOT_TRAIN  # holds by the numbers alone
    assert paired_verdict([30.0, 35.0, 36.0], 1) == HOLDS


def test_paired_differences_match_seeds_not_positions() -> None:
    row = Compared({"method": "m"}, 72.0, None, [71.0, 75.0, 80.0], seeds=["2", "0", "1"])
    base = Compared({"method": "b"}, 70.0, None, [70.0, 72.0], seeds=["0", "2"])  # seed 1 unfinished
    assert paired_differences(row, base) == [5.0, -1.0]                          # seeds 0 and 2
    found = verdict(row, base, same_data=False)
    assert found.paired == DIRECTION_ONLY and found.paired_text == "direction only: +2.00 ± 4.24, 1/2 seeds +"
    tie = verdict(row, Compared({"method": "b"}, 71.9, None, [70.0, 72.0], seeds=["0", "2"]), same_data=False)
    assert tie.paired == NOT_JUDGED                                               # the paper: +0.1, no direction
    assert verdict(row, None, same_data=False).paired == ""


def test_the_baseline_row_is_the_method_without_its_term_else_fedavg_else_the_first() -> None:
    table1 = ["fedavg", "fedavg+decorr", "fedprox", "fedprox+decorr"]
    assert [baseline_label(x, table1) for x in table1] == [None, "fedavg", "fedavg", "fedprox"]
    assert baseline_label("ditto+cosine", ["fedavg", "ditto", "ditto+cosine"]) == "ditto"
    assert baseline_label("ccvr", ["none", "ccvr"]) == "none"
    assert baseline_label("fedavg+ft", ["fedavg+ft", "fedrep"]) is None   # no bare fedavg: the first row
    assert baseline_label("fedrep", ["fedavg+ft", "fedrep"]) == "fedavg+ft"


# --- reproduce: rows, verdicts, figure, record ---------------------------------------------------------------------

def _fake_rows(study, values: dict[str, list[float]] | None = None) -> list[dict]:
    """Run rows as a sweep returns them: accuracy 0.8 (or ``values`` per method, one per seed)."""
    seeds: dict[str, int] = {}
    rows = []
    for cell in study.cells:
        method = cell.labels.get("method", "")
        i = seeds[cell.group] = seeds.get(cell.group, -1) + 1
        accuracy = (values or {}).get(method, [0.8] * 9)[i]
        rows.append({"run": cell.name, **cell.labels, "status": "ran", study.metric: accuracy,
                     "majority_baseline_accuracy": 0.5})
    return rows


def test_compared_axis_is_the_method_else_the_first_varied_axis_not_the_setting() -> None:
    assert reproduce.compared_axis(reproduce.load_spec("feddecorr_table1", tier="quick")) == "method"
    assert reproduce.compared_axis(reproduce.load_spec("spherefed_table4")) == "calibration"
    assert reproduce.compared_axis(reproduce.load_spec("spherefed_table3")) == "part"


def test_verdicts_pair_each_row_with_its_baseline_row_of_the_same_setting() -> None:
    study = reproduce.load_spec("feddecorr_table1", only={"method": ["fedavg", "fedavg+decorr"],
                                                          "setting": ["cifar10-a0.05", "cifar10-iid"]})
    rows = _fake_rows(study, {"fedavg": [0.64, 0.65, 0.66], "fedavg+decorr": [0.69, 0.70, 0.71]})
    compared = reproduce.compared_rows(study, rows)
    found = dict(zip([tuple(c.labels.values()) for c in compared], reproduce.verdicts(study, compared)))
    assert found["cifar10-a0.05", "fedavg"].value is True                  # 65.00 vs 64.85 ± 2.01
    assert found["cifar10-a0.05", "fedavg"].direction is None              # the baseline row itself
    decorr = found["cifar10-a0.05", "fedavg+decorr"]
    assert decorr.value is False and decorr.direction is True              # 70 vs 73.06 ± 0.81; +5 vs +8.21
    assert found["cifar10-iid", "fedavg+decorr"].direction is False        # +5 vs -0.20: the paper has none
    assert decorr.paired == HOLDS                                          # +5 on each seed, the paper's +8.21
    assert found["cifar10-iid", "fedavg+decorr"].paired == NOT_JUDGED      # the paper's -0.20 has no sign
    uneven = _fake_rows(study, {"fedavg": [0.64, 0.65, 0.66], "fedavg+decorr": [0.74, 0.70, 0.63]})
    compared = reproduce.compared_rows(study, uneven)
    found = dict(zip([tuple(c.labels.values()) for c in compared], reproduce.verdicts(study, compared)))
    assert found["cifar10-a0.05", "fedavg+decorr"].paired == DIRECTION_ONLY  # +10, +5, -3: seed 2 against
    quick = reproduce.load_spec("feddecorr_table1", tier="quick")
    assert {v.value for v in reproduce.verdicts(quick, reproduce.compared_rows(quick, _fake_rows(quick)))} == {None}


def _bars(fig) -> dict[str, int]:
    (ax,) = fig.axes
    return {c.get_label(): len(c) for c in ax.containers if isinstance(c, BarContainer)}


def _majority_marks(ax) -> list:
    return [line for line in ax.get_lines() if line.get_label().startswith("majority-class rate")]


def test_the_comparison_figure_draws_the_papers_bar_and_ours_per_row() -> None:
    study = reproduce.load_spec("feddecorr_table1", tier="quick")
    rows = reproduce.compared_rows(study, _fake_rows(study))
    rows[0] = Compared(rows[0].labels, rows[0].paper, rows[0].paper_std, [], [], "not run")  # a row without runs
    fig = comparison_figure(rows, reproduce.figure_title(study), "accuracy (%)", "fedlatent on digits",
                            "paper (on its own data)")
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == [", ".join(r.labels.values()) for r in rows]
    assert _bars(fig) == {"paper (on its own data), as published (± its std)": 16,
                          "fedlatent on digits (mean ± std over seeds)": 15}
    assert "no result (not run)" in [t.get_text() for t in ax.texts]
    assert not _majority_marks(ax)                              # not a personalised table
    assert "on digits" in fig._suptitle.get_text() and "(quick tier)" in fig._suptitle.get_text()
    assert " on " not in reproduce.figure_title(reproduce.load_spec("feddecorr_table1"))


def test_a_personalised_table_marks_the_majority_rate_on_each_of_our_bars() -> None:
    study = reproduce.load_spec("ditto_table1", tier="quick")
    rows = reproduce.compared_rows(study, _fake_rows(study))
    fig = comparison_figure(rows, reproduce.figure_title(study), "x", "fedlatent", "paper")
    (mark,) = _majority_marks(fig.axes[0])
    assert list(mark.get_xdata()) == [50.0] * len(rows)
    assert "majority-class rate (mean over seeds)" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_reproduce_records_its_spec_and_options_for_report(tmp_path: Path) -> None:
    only = {"method": ["fedavg"], "seed": ["0"]}
    reproduce.write_record(tmp_path, "feddecorr_table1", "quick", None, only, ["train.rounds=1"])
    study = reproduce.recorded_study(tmp_path)
    expected = reproduce.load_spec("feddecorr_table1", tier="quick", only=only, overrides=["train.rounds=1"])
    assert [c.name for c in study.cells] == [c.name for c in expected.cells] and study.tier == "quick"
    assert {c.config.train.rounds for c in study.cells} == {1}
    assert reproduce.recorded_study(tmp_path / "elsewhere") is None
    (tmp_path / reproduce.RECORD).write_text(json.dumps({**json.loads((tmp_path / reproduce.RECORD).read_text()),
                                                         "spec": "gone"}))
    with pytest.raises(UserInputError, match="no longer loads"):
        reproduce.recorded_study(tmp_path)


# --- the page ------------------------------------------------------------------------------------------------------

def _reproduced_folder(root: Path, name: str, tier: str, only: dict[str, list[str]],
                       values: dict[str, list[float]]) -> Path:
    """A folder as ``fedlatent reproduce`` leaves it (record, manifest, configs, metrics and
    summaries), without training: accuracy per method, one value per seed."""
    study = reproduce.load_spec(name, tier=tier, only=only)
    reproduce.write_record(root, name, tier, None, only, [])
    write_manifest(study, root)
    seeds: dict[tuple, int] = {}
    for cell in study.cells:
        i = seeds[cell.group] = seeds.get(cell.group, -1) + 1
        accuracy = values[cell.labels["method"]][i]
        run = root / cell.name
        run.mkdir()
        (run / "config.toml").write_text(to_toml(cell.config))
        (run / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "test_accuracy": accuracy * r / 2,
                                                               "train_loss": 1.0 / r}) + "\n" for r in (1, 2)))
        (run / "summary.json").write_text(json.dumps({
            "status": "completed", "backend": "simulation", "fedlatent_version": "9.9.9",
            "machine": "Test CPU, 64 cores", "final": {"accuracy": accuracy}}))
    return root


def test_report_html_is_self_contained_and_opens_with_what_was_run(tmp_path: Path) -> None:
    folder = _reproduced_folder(tmp_path / "sweep", "feddecorr_table1", "full",
                                {"setting": ["cifar10-a0.05"], "method": ["fedavg", "fedavg+decorr"]},
                                {"fedavg": [0.64, 0.65, 0.66], "fedavg+decorr": [0.69, 0.70, 0.71]})
    paths = report([folder], tmp_path / "report")
    text = (tmp_path / "report" / "report.html").read_text()
    pngs = [p for p in paths if p.suffix == ".png"]
    assert {"comparison.png", "accuracy.png"} <= {p.name for p in pngs}
    assert len(re.findall(r'<img src="data:image/png;base64,', text)) == len(pngs)  # every figure, embedded
    assert not re.search(r"<script|<link|src=\"(?!data:)|url\(", text)             # nothing fetched
    what = text.split("<h2>What was run</h2>", 1)[1].split("<h2>", 1)[0]
    for needle in ["FedDecorr Table 1", "9.9.9", "cpu, 1 thread", "simulation", "Test CPU, 64 cores",
                   "100 rounds × 10 local epochs", "<dt>clients</dt><dd>10</dd>", "cifar10 (Dirichlet α = 0.05)"]:
        assert needle in what, needle
    compared = text.split("Compared with the paper", 1)[1].split("<h2>", 1)[0]
    assert "<strong>Value within:</strong> 1 of 2 rows" in compared
    assert "<strong>direction agrees:</strong> 1 of 1 rows" in compared
    assert '<td class="yes">✓ +0.15 (within ±2.01)</td>' in compared
    assert '<td class="no">✗ -3.06 (outside ±1.00)</td>' in compared
    assert '<td class="yes">✓ agrees: ours +5.00, paper +8.21</td>' in compared
    assert '<td class="yes">✓ holds: +5.00 ± 0.00, 3/3 seeds +</td>' in compared
    assert "<strong>paired:</strong> holds 1." in compared


def test_a_folder_reproduce_did_not_write_gets_no_comparison(tmp_path: Path) -> None:
    folder = _reproduced_folder(tmp_path / "sweep", "feddecorr_table1", "quick",
                                {"setting": ["digits-iid"], "method": ["fedavg"]}, {"fedavg": [0.9, 0.8]})
    (folder / reproduce.RECORD).unlink()
    names = {p.name for p in report([folder], tmp_path / "report")}
    assert "report.html" in names and "comparison.png" not in names
    assert "Compared with the paper" not in (tmp_path / "report" / "report.html").read_text()


def test_the_commit_is_left_out_where_git_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(*args, **kwargs):
        raise FileNotFoundError("git")
    monkeypatch.setattr(subprocess, "run", missing)
    assert page.commit() is None


@pytest.mark.slow
def test_reproduce_writes_its_figure_beside_the_table_and_report_compares_it(tmp_path: Path) -> None:
    out = tmp_path / "q"
    reproduce.reproduce("feddecorr_table1", out, tier="quick", only={"setting": ["digits-iid"], "seed": ["0"],
                                                                     "method": ["fedavg", "fedavg+decorr"]},
                        overrides=["train.rounds=1"])
    assert {"comparison.md", "comparison.png", reproduce.RECORD} <= {p.name for p in out.iterdir()}
    report([out], tmp_path / "report")
    text = (tmp_path / "report" / "report.html").read_text()
    assert "Compared with the paper: FedDecorr Table 1" in text and "(quick tier)" in text
    assert "fedlatent accuracy on digits (%)" in text
