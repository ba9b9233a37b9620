"""Diagnostics inside runs: diagnostics.jsonl, no effect on training, exact resume, both backends,
bad keys, plots."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import fedlatent
from fedlatent.experiment import prepare
from fedlatent import load_config
from fedlatent.analysis import diagnostics as dg
from fedlatent.analysis.diagnostic_plots import plot_diagnostics
from fedlatent.backends import simulation
from fedlatent.errors import ConfigError
from fedlatent.federated.state import Checkpoints

DIGITS_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"
SHORT = ["train.rounds=3", "train.participation=0.5", "data.num_clients=6"]
ALL = ['diagnostics.which=["collapse", "classifier", "alignment", "uniformity", "per_class", "tsne", "data"]',
       "diagnostics.clients=true", "diagnostics.every=2", "diagnostics.tsne_samples=12", "diagnostics.max_samples=100"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "diagnostics.jsonl").read_text().splitlines()]


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in rows]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    folder = json.loads((out / "checkpoints" / "latest.json").read_text())["folder"]
    return load_file(str(out / "checkpoints" / folder / "global.safetensors"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """The same short run without and with every diagnostic."""
    root = tmp_path_factory.mktemp("diag")
    fedlatent.run(load_config(DIGITS_CONFIG, SHORT), root / "plain")
    fedlatent.run(load_config(DIGITS_CONFIG, SHORT + ALL), root / "diag")
    return root / "plain", root / "diag"


@pytest.mark.slow
def test_diagnostics_change_no_training_number(pair):
    plain, diag = pair
    a, b = _weights(plain), _weights(diag)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    metrics = [[json.loads(l) for l in (p / "metrics.jsonl").read_text().splitlines()] for p in pair]
    assert _untimed(metrics[0]) == _untimed(metrics[1])
    assert not (plain / "diagnostics.jsonl").exists()


@pytest.mark.slow
def test_records_per_round_and_model(pair):
    _, diag = pair
    records = _records(diag)
    metrics = [json.loads(l) for l in (diag / "metrics.jsonl").read_text().splitlines()]
    assert (records[0]["round"], records[0]["model"]) == (0, "data")
    assert np.array(records[0]["label_counts"]).sum() == sum(
        np.array(json.loads((diag / "partition.json").read_text())["counts"]).sum(1))
    # every 2 rounds and the last: rounds 2 and 3; the global model then each selected client's
    for rnd in (2, 3):
        rows = [r for r in records if r["round"] == rnd]
        clients = metrics[rnd - 1]["clients"]
        assert [r["model"] for r in rows] == ["global"] + [f"client{c}" for c in clients]
        assert all(r["split"] == "test" and r["num_samples"] == 360 for r in rows)
        glob = rows[0]
        assert len(glob["singular_values"]) == 128 and len(glob["classifier_singular_values"]) == 10
        assert 0 <= glob["significant"] <= 128 and glob["alignment_pairs"] == len(clients) * (len(clients) - 1) // 2
        assert len(glob["tsne"]["xy"]) == len(glob["tsne"]["client"]) > 0
        assert "alignment_cosine" not in rows[1] and "tsne" not in rows[1]
    assert not any(r["round"] == 1 for r in records)


@pytest.mark.slow
def test_recorded_values_match_a_recomputation_from_the_final_weights(pair):
    _, diag = pair
    config = load_config(DIGITS_CONFIG, SHORT + ALL)
    federation, spec = prepare(config)
    model = simulation.make_model(config, federation, spec)
    model.load_state_dict(_weights(diag))
    z, pred = dg.representations(model, federation.test.x)
    last = [r for r in _records(diag) if r["model"] == "global"][-1]
    np.testing.assert_allclose(last["singular_values"], dg.covariance_spectrum(z), rtol=1e-6, atol=1e-12)
    assert last["per_class_accuracy"] == pytest.approx(dg.per_class_accuracy(pred, federation.test.y, 10))
    assert last["significant"] == dg.collapse(z, config.diagnostics.threshold)["significant"]


@pytest.mark.slow
def test_resume_truncates_and_reproduces_the_diagnostics(pair, tmp_path, monkeypatch):
    _, reference = pair
    real_save = Checkpoints.save

    def crash_before_round_3_is_saved(self, **kw):  # round 3's records are written, its checkpoint not
        if kw["info"]["round"] == 3:
            raise KeyboardInterrupt
        return real_save(self, **kw)

    monkeypatch.setattr(Checkpoints, "save", crash_before_round_3_is_saved)
    out = tmp_path / "crashed"
    with pytest.raises(KeyboardInterrupt):
        fedlatent.run(load_config(DIGITS_CONFIG, SHORT + ALL), out)
    assert max(r["round"] for r in _records(out)) == 3
    monkeypatch.undo()
    fedlatent.run(load_config(DIGITS_CONFIG, SHORT + ALL), out, resume=True)
    assert _untimed(_records(out)) == _untimed(_records(reference))


@pytest.mark.slow
def test_vectorized_backend_records_the_same_diagnostics(pair, tmp_path):
    _, reference = pair
    out = tmp_path / "vec"
    fedlatent.run(load_config(DIGITS_CONFIG, SHORT + ALL + ["backend=vectorized"]), out)
    ours, theirs = _records(out), _records(reference)
    assert [(r["round"], r["model"]) for r in ours] == [(r["round"], r["model"]) for r in theirs]
    for a, b in zip(ours, theirs):   # float32 rounding apart, the same models
        for key, tol in (("significant", 2), ("effective_rank", 1e-3), ("uniformity", 1e-4), ("alignment_cosine", 1e-5)):
            if key in a:
                assert a[key] == pytest.approx(b[key], abs=tol), key
        if "per_class_accuracy" in a:
            np.testing.assert_allclose(a["per_class_accuracy"], b["per_class_accuracy"], atol=0.05)


@pytest.mark.slow
def test_run_writes_its_diagnostic_plots(pair):
    _, diag = pair
    names = {p.name for p in (diag / "plots").glob("diag_*.png")}
    assert {"diag_spectrum.png", "diag_significant.png", "diag_classifier_sv.png", "diag_alignment.png",
            "diag_uniformity.png", "diag_per_class.png", "diag_tsne.png", "diag_data_labels.png",
            "diag_data_mean_values.png"} <= names


@pytest.mark.slow
def test_plot_diagnostics_groups_runs_and_skips_runs_without_diagnostics(pair, tmp_path):
    plain, diag = pair
    written = plot_diagnostics([plain, diag, diag], tmp_path / "report")
    assert written and all(p.exists() and p.stat().st_size > 1000 for p in written)
    assert plot_diagnostics([plain], tmp_path / "none") == []


@pytest.mark.parametrize("override, message", [
    ('diagnostics.which=["collapse", "spectra"]', "diagnostics.which: 'spectra' is not a diagnostic"),
    ('diagnostics.which=["collapse", "collapse"]', "names a diagnostic twice"),
    ("diagnostics.every=0", "diagnostics.every = 0: must be >= 1"),
    ("diagnostics.split=holdout", "diagnostics.split = 'holdout': allowed values are test, val, train"),
    ("diagnostics.threshold=0.0", "diagnostics.threshold = 0.0: must be > 0.0"),
    ("diagnostics.threshold=2.0", "diagnostics.threshold = 2.0: must be <= 1.0"),
    ("diagnostics.which=collapse", "diagnostics.which = 'collapse': expected a list"),
    ("diagnostics.colour=1", "unknown key diagnostics.colour"),
])
def test_bad_diagnostics_keys_are_one_clear_line(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_config(DIGITS_CONFIG, [override])


def test_default_is_off_and_round_trips_through_toml():
    from fedlatent.config import from_dict, to_toml
    import tomllib
    config = load_config(DIGITS_CONFIG, ['diagnostics.which=["collapse", "tsne"]', "diagnostics.split=val"])
    assert load_config(DIGITS_CONFIG).diagnostics.which == []
    assert from_dict(tomllib.loads(to_toml(config))) == config


@pytest.mark.slow
def test_split_without_samples_and_class_out_of_range_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"diagnostics.split = 'val': .*data.val_fraction"):
        fedlatent.run(load_config(DIGITS_CONFIG, SHORT + ['diagnostics.which=["collapse"]', "diagnostics.split=val"]),
                      tmp_path / "a")
    with pytest.raises(ConfigError, match="diagnostics.tsne_class = 10"):
        fedlatent.run(load_config(DIGITS_CONFIG, SHORT + ['diagnostics.which=["tsne"]', "diagnostics.tsne_class=10"]),
                      tmp_path / "b")


def test_cli_rejects_a_bad_diagnostic_with_exit_2(capsys):
    from fedlatent.cli import main
    assert main(["run", str(DIGITS_CONFIG), "--set", 'diagnostics.which=["nope"]']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "diagnostics.which" in err[0]


@pytest.mark.slow
def test_report_over_runs_draws_their_diagnostics(pair, tmp_path):
    from fedlatent.experiment.studies.report import report
    plain, diag = pair
    names = {p.name for p in report([plain, diag], tmp_path / "report")}
    assert {"accuracy.png", "diag_spectrum.png", "diag_significant.png"} <= names


def test_run_labels_name_the_keys_that_differ_and_skip_those_a_run_lacks() -> None:
    """FedAvg has no β: the label says so by leaving β out, not by 'beta=None'."""
    from fedlatent.analysis.diagnostic_plots import RunRecords, label_runs
    data = {"partition": "dirichlet", "alpha": 0.05}
    runs = [RunRecords(Path("a"), [], {"algorithm": {"name": "fedavg"}, "data": data}, "fedavg"),
            RunRecords(Path("b"), [], {"algorithm": {"name": "feddecorr", "beta": 0.1}, "data": data}, "feddecorr")]
    label_runs(runs)
    assert [r.label for r in runs] == ["fedavg, dirichlet α=0.05", "feddecorr, dirichlet α=0.05, beta=0.1"]


def test_spectrum_plot_of_a_group_whose_first_run_has_no_spectrum(tmp_path):
    """A group's first run without a spectrum record (stopped before its diagnostics): the plot draws
    the other runs' spectra with their threshold instead of failing."""
    from fedlatent.analysis.diagnostic_plots import RunRecords, plot_spectrum

    spectrum = {"model": "global", "round": 3, "normalized_spectrum": [1.0, 0.5, 0.01], "threshold": 0.02}
    runs = [RunRecords(tmp_path / "a", [{"model": "global", "round": 1}], {}, "fedavg"),
            RunRecords(tmp_path / "b", [spectrum], {}, "fedavg")]
    path = plot_spectrum({"fedavg": runs}, tmp_path / "spectrum.png")
    assert path is not None and path.stat().st_size > 0
    assert plot_spectrum({"fedavg": runs[:1]}, tmp_path / "none.png") is None
