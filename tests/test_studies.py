"""Studies: grid expansion, resumable sweeps, tables against the summaries, report, reproduce specs."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedlatent.cli import main
from fedlatent.errors import ConfigError
from fedlatent.experiment.studies import reproduce
from fedlatent.experiment.studies.report import report
from fedlatent.experiment.studies.store import selected_accuracy
from fedlatent.experiment.studies.study import load_study, parse_study
from fedlatent.experiment.studies.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]

STUDY = """
title = "two methods x two alphas"
base = "{base}"
set = {{"train.rounds" = 2, "data.partition" = "dirichlet", "model.hidden" = [16]}}

[variants.method]
fedavg = {{algorithm = {{name = "fedavg"}}}}
prox = {{algorithm = {{name = "fedprox", mu = 0.1}}, "train.lr" = 0.1}}

[grid]
"data.alpha" = [0.05, 0.5]
seed = [0, 1]
"""


@pytest.fixture
def study_file(tmp_path: Path, digits_config: Path) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(STUDY.format(base=digits_config))
    return path


def test_grid_expands_every_combination_in_order(study_file: Path) -> None:
    study = load_study(study_file)
    assert [c.name for c in study.cells][:3] == ["method-fedavg_alpha-0.05_seed-0", "method-fedavg_alpha-0.05_seed-1",
                                                 "method-fedavg_alpha-0.5_seed-0"]
    assert len(study.cells) == 8 and len({c.name for c in study.cells}) == 8
    prox = [c for c in study.cells if c.labels["method"] == "prox" and c.labels["data.alpha"] == "0.5"][1]
    assert prox.config.algorithm == {"name": "fedprox", "mu": 0.1}
    assert (prox.config.train.lr, prox.config.data.alpha, prox.config.seed, prox.config.train.rounds) == (0.1, 0.5, 1, 2)
    assert prox.group == (("method", "prox"), ("data.alpha", "0.5"))


def test_terms_variants_overrides_and_published_matrix(tmp_path: Path) -> None:
    raw = {"base": {"train": {"rounds": 1}},
           "grid": {"terms": [[], [{"name": "decorrelation", "beta": 0.2}]], "seed": [3]},
           "overrides": [{"where": {"terms": "decorrelation"}, "set": {"train.lr": 0.2}}],
           "published": {"rows": "terms", "columns": "seed", "labels": ["3"], "values": {"none": [1.5], "decorrelation": [[2.5, 0.1]]}}}
    study = parse_study(raw, tmp_path)
    assert [c.name for c in study.cells] == ["terms-none_seed-3", "terms-decorrelation_seed-3"]
    assert study.cells[1].config.terms == [{"name": "decorrelation", "beta": 0.2}]
    assert (study.cells[0].config.train.lr, study.cells[1].config.train.lr) == (0.05, 0.2)
    assert study.published_for((("terms", "decorrelation"), ("seed", "3")))["std"] == 0.1


def test_a_tiers_only_may_be_a_list_of_tables_keeping_their_union(tmp_path: Path) -> None:
    raw = {"base": {"train": {"rounds": 1}, "data": {"partition": "dirichlet"}},
           "variants": {"method": {"fedavg": {"algorithm": {"name": "fedavg"}}, "prox": {"algorithm": {"name": "fedprox"}}}},
           "grid": {"data.alpha": [0.1, 5.0], "seed": [0, 1]},
           "quick": {"only": [{"data.alpha": "0.1", "method": "prox"}, {"data.alpha": "5", "seed": "1"}]}}
    cells = {tuple(c.labels.values()) for c in parse_study(raw, tmp_path, tier="quick").cells}
    assert cells == {("prox", "0.1", "0"), ("prox", "0.1", "1"), ("fedavg", "5", "1"), ("prox", "5", "1")}


def test_ditto_table1_cpu_tier_adds_alpha_5_with_fedavg_and_each_constraint() -> None:
    study = reproduce.load_spec("ditto_table1", tier="cpu")
    groups = {(c.labels["setting"], c.labels["method"]) for c in study.cells}
    assert groups == {("cifar10-a0.1", m) for m in ("cosine", "mmdd", "mkmmd_every20")} | \
        {("cifar10-a5", m) for m in ("fedavg", "cosine", "mmdd", "mkmmd_every20")}
    a5 = [c for c in study.cells if c.labels["setting"] == "cifar10-a5"]
    assert {c.config.data.alpha for c in a5} == {5.0} and len(a5) == 12
    assert {(c.config.data.train_per_class, c.config.data.test_per_class, c.config.train.rounds) for c in study.cells} == {(150, 100, 6)}
    assert "α = 5" in study.budget


@pytest.mark.parametrize("raw, needle", [
    ({"grid": {"train.lr": []}}, "grid.train.lr"),
    ({"grid": {"train.lr": [-1.0]}}, "train.lr"),
    ({"variants": {"m": {"x": {"algorithm": {"name": "nope"}}}}}, "algorithm.name"),
    ({"colour": 1}, "unknown key colour"),
    ({"select": "best"}, "select"),
])
def test_bad_studies_name_the_key(tmp_path: Path, raw: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        parse_study(raw, tmp_path)


def test_table_mean_std_equal_the_summaries(tmp_path: Path, study_file: Path) -> None:
    rows = run_sweep(load_study(study_file), tmp_path / "sweep", echo=None)
    assert {r["status"] for r in rows} == {"ran"}
    md = (tmp_path / "sweep" / "results.md").read_text()
    for method in ("fedavg", "prox"):
        for alpha in ("0.05", "0.5"):
            accs = [json.loads((tmp_path / "sweep" / f"method-{method}_alpha-{alpha}_seed-{s}" / "summary.json").read_text())
                    ["final"]["accuracy"] for s in (0, 1)]
            expected = f"| {method} | {alpha} | 2/2 | {statistics.mean(accs):.4f} ± {statistics.stdev(accs):.4f} |"
            assert expected in md
    csv_lines = (tmp_path / "sweep" / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("run,method,data.alpha,seed,status,accuracy") and len(csv_lines) == 9
    summary = json.loads((tmp_path / "sweep" / rows[0]["run"] / "summary.json").read_text())
    assert summary["identity"]["partition"]["alpha"] == 0.05 and summary["identity"]["method"]["name"] == "fedavg"
    # reports over the sweep: tables and plots exist, and the tables are the sweep's
    paths = report([tmp_path / "sweep"], tmp_path / "report")
    names = {p.name for p in paths}
    assert {"report.md", "report.tex", "report.csv", "accuracy.png", "loss.png", "time_train.png"} <= names
    assert all(p.stat().st_size > 0 for p in paths)
    assert expected.replace(" |", "", 0) in (tmp_path / "report" / "report.md").read_text()
    # a second sweep over the same directory redoes nothing
    again = run_sweep(load_study(study_file), tmp_path / "sweep", echo=None)
    assert {r["status"] for r in again} == {"skipped"}
    assert [r["accuracy"] for r in again] == [r["accuracy"] for r in rows]


@pytest.mark.slow
def test_jobs_2_gives_the_numbers_of_jobs_1(tmp_path: Path, study_file: Path) -> None:
    one = run_sweep(load_study(study_file), tmp_path / "one", jobs=1, echo=None)
    two = run_sweep(load_study(study_file), tmp_path / "two", jobs=2, echo=None)
    assert [(r["run"], r["accuracy"], r["loss"]) for r in one] == [(r["run"], r["accuracy"], r["loss"]) for r in two]


@pytest.mark.slow
def test_killed_sweep_resumes_without_redoing_finished_runs(tmp_path: Path, study_file: Path) -> None:
    study_file.write_text(study_file.read_text().replace('"train.rounds" = 2', '"train.rounds" = 6'))
    out = tmp_path / "sweep"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "fedlatent.cli", "sweep", str(study_file), "--out", str(out)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = out / "method-fedavg_alpha-0.05_seed-0" / "summary.json"
    deadline = time.time() + 120
    while not first.exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    finished = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/summary.json")}
    assert first.parent.name in finished and len(finished) < 8
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    assert all((out / name / "summary.json").stat().st_mtime_ns == t for name, t in finished.items())
    assert f"{len(finished)} of 8 runs finished already" in done.stdout
    assert len(list(out.glob("*/summary.json"))) == 8


def test_selected_accuracy_uses_the_best_validation_round() -> None:
    metrics = [{"round": 1, "val_accuracy": 0.5, "test_accuracy": 0.4}, {"round": 2, "val_accuracy": 0.7, "test_accuracy": 0.6},
               {"round": 3, "val_accuracy": 0.7, "test_accuracy": 0.9}, {"round": 4, "test_accuracy": 0.95}]
    assert selected_accuracy(metrics) == (0.6, 2)
    assert selected_accuracy([{"round": 1, "test_accuracy": 0.3}])[1] == 0


@pytest.mark.parametrize("name", reproduce.spec_names())
def test_every_spec_validates_full_and_quick(name: str) -> None:
    full = reproduce.load_spec(name)
    quick = reproduce.load_spec(name, tier="quick")
    assert full.cells and quick.cells and full.published
    assert all(c.config.data.dataset in ("digits", "synthetic") for c in quick.cells)
    assert not any(c.unavailable for c in quick.cells)
    assert any(quick.published_for(c.group) for c in quick.cells)


@pytest.mark.parametrize("name, tier, data", [("feddecorr_table1", "quick", "digits"), ("ditto_table1", "quick", "Synthetic"),
                                             ("feddecorr_table1", "cpu", "real CIFAR-10 (subset)"),
                                             ("feduv_table1", "cpu", "real pacs-96")])
def test_a_reduced_tier_names_its_data_in_the_header_row(name: str, tier: str, data: str) -> None:
    header = reproduce.comparison(reproduce.load_spec(name, tier=tier), []).splitlines()[0].split(" | ")
    assert header[header.index("paper (%)") + 1].endswith(f" on {data} (%)")
    full = reproduce.comparison(reproduce.load_spec(name), []).splitlines()[0]
    assert " on " not in full                                      # the paper's data: nothing to say


def test_reproduce_list_covers_the_four_papers(capsys: pytest.CaptureFixture) -> None:
    assert main(["reproduce", "--list"]) == 0
    text = capsys.readouterr().out
    for spec in ["feduv_table1", "feduv_table2", "feduv_table3", "feduv_table4", "feduv_table6", "feduv_supp_table4", "feduv_supp_table5", "feddecorr_table1",
                 "feddecorr_table2", "feddecorr_table3", "feddecorr_table4", "feddecorr_table6", "feddecorr_table7", "feddecorr_table8", "feddecorr_table9", "feddecorr_table10", "spherefed_table2", "spherefed_table3", "spherefed_table5", "spherefed_table6", "spherefed_table7", "ditto_table1",
                 "ditto_table2", "spherefed_table1", "spherefed_table3_tau", "spherefed_table4",
                 "spherefed_table8", "spherefed_table9", "spherefed_table10", "ditto_figure3", "feduv_supp_table2"]:
        assert spec in text
    assert "not runnable yet" not in text                          # every row of every table can run
    for spec, runs in [("feddecorr_table1", 192), ("feddecorr_table3", 30), ("feddecorr_table4", 32)]:
        assert f"{runs}/{runs} runs runnable" in text.split(spec, 1)[1].split("\n", 1)[0]  # AutoAugment landed
    assert main(["reproduce", "nope"]) == 2


def test_reproduce_list_says_which_data_are_not_here_and_how_to_point_at_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a spec's data folder is missing, the listing names the key, ``--data-root`` and the
    reduced tier that needs no files; with the folder there, it says nothing of data."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(reproduce, "spec_names", lambda: ["feddecorr_table10"])
    line = reproduce.listing().splitlines()[1]
    assert line.split() == [*"data not here: data.root = 'data' (cifar10): pass --data-root DIR, or --tier quick".split(),
                            "(its", "data", "need", "no", "files)"]
    assert reproduce.missing_data(reproduce.load_spec("feddecorr_table10", tier="quick")) == []
    (tmp_path / "data").mkdir()
    assert "data not here" not in reproduce.listing()


def test_a_refused_reproduce_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert main(["reproduce", "feddecorr_table10", "--tier", "cpu", "--out", str(out)]) == 2
    assert "folder not found" in capsys.readouterr().err and not out.exists()


@pytest.mark.slow
def test_quick_spec_runs_end_to_end(tmp_path: Path) -> None:
    text = reproduce.reproduce("spherefed_table3", tmp_path / "q", tier="quick")
    assert "| digits | fix_ou+norm | mse | 71.85 |" in text  # axes: setting, part, loss
    assert len(list((tmp_path / "q").glob("*/summary.json"))) == 20


def test_a_diverging_cell_is_recorded_as_stopped_and_not_redone(tmp_path: Path, digits_config: Path) -> None:
    """The failure policy stops a diverging run; the sweep records it (status, reason), goes on with
    the other cells, leaves it out of the mean, and a second sweep does not run it again."""
    path = tmp_path / "study.toml"
    path.write_text(f'base = "{digits_config}"\nset = {{"train.rounds" = 2, "model.hidden" = [16]}}\n'
                    '[grid]\n"train.lr" = [0.05, 1e6]\n')
    rows = {r["train.lr"]: r for r in run_sweep(load_study(path), tmp_path / "sweep", echo=None)}
    assert rows["1e+06"]["status"] == "stopped" and "non-finite" in rows["1e+06"]["error"]
    assert rows["0.05"]["status"] == "ran" and 0 <= rows["0.05"]["accuracy"] <= 1
    assert "accuracy" not in rows["1e+06"]
    again = {r["train.lr"]: r["status"] for r in run_sweep(load_study(path), tmp_path / "sweep", echo=None)}
    assert again == {"0.05": "skipped", "1e+06": "stopped"}


def test_rows_and_table_carry_the_last_global_diagnostics(tmp_path: Path, digits_config: Path) -> None:
    path = tmp_path / "study.toml"
    path.write_text(f'base = "{digits_config}"\nset = {{"train.rounds" = 2, "model.hidden" = [16], '
                    '"diagnostics.which" = ["collapse", "uniformity"]}\n[grid]\nseed = [0, 1]\n')
    rows = run_sweep(load_study(path), tmp_path / "sweep", echo=None)
    for row in rows:
        records = [json.loads(line) for line in (tmp_path / "sweep" / row["run"] / "diagnostics.jsonl")
                   .read_text().splitlines()]
        last = [r for r in records if r["model"] == "global"][-1]
        assert last["round"] == 2
        assert (row["diag_significant"], row["diag_effective_rank"], row["diag_uniformity"]) == \
            (last["significant"], last["effective_rank"], last["uniformity"])
    values = [r["diag_significant"] for r in rows]
    expected = f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"
    table = (tmp_path / "sweep" / "results.md").read_text()
    assert "diag_significant" in table and expected in table


def test_unavailable_rows_are_listed_with_their_reason_and_not_run(tmp_path: Path, digits_config: Path) -> None:
    """A row needing a piece fedlatent lacks is marked, named with its reason, and skipped by sweep."""
    path = tmp_path / "study.toml"
    path.write_text(f'base = "{digits_config}"\nset = {{"train.rounds" = 1, "model.hidden" = [8]}}\n'
                    '[grid]\nseed = [0, 1]\n[[unavailable]]\nwhere = {seed = "1"}\nreason = "needs the flux capacitor"\n')
    study = load_study(path)
    assert [bool(c.unavailable) for c in study.cells] == [False, True]
    assert "flux capacitor" in study.cells[1].unavailable
    rows = {r["seed"]: r for r in run_sweep(study, tmp_path / "sweep", echo=None)}
    assert rows["0"]["status"] == "ran" and rows["1"]["status"] != "ran"
    assert not (tmp_path / "sweep" / study.cells[1].name / "summary.json").exists()


def test_a_spec_copy_with_a_device_is_the_spec_under_sweep(tmp_path: Path) -> None:
    """The README's recipe: copy a spec, add ``train.device`` to its ``set``; ``fedlatent sweep`` reads its
    ``config = ...`` labels through the same function as ``reproduce`` (same cells, device aside)."""
    text = reproduce.spec_path("spherefed_table3").read_text()
    copy_ = tmp_path / "elsewhere" / "mine.toml"
    copy_.parent.mkdir()
    copy_.write_text(text.replace('paper = "', 'set = {"train.device" = "cuda:1"}\npaper = "', 1))
    spec, mine = reproduce.load_spec("spherefed_table3"), load_study(copy_)
    assert [c.name for c in mine.cells] == [c.name for c in spec.cells]
    for a, b in zip(spec.cells, mine.cells):
        assert b.config.train.device == "cuda:1" and b.config.data.dataset == "cifar100"
        b.config.train.device = a.config.train.device
        assert b.config == a.config


def test_sweep_runs_a_study_whose_labels_name_shipped_configs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "study.toml"
    path.write_text('set = {"train.rounds" = 1, "train.local_epochs" = 1, "data.samples_per_client" = 100}\n'
                    '[variants.method]\n'
                    'fedavg = {config = "ditto/paper_synthetic00_fedavg.toml"}\n'
                    'ditto = {config = "ditto/paper_synthetic00_ditto.toml", "train.lr" = 0.01}\n')
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 0
    for method, lr in [("fedavg", 0.001), ("ditto", 0.01)]:  # the file's sections, then the label's keys
        written = (tmp_path / "out" / f"method-{method}" / "config.toml").read_text()
        assert f'name = "{method}"' in written and f"lr = {lr}" in written and 'dataset = "synthetic"' in written
    path.write_text('[variants.method]\nx = {config = "ditto/nope.toml"}\n')
    assert main(["sweep", str(path)]) == 2
    assert "variants.method.x: config 'ditto/nope.toml' not found" in capsys.readouterr().err


CPU_TIER = [n for n in reproduce.spec_names() if "cpu" in reproduce.tiers(n)]


def test_every_spec_with_cifar10_rows_has_a_real_data_tier() -> None:
    with_cifar10 = [n for n in reproduce.spec_names()
                    if any(c.config.data.dataset == "cifar10" for c in reproduce.load_spec(n).cells)]
    assert with_cifar10 and set(with_cifar10) <= set(CPU_TIER)
    assert "feduv_table1" in CPU_TIER  # the PACS column


@pytest.mark.parametrize("name", CPU_TIER)
def test_every_cpu_tier_reads_real_images_states_its_budget_and_has_three_seeds(name: str) -> None:
    study = reproduce.load_spec(name, tier="cpu")
    assert study.budget and "paper" in study.budget  # the budget, and the paper's beside it
    assert all(c.config.data.dataset in ("cifar10", "domains") for c in study.cells)
    assert all(c.config.data.root.startswith("data/") for c in study.cells)
    assert not any(c.unavailable for c in study.cells)
    seeds = {c.group: set() for c in study.cells}
    for c in study.cells:
        seeds[c.group].add(c.labels["seed"])
    assert all(len(s) == 3 for s in seeds.values())
    assert any(study.published_for(c.group) for c in study.cells)
    moved = reproduce.load_spec(name, tier="cpu", data_root="/elsewhere")
    assert {c.config.data.root for c in moved.cells} == {"/elsewhere"}


def _cifar10_tree(root: Path, per_class: int, test_per_class: int) -> Path:
    """A tiny CIFAR-10 image-folder tree of random 32×32 PNGs."""
    import numpy as np
    from PIL import Image

    from fedlatent.data.readers import CIFAR10_CLASSES
    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("test", test_per_class)):
        for name in CIFAR10_CLASSES:
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{i:04d}.png")
    return root


def test_reproduce_cpu_tier_runs_the_chosen_cells_on_a_tree_and_states_the_budget(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = _cifar10_tree(tmp_path / "cifar10-jpeg", 10, 2)
    out = tmp_path / "cpu"
    code = main(["reproduce", "spherefed_table2", "--tier", "cpu", "--data-root", str(root),
                 "--only", "method=fedavg,fedavg+ours", "--only", "seed=0", "--set", "train.rounds=1",
                 "--set", "train.local_epochs=1", "--set", "data.train_per_class=8", "--set", "data.min_size=2",
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    runs = sorted(p.parent.name for p in out.glob("*/summary.json"))
    assert runs == ["setting-cifar10-a0.1_method-fedavg+ours_seed-0", "setting-cifar10-a0.1_method-fedavg_seed-0"]
    config = (out / runs[0] / "config.toml").read_text()
    assert "rounds = 1" in config and "train_per_class = 8" in config and str(root) in config
    text = (out / "comparison.md").read_text()
    assert "(cpu tier)" in text and "**Budget: real CIFAR-10" in text and "not the paper's budget" in text
    assert "| cifar10-a0.1 | fedavg | 63.90 |" in text  # compared with CIFAR-100's α = 0.1 column, as stated
    assert "| fedlatent accuracy on real CIFAR-10 (subset) (%) |" in text


@pytest.mark.parametrize("args, needle", [
    (["--only", "method"], "expected AXIS=LABEL"),
    (["--only", "nope=fedavg"], "no such axis"),
    (["--only", "method=nope"], "no such label"),
    (["--quick", "--tier", "cpu"], "two tiers"),
])
def test_reproduce_refuses_bad_selections_in_one_line(args: list[str], needle: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    assert main(["reproduce", "spherefed_table2", *args, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
    assert not (tmp_path / "x").exists()


def test_a_sweep_validates_every_cell_before_any_folder_or_training(tmp_path: Path, digits_config: Path) -> None:
    """A cell the model cannot satisfy (a feature-drift constraint deeper than the MLP) stops the
    sweep with one line naming the cell, before the first cell runs and before ``out`` exists."""
    raw = {"base": str(digits_config), "set": {"train.rounds": 1},
           "variants": {"method": {"fedavg": {"algorithm": {"name": "fedavg"}},
                                   "deep": {"algorithm": {"name": "ditto_cosine", "depth": 9}}}}}
    study = parse_study(raw, tmp_path)
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"^cell method-deep: .*depth = 9"):
        run_sweep(study, out, echo=None)
    assert not out.exists()


def test_unfinished_runs_show_apart_at_the_last_round_they_reached(tmp_path: Path) -> None:
    """Runs without a summary (a killed sweep, a time budget run out) are kept out of the finished
    mean and shown apart: their last whole metrics line's test accuracy, the rounds they reached;
    a line the kill cut short is skipped."""
    from fedlatent.experiment.studies.store import UNFINISHED, cell_table, run_row

    def fake_run(name: str, accuracies: list[float], finished: bool, cut: bool = False) -> Path:
        run_dir = tmp_path / name
        run_dir.mkdir()
        lines = [json.dumps({"round": r + 1, "test_accuracy": a}) for r, a in enumerate(accuracies)]
        (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n" + ('{"round": 9, "test_acc' if cut else ""))
        if finished:
            (run_dir / "summary.json").write_text(json.dumps({"final": {"accuracy": accuracies[-1]},
                                                              "rounds_completed": len(accuracies), "wall_seconds": 2.0}))
        return run_dir

    rows = [run_row("a0", {"method": "a", "seed": "0"}, "finished", fake_run("a0", [0.5, 0.6], True)),
            run_row("a1", {"method": "a", "seed": "1"}, "unfinished", fake_run("a1", [0.2, 0.3, 0.4], False, cut=True)),
            run_row("b0", {"method": "b", "seed": "0"}, "unfinished", fake_run("b0", [0.1, 0.7], False)),
            run_row("b1", {"method": "b", "seed": "1"}, "unfinished", fake_run("b1", [0.3], False))]
    assert (rows[1]["latest_round"], rows[1]["latest_accuracy"]) == (3, 0.4)
    header, body = cell_table(rows, ["method", "seed"])
    cells = {row[0]: dict(zip(header, row)) for row in body}
    assert cells["a"]["seeds"] == "1/2" and cells["a"]["accuracy"] == "0.6000"
    assert cells["a"][UNFINISHED] == "0.4000 (round 3)"
    expected = statistics.mean([0.7, 0.3]), statistics.stdev([0.7, 0.3])
    assert cells["b"]["accuracy"] == "-" and cells["b"][UNFINISHED] == f"{expected[0]:.4f} ± {expected[1]:.4f} (round 1–2)"
    header, _ = cell_table(rows[:1], ["method", "seed"])
    assert UNFINISHED not in header  # only when some run is unfinished


def test_a_sweep_line_flags_a_process_first_run_as_its_table_does(tmp_path: Path, digits_config: Path) -> None:
    """The live line of a run that was its process's first (its seconds hold the one-off imports and
    warm-up) carries the table's "*" and says why; the others do not."""
    from fedlatent.experiment.studies.sweep import FIRST_NOTE
    study = parse_study({"base": str(digits_config), "set": {"train.rounds": 1, "data.num_clients": 4},
                         "grid": {"seed": [0, 1]}}, tmp_path)
    lines: list[str] = []
    run_sweep(study, tmp_path / "out", echo=lines.append, figures=False)
    finished = [line for line in lines if line.startswith("[")]
    for line, cell in zip(finished, study.cells):
        first = json.loads((tmp_path / "out" / cell.name / "summary.json").read_text())["first_in_process"]
        assert (" s *, " in line and line.endswith(FIRST_NOTE)) == first, line
    assert len(finished) == 2 and not all(FIRST_NOTE in line for line in finished)


