"""What each backend honours is declared once (``fedlatent.backends.capabilities``): the table
rendered from it is what validation refuses, cell for cell, with one wording; the committed tables of
``docs/backends.md`` and ``docs/architecture.md`` are the rendered one; the study's stacked runs read the same declaration."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import fedlatent
from fedlatent.backends import capabilities
from fedlatent.errors import ConfigError
from fedlatent.experiment.runner import single
from fedlatent.experiment.runner.validation import validate
from fedlatent.federated import compiled

ROOT = Path(__file__).resolve().parents[1]
# the overrides that ask for each feature in a run that is otherwise valid on every backend
ASKING = {
    "privacy.sample_clip_norm": ["privacy.sample_clip_norm=1.0"],
    "data.holdout_clients": ["data.holdout_clients=2", "data.num_clients=10", "data.local_test_fraction=0.2"],
    "diagnostics.trace_terms": ["diagnostics.trace_terms=true"],
    "privacy.secure_aggregation": ['privacy.secure_aggregation="secaggplus"', "data.num_clients=4"],
    "train.compile": ["train.compile=true"],
    "train.client_state_memory": ['train.client_state_memory="64MiB"'],
}


def _rendered() -> dict[tuple[str, str], bool]:
    """(feature key, backend) → honoured, read off the rendered Markdown table."""
    rows = [line.strip("|").split("|") for line in capabilities.table().splitlines()[2:]]
    header = [c.strip().strip("`") for c in capabilities.table().splitlines()[0].strip("|").split("|")][2:]
    return {(cells[1].strip().strip("`"), b): cells[2 + i].strip() == "yes" for cells in rows for i, b in enumerate(header)}


def test_every_feature_asked_by_a_key_is_walked() -> None:
    assert set(ASKING) == {f.key for f in capabilities.FEATURES if f.asked is not None}
    assert {b for _, b in _rendered()} == set(capabilities.BACKENDS)


@pytest.mark.parametrize("key", sorted(ASKING))
@pytest.mark.parametrize("backend", capabilities.BACKENDS)
def test_the_rendered_table_is_what_validation_refuses(key: str, backend: str) -> None:
    if backend == "flower" and importlib.util.find_spec("flwr") is None:
        pytest.skip("Flower is not installed")
    if key == "train.compile" and compiled.refusal("cpu"):
        pytest.skip(compiled.refusal("cpu"))
    config = fedlatent.load_config(None, [f'backend="{backend}"', *ASKING[key]])
    feature = capabilities.BY_KEY[key]
    if _rendered()[key, backend]:
        validate(config)
        assert capabilities.refusals(config) == []
    else:
        with pytest.raises(ConfigError) as refused:
            validate(config)
        assert str(refused.value) == capabilities.refusal(feature, backend, feature.asked(config))
        assert str(refused.value).startswith(f"{key} = ") and f"only, not '{backend}' (" in str(refused.value)


def test_a_stack_of_runs_is_refused_where_the_table_says_so() -> None:
    for backend in capabilities.BACKENDS:
        config = fedlatent.load_config(None, [f'backend="{backend}"'])
        if _rendered()["stacked cells", backend]:
            assert single._backend_args(config, None, trainer=object())["trainer"] is not None
        else:
            with pytest.raises(ConfigError, match=r"^stacked cells \(a study's runs trained in one stack\): honoured"):
                single._backend_args(config, None, trainer=object())


@pytest.mark.parametrize("page", ["backends.md", "architecture.md"])
def test_the_committed_docs_table_is_the_rendered_one(page: str) -> None:
    spec = importlib.util.spec_from_file_location("backend_table", ROOT / "docs" / "scripts" / "backend_table.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert script.refresh(text) == text, f"stale table in docs/{page}: run .venv/bin/python docs/scripts/backend_table.py"
    assert capabilities.table() in text


def test_a_feature_must_give_a_reason_for_every_backend_it_does_not_honour() -> None:
    with pytest.raises(AssertionError, match="states no reason for \\['vectorized'\\]"):
        capabilities.Feature("x", "k", None, ("simulation", "auto", "flower"), {})
