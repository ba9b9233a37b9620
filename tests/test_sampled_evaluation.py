"""Evaluation on a seeded sample of clients (``eval.clients``, ``eval.final_clients``): the sample's
mean is unbiased for the full evaluation's (over seeds), its standard error covers the full value at
the stated rate, the standard errors are Cochran's formulas computed by hand in float64, sampling the
evaluation changes no training number, the refusals (exit 2, one line, no run folder) and, at the
defaults, the run folders of the code before to the byte."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

import fedlatent
from fedlatent.backends import simulation
from fedlatent.cli import main
from fedlatent.data.federation import build_federation
from fedlatent.experiment.runner import single
from fedlatent.federated import driver, sampled
from fedlatent.methods import resolve
from tests.code_before import checkpoint_digests, runs_before_and_now

BEFORE = "a32049f"  # main before eval.clients


def synthetic(clients: int, *extra: str):
    """Synthetic(0.5, 0.5) clients of 50 samples (8 validation, 10 test each), a 60 → 20 MLP."""
    return fedlatent.load_config(None, [
        "seed=1", 'data.dataset="synthetic"', 'data.partition="given"', f"data.num_clients={clients}",
        "data.samples_per_client=50", "data.synthetic_alpha=0.5", "data.synthetic_beta=0.5", "model.hidden=[20]",
        "train.rounds=1", "train.batch_size=10", "train.lr=0.05", "train.threads=1", 'backend="simulation"', *extra])


@pytest.fixture(scope="module")
def trained():
    """A run's set-up over 200 clients after one round (a model whose accuracy varies over clients)."""
    config = synthetic(200, "train.participation=0.2")
    s = simulation.setup(config, build_federation(config.data, config.data_seed), resolve(config.algorithm, []))
    simulation.run_round(s, 0)
    return s


# the draw and the formulas -------------------------------------------------------------------------------------

def test_the_draw_is_seeded_distinct_and_covers_the_population_only_when_asked() -> None:
    assert sampled.draw(10, 10, 0, 1) is None and sampled.draw(10, 12, 0, 1) is None
    a = sampled.draw(1000, 50, 3, 40, 0)
    assert a == sampled.draw(1000, 50, 3, 40, 0) and a != sampled.draw(1000, 50, 3, 40, 1)
    assert a == sorted(set(a)) and len(a) == 50 and 0 <= a[0] and a[-1] < 1000
    assert sampled.round_size("auto", 999) == 999 and sampled.round_size("auto", 10 ** 5) == sampled.BOUND
    assert sampled.round_size(30, 100) == 30


def test_the_standard_errors_are_cochrans_formulas_by_hand() -> None:
    rng = np.random.default_rng(0)
    values = rng.uniform(size=12).tolist()
    n, big_n = 12, 40
    mean = sum(values) / n
    s2 = sum((v - mean) ** 2 for v in values) / (n - 1)
    assert math.isclose(sampled.mean_se(values, big_n), math.sqrt((1 - n / big_n) * s2 / n), rel_tol=1e-12)
    assert sampled.mean_se(values, n) == 0.0  # a census has no sampling error
    correct, counts = [3, 5, 0, 7, 2], [10, 8, 4, 9, 10]
    r = sum(correct) / sum(counts)
    resid = sum((c - r * m) ** 2 for c, m in zip(correct, counts)) / 4
    by_hand = math.sqrt((1 - 5 / 30) * resid / (5 * (sum(counts) / 5) ** 2))
    assert math.isclose(sampled.ratio_se(correct, counts, 30), by_hand, rel_tol=1e-12)


# unbiased, and covered at the stated rate -----------------------------------------------------------------------

