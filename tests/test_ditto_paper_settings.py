"""The Ditto+MMD configs and specs carry the paper's periodic-update size (s = 50 batches every 20
steps; 64 on Fed-ISIC2019; MMD-D every step for 25 steps on Fed-ISIC2019 and RxRx1) and say which
model output they train on (the paper's logits or the release's softmax)."""
from __future__ import annotations

from pathlib import Path

import pytest

import fedlatent
from fedlatent.experiment.studies.reproduce import load_spec
from fedlatent.methods import resolved_keys

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs" / "ditto").glob("*.toml"))


def _window(algorithm: dict) -> tuple[int, int] | None:
    """(every, batches) of a periodic β or kernel update, None for methods without one."""
    if algorithm.get("name") in ("ditto_mkmmd", "mkmmd"):
        return algorithm["beta_every"], algorithm["beta_batches"]
    if algorithm.get("name") in ("ditto_mmdd", "mmdd"):
        return algorithm["kernel_every"], algorithm["kernel_batches"]
    return None


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_each_config_uses_s_50_and_names_its_model_output(path: Path) -> None:
    config = fedlatent.load_config(path)
    window = _window(resolved_keys(config.algorithm))
    if window is not None and window[0] == 20:
        assert window[1] == 50
    text = path.read_text()
    assert "# Model output:" in text
    assert config.model.softmax_output == path.name.startswith("release_")
    said = text.split("# Model output:")[1].split("\n")[0]
    assert ("softmax" if config.model.softmax_output else "logits") in said


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