def test_a_sweep_tells_how_far_its_running_cells_are(tmp_path: Path, digits_config: Path, monkeypatch) -> None:
    """Between the finished-run lines, a line per running cell every HEARTBEAT_S seconds: its round
    of the planned rounds and its latest test accuracy (as metrics.jsonl has them)."""
    from fedlatent.experiment.studies import sweep

    monkeypatch.setattr(sweep, "HEARTBEAT_S", 0.02)
    study = parse_study({"base": str(digits_config), "set": {"train.rounds": 30, "data.num_clients": 4}}, tmp_path)
    lines: list[str] = []
    run_sweep(study, tmp_path / "out", echo=lines.append, figures=False)
    beats = [line for line in lines if ": round " in line]
    assert beats and lines[-1].startswith("[1/1] ")  # the heartbeat stops before the last line
    metrics = [json.loads(line) for line in (tmp_path / "out" / study.cells[0].name / "metrics.jsonl").read_text().splitlines()]
    by_round = {m["round"]: m["test_accuracy"] for m in metrics}
    for line in beats:
        rnd, acc = line.split(": round ")[1].split(", test accuracy ")
        assert rnd.split("/")[1] == "30" and f"{by_round[int(rnd.split('/')[0])]:.4f}" == acc.split(" (")[0]