def test_the_sampled_mean_is_unbiased_and_its_se_covers_the_full_value(trained) -> None:
    s, k, seeds = trained, 50, 400  # 50 clients: where the normal interval's rate holds for these skewed values
    whole = driver.evaluate_global(s)
    full, test_accuracy = whole["val_accuracy"], whole["test_accuracy"]
    estimates, covered, ses, tests, tests_covered = [], 0, [], [], 0
    for seed in range(seeds):
        config = dataclasses.replace(s.config, seed=seed, eval=dataclasses.replace(s.config.eval, clients=k))
        line = driver.evaluate_global(s, clients=sampled.round_clients(config, 0, 200))
        assert line["val_clients"] == k
        tests.append(line["test_accuracy"])  # the global test split is the clients' together: sampled with them
        tests_covered += abs(line["test_accuracy"] - test_accuracy) <= 1.959964 * line["test_accuracy_se"]
        estimates.append(line["val_accuracy"])
        ses.append(line["val_accuracy_se"])
        covered += abs(line["val_accuracy"] - full) <= 1.959964 * line["val_accuracy_se"]
    spread = float(np.std(estimates, ddof=1))
    assert spread > 0  # the samples differ
    assert abs(float(np.mean(estimates)) - full) < 4 * spread / math.sqrt(seeds)  # unbiased over seeds
    assert 0.5 < float(np.mean(ses)) / spread < 1.5  # the reported SE is the estimates' own spread
    assert 0.89 <= covered / seeds <= 0.995  # 95 % intervals cover the full value at about that rate
    assert abs(float(np.mean(tests)) - test_accuracy) < 4 * float(np.std(tests, ddof=1)) / math.sqrt(seeds)
    assert 0.89 <= tests_covered / seeds <= 0.995  # the ratio estimator's interval likewise


def test_held_out_clients_sampled_are_a_ratio_estimate_with_its_se(tmp_path: Path) -> None:
    config = synthetic(160, "train.participation=0.25", "data.holdout_clients=120", "eval.personalized='never'")
    s = simulation.setup(config, *single.prepare(config))
    simulation.run_round(s, 0)
    full = driver.evaluate_new(s, s.server.global_state, personal=False)["new_client_accuracy"]
    estimates, covered = [], 0
    for seed in range(300):
        cfg = dataclasses.replace(config, seed=seed, eval=dataclasses.replace(config.eval, clients=40))
        s.config = cfg
        out = driver.evaluate_new(s, s.server.global_state, personal=False, rnd=0)
        assert out["new_client_sampled"] == 40 and len(out["new_clients"]) == 40
        estimates.append(out["new_client_accuracy"])
        covered += abs(out["new_client_accuracy"] - full) <= 1.959964 * out["new_client_accuracy_se"]
    s.config = config
    assert abs(float(np.mean(estimates)) - full) < 4 * float(np.std(estimates)) / math.sqrt(300)
    assert 0.88 <= covered / 300 <= 0.995


# in a run ------------------------------------------------------------------------------------------------------

def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_sampled_evaluation_changes_no_training_number_and_the_final_is_every_clients(tmp_path: Path) -> None:
    config = synthetic(30, "train.rounds=2", "train.participation=0.2")
    full = single.run(config, tmp_path / "full", echo=None, figures=False)
    part = single.run(dataclasses.replace(config, eval=dataclasses.replace(config.eval, clients=7)),
                      tmp_path / "part", echo=None, figures=False)
    for a, b in zip(_lines(tmp_path / "full"), _lines(tmp_path / "part")):
        assert a["train_loss"] == b["train_loss"] and "test_accuracy_se" in b and "test_accuracy_se" not in a
        assert b["val_clients"] == 7 and "val_clients" not in a and b["val_accuracy_se"] >= 0
    assert full["final"] == part["final"]  # the final evaluation takes every client either way
    asked = single.run(dataclasses.replace(config, eval=dataclasses.replace(config.eval, final_clients=9)),
                       tmp_path / "final9", echo=None, figures=False)["final"]
    assert asked["val_clients"] == 9 and len(asked["per_client"]) == 9
    assert asked["accuracy_se"] >= 0 and "accuracy_se" not in full["final"]  # the clients' test splits sampled
    assert asked["personalized_accuracy_se"] >= 0 and "personalized_accuracy_se" not in full["final"]


