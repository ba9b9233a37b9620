"""The papers' settings tables (``src/fedlatent/experiment/studies/settings/*.toml``): every cell of each
paper's specs and every shipped config of it holds the table's value for every key it sets, each key a
cell sets away from fedlatent's defaults is declared, no entry is stale, a wrong value is caught, and
configs/AUDIT.md's generated sections are up to date."""
from __future__ import annotations

from pathlib import Path

import pytest

from fedlatent.errors import ConfigError
from fedlatent.experiment.studies import settings

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
    assert settings.update_audit(text) == text, "run: python -m fedlatent.experiment.studies.settings"
    assert "| `train.lr` | setting: isic2019; method: fedavg | `0.0001` | ditto-mmd.txt:262 |" in text


def test_an_entry_can_name_the_spec_of_its_cells() -> None:
    table = settings.load("spherefed")
    k = next(e for e in table.entries if e.key == "data.num_clients" and e.where == {"spec": "spherefed_table6"})
    k.value = 10  # Table 6's K = 100: its cells share their method labels with Table 5's (K = 10)
    problems = settings.mismatches(table)
    assert len(problems) == 8 and all(p.startswith("spherefed_table6 ") for p in problems), "\n".join(problems)


def test_a_cell_without_an_axis_has_the_empty_label() -> None:
    entry = settings.Entry("model.stem", "imagenet_nopool", {"model": ["", "resnet50"]}, "x:1", "words")
    assert entry.matches({"setting": "tiny-a0.01"})  # a spec without a model axis, or a shipped config
    assert entry.matches({"setting": "tiny-a0.01", "model": "resnet50"})
    assert not entry.matches({"setting": "tiny-a0.01", "model": "small_cnn"})


def test_feduv_a_wrong_lambda_and_a_wrong_stem_are_reported() -> None:
    table = settings.load("feduv")
    lam = next(e for e in table.entries if e.key == "algorithm.lam" and e.value == 16.25)
    lam.value = 2.5  # Office-Home's C/4 is 65/4, not STL-10's 10/4
    stem = next(e for e in table.entries if e.key == "model.stem" and e.where.get("model") == "")
    stem.value = "cifar"  # the 3×3 stride-1 stem the paper's ResNets do not have (issue 30)
    problems = "\n".join(settings.mismatches(table))
    assert "configs/feduv/officehome.toml: algorithm.lam = 16.25, the table says 2.5" in problems
    assert "feduv_table2 setting-officehome-p0.25_method-feduv_seed-0: algorithm.lam = 16.25" in problems
    assert "configs/feduv/tinyimagenet_a1.toml: model.stem = imagenet_nopool, the table says cifar" in problems
    assert "feduv_supp_table5 setting-tiny-a0.01_model-small_cnn" not in problems  # no stem on the small CNN


def test_feddecorr_the_moon_head_and_the_server_momentum_are_checked() -> None:
    table = settings.load("feddecorr")
    head = next(e for e in table.entries if e.key == "model.projector_form")
    head.value = "fc_bn_relu"  # the FC-BN-ReLU head issue 30 found in place of the release's Linear-ReLU-Linear
    table.entries = [e for e in table.entries if e.key != "server.momentum_form"]
    problems = "\n".join(settings.mismatches(table))
    assert "feddecorr_table1 setting-cifar10-a0.05_method-moon_seed-0: model.projector_form = feddecorr_moon" in problems
    assert "feddecorr_table1 setting-cifar10-a0.05_method-fedavgm_seed-0: server.momentum_form = ema is set but not declared" in problems
    assert "feddecorr_table2 setting-tiny-a0.05_method-moon_seed-0: model.projector_form" not in problems


def test_audit_md_has_a_section_per_table() -> None:
    text = AUDIT.read_text(encoding="utf-8")
    for name in settings.names():
        assert f"<!-- settings:{name} -->" in text and f"<!-- /settings:{name} -->" in text
    assert "| `algorithm.lam` | setting: officehome, officehome-p0.25" in text
    assert "| `train.batch_size` | every cell | `128` | not stated |" in text