def test_the_table_shows_training_seconds_and_marks_a_process_first_run(tmp_path: Path) -> None:
    """The per-cell table shows the training seconds beside the wall seconds, and marks (and its
    caption explains) a cell whose runs include a process's first, whose set-up holds the warm-up."""
    from fedlatent.experiment.studies.store import FIRST_CAPTION, TRAIN, WALL, cell_table, run_row, table_caption

    def fake_run(name: str, wall: float, train: float, first: bool) -> dict:
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_accuracy": 0.5}) + "\n")
        (run_dir / "summary.json").write_text(json.dumps({
            "final": {"accuracy": 0.5}, "rounds_completed": 1, "wall_seconds": wall, "setup_seconds": wall - train - 0.01,
            "train_seconds": train, "first_in_process": first}))
        method, seed = name.split("-")
        return run_row(name, {"method": method, "seed": seed}, "finished", run_dir)

    rows = [fake_run("a-0", 4.9, 0.21, True), fake_run("a-1", 0.25, 0.23, False), fake_run("b-0", 0.30, 0.25, False)]
    header, body = cell_table(rows, ["method", "seed"])
    cells = {row[0]: dict(zip(header, row)) for row in body}
    assert header.index(TRAIN) == header.index(WALL) - 1
    assert cells["a"][TRAIN] == "0.22" and cells["a"][WALL] == "2.6 *"  # (0.21 + 0.23) / 2; (4.9 + 0.25) / 2
    assert cells["b"][TRAIN] == "0.25" and cells["b"][WALL] == "0.3"
    assert FIRST_CAPTION in table_caption(rows) and FIRST_CAPTION not in table_caption(rows[2:])