def test_a_final_sample_of_held_out_clients_names_their_partition_ids(tmp_path: Path) -> None:
    """``final.new_client_partition_ids`` under ``eval.final_clients``: the sampled held-out clients' own
    partition ids (the build's draw over the whole partition, then the sample's positions in it)."""
    config = synthetic(40, "data.holdout_clients=20", "eval.final_clients=5", "eval.personalized='never'")
    final = single.run(config, tmp_path / "run", echo=None, figures=False)["final"]
    fed, _ = single.prepare(config)
    which = sampled.final_clients(config, 20, held_out=True)
    assert which is not None and len(which) == 5
    assert final["new_clients"] == [20 + i for i in which]
    assert final["new_client_partition_ids"] == [fed.held_out[i] for i in which]


@pytest.mark.parametrize("key, value, message", [
    ("eval.clients", "0", "eval.clients = 0: must be >= 1"),
    ("eval.clients", "31", "eval.clients = 31: above the 30 clients that train"),
    ("eval.final_clients", "0", "eval.final_clients = 0: must be >= 1"),
    ("eval.final_clients", "41", "eval.final_clients = 41: above the 30 clients"),
    ("eval.clients", "'some'", "eval.clients = 'some': expected an integer"),
])
def test_bad_sample_sizes_exit_2_with_one_line_and_no_run_folder(key, value, message, tmp_path: Path,
                                                                   capsys) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[data]\ndataset = "synthetic"\npartition = "given"\nnum_clients = 30\n'
                      'samples_per_client = 50\n[train]\nrounds = 1\n')
    out = tmp_path / "run"
    assert main(["run", str(config), "--set", f"{key}={value}", "--no-progress", "--no-figures",
                 "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedlatent: error:") and message in lines[0], lines
    assert not out.exists()


# the defaults: today's numbers ----------------------------------------------------------------------------------

SCRIPT = """
import sys
from pathlib import Path
import torch
import fedlatent
from fedlatent.experiment.runner import single
torch.set_num_threads(1)
out = Path(sys.argv[1])
digits = ["seed=4", 'data.dataset="digits"', 'data.partition="dirichlet"', "data.alpha=0.5", "data.num_clients=5",
          "data.val_fraction=0.1", "data.local_test_fraction=0.2", "model.hidden=[16]", "train.rounds=2",
          "train.batch_size=16", "train.threads=1", "train.participation=0.6"]
synthetic = ["seed=2", 'data.dataset="synthetic"', 'data.partition="given"', "data.num_clients=6",
             "data.samples_per_client=60", "model.hidden=[20]", "train.rounds=2", "train.batch_size=10",
             "train.threads=1", "data.holdout_clients=2"]
for name, base in (("fedavg-digits", digits), ("ditto-synthetic", synthetic), ("scaffold-digits", digits)):
    for backend in ("simulation", "vectorized"):
        config = fedlatent.load_config(None, [*base, f'algorithm.name="{name.split("-")[0]}"', f'backend="{backend}"'])
        single.run(config, out / f"{name}-{backend}", echo=None, figures=False)
"""


def _folder(run_dir: Path) -> tuple[list[dict], dict, str, str]:
    """A run's metrics lines and final evaluation without clocks, its checkpoint digests, config and partition."""
    lines = [{k: v for k, v in json.loads(line).items() if not k.startswith("time_")}
             for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = {k: v for k, v in json.loads((run_dir / "summary.json").read_text())["final"].items() if "seconds" not in k}
    return lines, {"final": final, **checkpoint_digests(run_dir)}, \
        (run_dir / "config.toml").read_text(), (run_dir / "partition.json").read_text()


@pytest.mark.slow
def test_the_defaults_give_the_run_folders_of_the_code_before(tmp_path: Path) -> None:
    old_runs, new_runs = runs_before_and_now(BEFORE, SCRIPT, tmp_path)
    names = sorted(p.name for p in old_runs.iterdir())
    assert len(names) == 6
    for name in names:
        assert _folder(new_runs / name) == _folder(old_runs / name), name


def test_the_sampled_clients_evaluated_together_score_as_each_alone(trained) -> None:
    s = trained
    clients = sampled.draw(200, 30, 5, 40, 0)
    assert clients is not None
    together = s.validation(s.server.global_state, clients)
    alone = {cid: simulation.client_validation(s.model, s.server.global_state, s.federation.clients[cid].val,
                                               s.federation.num_classes, 500, s.device) for cid in clients}
    assert together == alone  # the same correct counts over the same sizes
