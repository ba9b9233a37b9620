"""The papers' settings tables (``src/fedlatent/experiment/settings/*.toml``): every cell of each
paper's specs and every shipped config of it holds the table's value for every key it sets, each key a
cell sets away from fedlatent's defaults is declared, no entry is stale, a wrong value is caught, and
configs/AUDIT.md's generated sections are up to date."""
from __future__ import annotations

from pathlib import Path

import pytest

from fedlatent.errors import ConfigError
from fedlatent.experiment import settings

AUDIT = Path(__file__).resolve().parents[1] / "configs" / "AUDIT.md"


@pytest.mark.parametrize("name", settings.names())
def test_every_cell_and_config_holds_the_tables_values(name: str) -> None:
    problems = settings.mismatches(settings.load(name))
    assert not problems, "\n".join(problems[:20])


def test_a_wrong_value_an_undeclared_key_and_a_stale_entry_are_reported() -> None:
    table = settings.load("ditto_mmd")
    lr = next(e for e in table.entries if e.key == "train.lr" and e.where == {"setting": "isic2019", "method": "fedavg"})
    lr.value = 0.001  # the value the Fed-ISIC2019 FedAvg cells had before issue 30
    table.entries = [e for e in table.entries if e.key != "model.hidden"]
    table.entries.append(settings.Entry("train.lr", 0.1, {"setting": "nowhere"}, "x:1", "words"))
    problems = "\n".join(settings.mismatches(table))
    assert "ditto_table1 setting-isic2019_method-fedavg_seed-2021: train.lr = 0.0001, the table says 0.001" in problems
    assert "configs/fed_isic2019/fedavg.toml: train.lr = 0.0001" in problems
    assert "model.hidden = [20] is set but not declared" in problems
    assert "applies to no cell" in problems


def test_entries_need_their_source_or_their_reason() -> None:
    with pytest.raises(ConfigError, match="source"):
        settings._entry({"key": "train.lr", "value": 0.1}, "t")
    with pytest.raises(ConfigError, match="choice and why"):
        settings._entry({"key": "train.lr", "value": 0.1, "stated": False, "choice": "c"}, "t")
    with pytest.raises(ConfigError, match="takes only"):
        settings._entry({"key": "train.lr", "value": 0.1, "source": "s", "says": "w", "note": "?"}, "t")


def test_audit_md_sections_are_generated_from_the_tables() -> None:
    text = AUDIT.read_text(encoding="utf-8")
    assert settings.update_audit(text) == text, "run: python -m fedlatent.experiment.settings"
    assert "| `train.lr` | setting: isic2019; method: fedavg | `0.0001` | ditto-mmd.txt:262 |" in text
