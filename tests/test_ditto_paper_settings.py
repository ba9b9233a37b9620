"""The Ditto+MMD configs and specs carry the paper's periodic-update size (s = 50 batches every 20
steps; 64 on Fed-ISIC2019, ditto-mmd.txt:303; MMD-D every step for 25 steps on Fed-ISIC2019 and RxRx1)
and train on the output of the release's model for their data set (a softmax on Synthetic, logits on
CIFAR-10, Fed-ISIC2019 and RxRx1), saying so."""
from __future__ import annotations

from pathlib import Path

import pytest

import fedlatent
from fedlatent.experiment.studies import settings
from fedlatent.experiment.studies.reproduce import load_spec
from fedlatent.methods import resolved_keys

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs" / "ditto").glob("*.toml"))
CLINICAL = sorted([*(ROOT / "configs" / "fed_isic2019").glob("*.toml"), *(ROOT / "configs" / "rxrx1").glob("*.toml")])


def _window(algorithm: dict) -> tuple[int, int] | None:
    """(every, batches) of a periodic β or kernel update, None for methods without one."""
    if algorithm.get("name") in ("ditto_mkmmd", "mkmmd"):
        return algorithm["beta_every"], algorithm["beta_batches"]
    if algorithm.get("name") in ("ditto_mmdd", "mmdd"):
        return algorithm["kernel_every"], algorithm["kernel_batches"]
    return None


# The release's model per data set (VectorInstitute/FL4Health research/): True where it ends in a softmax.
RELEASE_SOFTMAX = {"synthetic00": True, "synthetic05": True, "cifar10-a0.1": False, "cifar10-a0.5": False,
                   "cifar10-a5": False, "isic2019": False, "rxrx1": False}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_each_config_uses_s_50_and_names_its_model_output(path: Path) -> None:
    config = fedlatent.load_config(path)
    window = _window(resolved_keys(config.algorithm))
    if window is not None and window[0] == 20:
        assert window[1] == 50
    text = path.read_text()
    assert "# Model output:" in text
    assert config.model.softmax_output is True  # every configs/ditto file is Synthetic: the release's softmax
    said = text.split("# Model output:")[1].split("\n")[0]
    assert "softmax" in said and "logits" not in said
    assert not fedlatent.load_config(path, ["model.softmax_output=false"]).model.softmax_output


@pytest.mark.parametrize("path", CLINICAL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_clinical_configs_train_on_the_logits_of_the_releases_model(path: Path) -> None:
    line = next(x for x in path.read_text().splitlines() if x.startswith("softmax_output"))
    assert fedlatent.load_config(path).model.softmax_output is False
    assert "logits" in line and ("model.py:" in line or "client.py:" in line)
    assert fedlatent.load_config(path, ["model.softmax_output=true"]).model.softmax_output


@pytest.mark.parametrize(("spec", "tier"), [(s, t) for s in ("ditto_table1", "ditto_table2") for t in ("full", "quick", "cpu")]
                         + [("ditto_figure3", "full"), ("ditto_figure3", "quick")])
def test_every_cell_trains_on_its_settings_release_output(spec: str, tier: str) -> None:
    cells = load_spec(spec, tier=tier).cells
    assert cells
    for cell in cells:
        assert cell.config.model.softmax_output is RELEASE_SOFTMAX[cell.labels["setting"]], cell.name


def test_the_settings_table_cites_the_release_model_of_each_setting() -> None:
    entries = [e for e in settings.load("ditto_mmd").entries if e.key == "model.softmax_output"]
    table = {}
    for e in entries:
        for label in e.where["setting"] if isinstance(e.where["setting"], list) else [e.where["setting"]]:
            table[label] = e
    assert {label: e.value for label, e in table.items()} == RELEASE_SOFTMAX
    for label, e in table.items():
        cited = f"{e.source} {e.says} {e.why}"
        assert "FL4Health research/" in cited and ".py:" in cited, label


def test_s_is_cited_to_the_papers_line() -> None:
    entries = [e for e in settings.load("ditto_mmd").entries if e.key in ("algorithm.beta_batches", "algorithm.kernel_batches")
               and e.value in (50, 64)]
    assert len(entries) == 3 and all(e.stated and e.source == "ditto-mmd.txt:303" for e in entries)
    assert {e.value for e in entries if e.where.get("setting") == "isic2019"} == {64}


@pytest.mark.parametrize("spec", ["ditto_table1", "ditto_table2"])
def test_specs_use_the_papers_update_sizes(spec: str) -> None:
    study = load_spec(spec)
    seen = set()
    for cell in study.cells:
        window = _window(resolved_keys(cell.config.algorithm))
        if window is None or (window[0] == 1 and cell.config.algorithm["name"] == "ditto_mkmmd"):  # every1
            continue
        setting = cell.labels["setting"]
        if cell.config.algorithm["name"] == "ditto_mmdd" and setting in ("isic2019", "rxrx1"):
            assert window == (1, 1) and resolved_keys(cell.config.algorithm)["train_steps"] == 25
        else:
            assert window == (20, 64 if setting == "isic2019" else 50)
        seen.add((cell.config.algorithm["name"], setting))
    assert len(seen) == 2 * 7
    assert "softmax" in study.paper
