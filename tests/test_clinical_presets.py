"""The Fed-ISIC2019 and RxRx1 presets: they load with the paper's settings, the Ditto + MK-MMD
(Fed-ISIC2019) and Ditto + MMD-D (RxRx1) ones run end to end on generated files in both layouts,
and a Fed-ISIC2019 preset trains to the same numbers on both embedded backends."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent import load_config
from fedlatent.data.federation import build_federation, counts_table
from fedlatent.experiment.studies.reproduce import load_spec
from fedlatent.federated.state import client_tensors
from tests.data.clinical_files import write_isic, write_rxrx1
from tests.models.test_weights import _published

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PRESET = {"fedavg": "fedavg", "ditto": "ditto", "cosine_alone": "ditto_cosine", "ditto_cosine": "ditto_cosine",
          "mkmmd_alone": "ditto_mkmmd", "ditto_mkmmd": "ditto_mkmmd", "mmdd_alone": "ditto_mmdd", "ditto_mmdd": "ditto_mmdd"}
# Ditto + MMD paper, Table 3 (ditto-mmd.txt:259-279): (λ, μ) per clinical task and method; λ = 0 alone
TABLE3 = {
    "fed_isic2019": {"ditto": (1.0, None), "cosine_alone": (0.0, 1.0), "mmdd_alone": (0.0, 1.0),
                     "mkmmd_alone": (0.0, 1.0), "ditto_cosine": (0.1, 0.1), "ditto_mmdd": (1.0, 1.0),
                     "ditto_mkmmd": (1.0, 0.1)},
    "rxrx1": {"ditto": (0.01, None), "cosine_alone": (0.0, 1.0), "mmdd_alone": (0.0, 0.01),
              "mkmmd_alone": (0.0, 0.01), "ditto_cosine": (0.01, 0.01), "ditto_mmdd": (0.01, 0.01),
              "ditto_mkmmd": (0.01, 0.1)},
}
METHODS = ["fedavg", "ditto", "cosine_alone", "ditto_cosine", "mkmmd_alone", "ditto_mkmmd", "mmdd_alone", "ditto_mmdd"]


@pytest.mark.parametrize("task", ["fed_isic2019", "rxrx1"])
@pytest.mark.parametrize("method", METHODS)
def test_presets_load_with_the_papers_settings(task: str, method: str) -> None:
    config = load_config(CONFIGS / task / f"{method}.toml")
    t = config.train
    assert (config.data.dataset, config.data.partition, t.optimizer, t.optimizer_state) == (task, "given", "adamw", "kept")
    if task == "fed_isic2019":
        lr = 1e-4 if method == "fedavg" else 1e-3  # Table 3: FedAvg 1e-4, every other method 1e-3
        assert (t.rounds, t.local_steps, t.batch_size, t.lr, config.model.arch) == (15, 100, 64, lr, "efficientnet_b0")
        assert (config.data.image_size, config.data.augment_policy) == (200, "flamby_isic")
    else:
        assert (t.rounds, t.local_epochs, t.local_steps, t.batch_size, t.lr, config.model.arch) == (
            10, 5, 0, 32, 1e-4, "resnet18_imagenet")
    algorithm = config.algorithm
    assert algorithm["name"] == PRESET[method]
    if method.endswith("_alone"):
        assert algorithm["lam"] == 0.0
    if "mkmmd" in method:
        every = (20, 64) if task == "fed_isic2019" else (1, 1)
        assert (algorithm["beta_every"], algorithm["beta_batches"]) == every
    if "mmdd" in method:
        assert (algorithm["kernel_every"], algorithm["kernel_batches"], algorithm["train_steps"]) == (1, 1, 25)
    assert t.weight_decay == 0.01  # AdamW "with default parameters" (appendix C)
    if method in TABLE3[task]:  # (λ, μ) of the paper's Table 3 per task and method
        lam, mu = TABLE3[task][method]
        assert (algorithm.get("lam"), algorithm.get("mu")) == (lam, mu)


# each clinical cell of the Ditto + MMD specs ↔ the per-method config it must agree with
SPEC_METHODS = {
    "ditto_table1": {"fedavg": "fedavg", "cosine": "cosine_alone", "mmdd": "mmdd_alone",
                     "mkmmd_every1": "mkmmd_alone", "mkmmd_every20": "mkmmd_alone"},
    "ditto_table2": {"fedavg": "fedavg", "ditto": "ditto", "ditto+cosine": "ditto_cosine", "ditto+mmdd": "ditto_mmdd",
                     "ditto+mkmmd_every1": "ditto_mkmmd", "ditto+mkmmd_every20": "ditto_mkmmd"},
}


@pytest.mark.parametrize("spec", sorted(SPEC_METHODS))
def test_spec_clinical_cells_carry_table_3_as_the_configs(spec: str) -> None:
    """The specs' Fed-ISIC2019 and RxRx1 cells run each method at its own Table 3 column (lr, λ, μ),
    the values of the per-method configs (not the fedavg file's or CIFAR-10's)."""
    tasks = {"isic2019": "fed_isic2019", "rxrx1": "rxrx1"}
    checked = 0
    for cell in load_spec(spec).cells:
        task = tasks.get(cell.labels["setting"])
        if task is None:
            continue
        config = load_config(CONFIGS / task / f"{SPEC_METHODS[spec][cell.labels['method']]}.toml")
        got, want = cell.config.algorithm, config.algorithm
        assert (cell.config.train.lr, got.get("lam"), got.get("mu")) == (config.train.lr, want.get("lam"), want.get("mu")), cell.name
        checked += 1
    assert checked == 2 * len(SPEC_METHODS[spec]) * 3  # two tasks × methods × 3 seeds


def _run(task: str, method: str, root: Path, out: Path, *extra: str) -> tuple[dict, object]:
    overrides = [f"data.root={root}", "data.image_size=16", "train.rounds=1", "train.batch_size=4", *extra]
    config = load_config(CONFIGS / task / f"{method}.toml", overrides)
    return fedlatent.run(config, out), config


@pytest.mark.slow
def test_isic_ditto_mkmmd_runs_on_generated_files(tmp_path: Path) -> None:
    rows = write_isic(tmp_path / "data", per_split=(4, 2))
    # weights in efficientnet-pytorch's layout with trained-like scales (random N(0, 1) convolutions
    # overflow the frozen global model's eval-mode forward in any implementation)
    weights = {k: v.abs() + 0.5 if k.endswith("running_var") else 0.05 * v for k, v in _published("efficientnet_b0").items()}
    torch.save(weights, tmp_path / "b0.pth")
    summary, config = _run("fed_isic2019", "ditto_mkmmd", tmp_path / "data", tmp_path / "run", "train.local_steps=2",
                           f"model.weights={tmp_path / 'b0.pth'}")
    federation = build_federation(config.data, config.data_seed)
    assert federation.augment.transform == "flamby_isic"  # trained with FLamby's augmentation
    counts = counts_table(federation).sum(axis=1)
    assert counts.tolist() == [sum(r["center"] == c and r["fold"] == "train" for r in rows) for c in range(6)]
    assert summary["headline"] == "balanced_accuracy"
    assert 0.0 <= summary["final"]["balanced_accuracy"] <= 1.0
    assert len(summary["final"]["per_client"]) == 6


@pytest.mark.long  # over a minute; test_isic_ditto_mkmmd_runs_on_generated_files is CI's clinical run
def test_rxrx1_ditto_mmdd_runs_on_generated_files(tmp_path: Path) -> None:
    rows = write_rxrx1(tmp_path / "data")
    summary, config = _run("rxrx1", "ditto_mmdd", tmp_path / "data", tmp_path / "run", "train.local_epochs=1",
                           "algorithm.train_steps=2")
    counts = counts_table(build_federation(config.data, config.data_seed)).sum(axis=1)
    cells = ["RPE", "HUVEC", "HEPG2", "U2OS"]
    assert counts.tolist() == [sum(r["cell_type"] == c and r["dataset"] == "train" and r["sirna_id"] < 50
                                   for r in rows) for c in cells]
    assert summary["headline"] == "accuracy" and "balanced_accuracy" in summary["final"]
    assert len(summary["final"]["per_client"]) == 4


@pytest.mark.slow  # the preset's AdamW (two minutes) --long; SGD's, every weight and kept state, in CI
@pytest.mark.parametrize("optimizer", [pytest.param([], marks=pytest.mark.long),
                                       ["train.optimizer=sgd", "train.lr=0.01", "train.momentum=0.9"]])
def test_isic_preset_on_vectorized_matches_simulation(tmp_path: Path, optimizer: list[str]) -> None:
    """The Fed-ISIC2019 Ditto + cosine preset (AdamW with its state kept across rounds, local steps,
    FLamby's augmentation, EfficientNet-B0's BatchNorm) trains in lockstep on the vectorized backend
    to the numbers of the simulation backend, round after round; with SGD instead, every weight and
    kept state to float rounding."""
    write_isic(tmp_path / "data", per_split=(4, 2))
    weights = {k: v.abs() + 0.5 if k.endswith("running_var") else 0.05 * v for k, v in _published("efficientnet_b0").items()}
    torch.save(weights, tmp_path / "b0.pth")
    lines, finals, states = {}, {}, {}
    for backend in ("simulation", "vectorized"):
        summary, _ = _run("fed_isic2019", "ditto_cosine", tmp_path / "data", tmp_path / backend, "train.rounds=2",
                          "train.local_steps=2", f"model.weights={tmp_path / 'b0.pth'}", f"backend={backend}", *optimizer)
        assert summary["backend"] == backend
        lines[backend] = [json.loads(line) for line in (tmp_path / backend / "metrics.jsonl").read_text().splitlines()]
        finals[backend] = summary["final"]
        folder = json.loads((tmp_path / backend / "checkpoints" / "latest.json").read_text())["folder"]
        states[backend] = client_tensors(tmp_path / backend / "checkpoints" / folder)
    for ref, got in zip(lines["simulation"], lines["vectorized"]):
        for key in ("train_loss", "personal_loss", "term_cosine"):
            assert got[key] == pytest.approx(ref[key], rel=1e-3, abs=1e-5), key
    assert finals["vectorized"]["balanced_accuracy"] == pytest.approx(finals["simulation"]["balanced_accuracy"], abs=1e-6)
    ref, got = states["simulation"], states["vectorized"]
    assert sorted(got) == sorted(ref) and any("optim." in k for k in ref)  # the kept optimiser states
    # Adam moves a weight by about ±lr whatever the size of its gradient, so where a gradient is at
    # rounding level (it cancels to ~0 in exact arithmetic) the two trainers' rounding may send it
    # either way: under AdamW a weight differs by at most lr per step (2 rounds × 2 steps of 1e-3)
    tolerance = 1e-5 if optimizer else 4e-3
    for k in ref:
        if optimizer or "optim." not in k:
            torch.testing.assert_close(got[k], ref[k], atol=tolerance, rtol=1e-4, msg=k)
