"""The features Flower used to refuse by a rule alone, through fedlatent's Flower apps on an
in-process grid (two nodes serving two clients each) against the simulation backend with the same
config and seed: sample-level DP-SGD (the privacy settings reach the ClientApp, the accountant is
the run driver's) and the step trace (each upload carries its client's trace, the server writes
``terms_trace.jsonl``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedlatent[flower]')")

import fedlatent  # noqa: E402
from fedlatent.backends import capabilities  # noqa: E402
from fedlatent.experiment.runner.trace import FILE  # noqa: E402
from tests.flower_procs import InProcessGrid  # noqa: E402
from tests.test_flower import assert_parity, config, max_diff, record_globals, run_both  # noqa: E402


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_flower_honours_what_was_only_a_rule() -> None:
    for key in ("privacy.sample_clip_norm", "diagnostics.trace_terms"):
        assert "flower" in capabilities.BY_KEY[key].honoured


def test_sample_level_dp_sgd_on_flower_equals_the_simulation_backend(tmp_path, monkeypatch) -> None:
    """Each client's per-sample gradients clipped and noised on its node as on the embedded backend
    (the noise drawn from the run's seed, round and client: a seeded run, which on Flower "auto" is
    not once noise is added): the same weights every round, and the same ε from the driver's
    accountant in every metrics line."""
    extra = ["privacy.sample_clip_norm=0.5", "privacy.sample_noise_multiplier=1.0", 'privacy.batch_sampling="poisson"',
             'privacy.randomness="seeded"']
    embedded, flower, embedded_rounds, flower_rounds = run_both(tmp_path, monkeypatch, extra, grid=InProcessGrid(2))
    assert_parity(embedded, flower, embedded_rounds, flower_rounds)
    ours, theirs = (_lines(tmp_path / name / "metrics.jsonl") for name in ("embedded", "flower"))
    assert [line["sample_level_epsilon"] for line in theirs] == [line["sample_level_epsilon"] for line in ours]
    assert all(line["sample_level_epsilon"] > 0 for line in ours)
    plain = record_globals(monkeypatch)  # the DP-SGD steps took part: without them the weights differ
    fedlatent.run(config("simulation"), tmp_path / "plain")
    assert max_diff(plain[-1], flower_rounds[-1]) > 1e-3


def test_the_step_trace_on_flower_equals_the_simulation_backend(tmp_path, monkeypatch) -> None:
    """Every step of every client's round, its task loss and unweighted terms, in the same lines."""
    extra = ['algorithm.name="feduv"', "diagnostics.trace_terms=true"]
    embedded, flower, embedded_rounds, flower_rounds = run_both(tmp_path, monkeypatch, extra, grid=InProcessGrid(2))
    assert_parity(embedded, flower, embedded_rounds, flower_rounds)
    ours, theirs = (_lines(tmp_path / name / FILE) for name in ("embedded", "flower"))
    assert len(ours) > 3 and [(x["round"], x["client"], x["step"]) for x in theirs] == \
        [(x["round"], x["client"], x["step"]) for x in ours]
    assert {"task", "uniformity", "variance"} <= set(ours[0])
    for mine, other in zip(ours, theirs):
        assert other.keys() == mine.keys()
        assert all(other[k] == pytest.approx(mine[k], rel=1e-5, abs=1e-6) for k in mine)
    assert config("flower", extra).diagnostics.trace_terms


@pytest.mark.parametrize("method", ["fedavg", "fedbabu", "ditto"])
def test_held_out_clients_on_flower_equal_the_simulation_backend(method, tmp_path, monkeypatch) -> None:
    """The nodes set the held-out clients apart as the embedded backend does (the census counts the
    clients that train; the held-out ones numbered after them), and the server's ``evaluate.new``
    message has the nodes that serve them evaluate them: the same weights every round, the same
    new-client scores in every round's line, and the same final rows under the program's rule."""
    extra = [f'algorithm.name="{method}"', "data.holdout_clients=1", "data.local_test_fraction=0.2"]
    embedded, flower, embedded_rounds, flower_rounds = run_both(tmp_path, monkeypatch, extra, grid=InProcessGrid(2))
    assert_parity(embedded, flower, embedded_rounds, flower_rounds)
    ours, theirs = (_lines(tmp_path / name / "metrics.jsonl") for name in ("embedded", "flower"))
    for mine, other in zip(ours, theirs):
        assert other["new_client_accuracy"] == pytest.approx(mine["new_client_accuracy"], abs=1e-9)
        assert other["new_client_loss"] == pytest.approx(mine["new_client_loss"], rel=1e-5)
    final_ours, final_theirs = embedded["final"], flower["final"]
    assert final_theirs["new_clients"] == final_ours["new_clients"] == [3]
    assert final_theirs["new_client_partition_ids"] == final_ours["new_client_partition_ids"]
    rows = final_ours.get("new_per_client", [])
    assert len(rows) == 1  # its rule: the global model (fedavg), fine-tuned (fedbabu), a personal model (ditto)
    for mine, other in zip(rows, final_theirs.get("new_per_client", [])):
        assert other["client"] == mine["client"] and other["accuracy"] == pytest.approx(mine["accuracy"], abs=1e-9)
    assert len(final_theirs.get("new_per_client", [])) == len(rows)


@pytest.mark.slow
def test_the_three_together_on_the_simulation_engine(tmp_path, monkeypatch) -> None:
    """The same on Flower's simulation engine (Ray), the three at once: held-out clients, the step
    trace and sample-level DP-SGD's per-sample clipping on Poisson batches give the simulation
    backend's weights, trace lines and new-client scores. (Without noise: under noise the step trace
    is a per-client release outside ε, refused; the noised DP-SGD's parity and ε are the test above.)"""
    extra = ["data.holdout_clients=1", "data.local_test_fraction=0.2", "diagnostics.trace_terms=true",
             "privacy.sample_clip_norm=0.5", 'privacy.batch_sampling="poisson"']
    embedded, flower, embedded_rounds, flower_rounds = run_both(tmp_path, monkeypatch, extra)
    assert_parity(embedded, flower, embedded_rounds, flower_rounds)
    ours, theirs = (_lines(tmp_path / name / "metrics.jsonl") for name in ("embedded", "flower"))
    assert [x["new_client_accuracy"] for x in theirs] == pytest.approx([x["new_client_accuracy"] for x in ours], abs=1e-9)
    steps = [(x["round"], x["client"], x["step"]) for x in _lines(tmp_path / "embedded" / FILE)]
    assert steps and steps == [(x["round"], x["client"], x["step"]) for x in _lines(tmp_path / "flower" / FILE)]
    assert flower["final"]["new_clients"] == embedded["final"]["new_clients"] == [3]
