"""A SuperNode's own terms (backends.flower.node_terms, from its --node-config): a node pinned to
secure aggregation refuses a run with clear uploads and a train message without a SecAgg+ session;
a node's DP terms refuse a larger clip norm or a smaller σ; a node that does not answer t-SNE or
the client diagnostics refuses those queries, even when the run did not declare them (a dishonest
ServerApp). A refusal is a logged error reply naming the term, which the ServerApp turns into a
ConfigError (exit 2) with no run folder left; a run within the terms runs."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedlatent[flower]')")

from flwr.app import ConfigRecord, Context, Message, RecordDict  # noqa: E402

from fedlatent.backends.flower import client_app, node_terms  # noqa: E402
from fedlatent.backends.flower.node_terms import NodeTerms, terms_of  # noqa: E402
from fedlatent.config import to_toml  # noqa: E402
from fedlatent.errors import ConfigError  # noqa: E402
from fedlatent.experiment import run as run_experiment  # noqa: E402
from tests.flower_procs import InProcessGrid  # noqa: E402
from tests.private_runs import small_config  # noqa: E402

FLOWER = ['backend="flower"', "flower.supernodes=2", "flower.cpus=2", "train.rounds=1"]
DP = ["privacy.clip_norm=0.5", "privacy.noise_multiplier=0.8"]


def test_the_node_config_states_the_terms() -> None:
    """Flower's node-config values (bools, numbers, or their text) read as terms; absent: none."""
    assert terms_of({}) == NodeTerms()
    terms = terms_of({"require-secagg": "true", "max-clip-norm": 1, "min-noise-multiplier": "0.5",
                      "answer-tsne": False, "answer-diagnostics": "false"})
    assert terms.require_secagg and terms.max_clip_norm == 1.0 and terms.min_noise_multiplier == 0.5
    assert terms.answers == {"census"}
    assert terms_of({"partition-id": 0}).max_clip_norm == math.inf


CASES = {  # node terms, run settings, the term the refusal names
    "secagg": ({"require-secagg": True}, [], "require-secagg = true"),
    "clip": ({"max-clip-norm": 0.1}, DP, "max-clip-norm = 0.1"),
    "no clip": ({"max-clip-norm": 1.0}, [], "max-clip-norm = 1"),
    "sigma": ({"min-noise-multiplier": 2.0}, DP, "min-noise-multiplier = 2"),
    "tsne": ({"answer-tsne": False}, ['diagnostics.which=["tsne"]'], "answer-tsne = false"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_asking_less_than_a_nodes_terms_is_refused_naming_the_term(case: str, tmp_path: Path) -> None:
    """Node 2 states the term; the run breaks it: the ServerApp stops with a ConfigError (exit 2 on the
    CLI) naming the node and the term, at the census, and leaves no run folder."""
    terms, settings, named = CASES[case]
    grid = InProcessGrid(2, node_config={2: terms})
    with pytest.raises(ConfigError, match=f"SuperNode 2 refuses the run: node terms: {named}"):
        run_experiment(small_config(*FLOWER, *settings), tmp_path / "run", echo=None, grid=grid)
    assert not (tmp_path / "run").exists()


def _message(message_type: str, config_settings: list[str], records: dict | None = None) -> Message:
    InProcessGrid(1)  # Flower's task identity, as its engines set it
    toml = to_toml(small_config(*FLOWER, *config_settings))
    return Message(RecordDict({"run": ConfigRecord({"config": toml}), **(records or {})}), dst_node_id=1,
                   message_type=message_type)


def _context(node_config: dict) -> Context:
    return Context(run_id=1, node_id=1, state=RecordDict(), run_config={},
                   node_config={"partition-id": 0, "num-partitions": 1, **node_config})


@pytest.mark.parametrize("message_type,node_config,settings,named", [
    # the run declared SecAgg+, but the ServerApp sends a train message without a session: a clear upload
    ("train", {"require-secagg": True}, ['privacy.secure_aggregation="secaggplus"'], "without a SecAgg+ session"),
    # the run declared no t-SNE, but the ServerApp asks for the clients' features anyway
    ("query.tsne", {"answer-tsne": False}, [], "answer-tsne = false"),
    ("query.diagnostics", {"answer-diagnostics": False}, [], "answer-diagnostics = false"),
    ("query.census", {"answer-census": False}, [], "answer-census = false"),
])
def test_a_message_asking_less_than_the_terms_gets_a_logged_error_reply(
        message_type: str, node_config: dict, settings: list[str], named: str, caplog) -> None:
    """The ClientApp itself, sent a message a dishonest ServerApp could send: an error reply (code
    REFUSED) whose reason names the term, the same line in the node's log, and nothing computed."""
    reply = client_app.app(_message(message_type, settings), _context(node_config))
    assert reply.has_error() and not reply.has_content()
    assert reply.error.code == node_terms.REFUSED and named in reply.error.reason
    assert any(named in record.getMessage() for record in caplog.records)


def test_a_run_within_a_nodes_terms_runs(tmp_path: Path) -> None:
    """C = 0.5 ≤ max-clip-norm = 1, σ = 0.8 ≥ min-noise-multiplier = 0.5, no t-SNE asked of a node
    that does not answer it: the run completes."""
    grid = InProcessGrid(2, node_config={1: {"max-clip-norm": 1.0, "min-noise-multiplier": 0.5, "answer-tsne": False},
                                         2: {"max-clip-norm": 1.0}})
    summary = run_experiment(small_config(*FLOWER, *DP), tmp_path / "run", echo=None, grid=grid)
    assert summary["status"] == "completed"
