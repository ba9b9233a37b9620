"""``diagnostics.trace_terms``: one line per client step with the task loss and each loss term;
bit-identical training with it on and off, lines that average to the metrics' per-client values,
Ditto's personal step, an exact resume (Flower: tests/test_flower_capabilities.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import fedlatent
from fedlatent import load_config
from fedlatent.data.federation import build_federation
from fedlatent.federated.state import Checkpoints
from fedlatent.federated.trainer.schedule import batches

DIGITS_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"
SHORT = ["train.rounds=3", "train.participation=0.5", "data.num_clients=6", "backend=simulation",
         'algorithm.name="fedprox"', "algorithm.mu=0.01", 'terms=[{name="decorrelation", beta=0.1}]']
TRACE = ["diagnostics.trace_terms=true"]


pytestmark = pytest.mark.usefixtures("no_figures")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    folder = json.loads((out / "checkpoints" / "latest.json").read_text())["folder"]
    return load_file(str(out / "checkpoints" / folder / "global.safetensors"))


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in rows]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("trace")
    fedlatent.run(load_config(DIGITS_CONFIG, SHORT), root / "plain")
    fedlatent.run(load_config(DIGITS_CONFIG, SHORT + TRACE), root / "traced")
    return root / "plain", root / "traced"


def test_the_trace_changes_no_training_number(pair) -> None:
    plain, traced = pair
    a, b = _weights(plain), _weights(traced)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _untimed(_lines(plain / "metrics.jsonl")) == _untimed(_lines(traced / "metrics.jsonl"))
    assert not (plain / "terms_trace.jsonl").exists()


def test_one_line_per_client_step_averaging_to_the_metrics(pair) -> None:
    _, traced = pair
    steps = _lines(traced / "terms_trace.jsonl")
    assert set(steps[0]) == {"round", "client", "step", "task", "prox", "decorrelation"}
    for line in _lines(traced / "metrics.jsonl"):
        rnd = line["round"]
        per_client = {c: [s for s in steps if s["round"] == rnd and s["client"] == c] for c in line["clients"]}
        for c, loss in zip(line["clients"], line["client_train_loss"]):
            rows = per_client[c]
            assert [s["step"] for s in rows] == list(range(1, len(rows) + 1))
            assert sum(s["task"] for s in rows) / len(rows) == pytest.approx(loss, rel=1e-5)
        for term in ("prox", "decorrelation"):
            means = [sum(s[term] for s in rows) / len(rows) for rows in per_client.values()]
            assert sum(means) / len(means) == pytest.approx(line[f"term_{term}"], rel=1e-5, abs=1e-9)
        assert {s["client"] for s in steps if s["round"] == rnd} == set(line["clients"])


def test_resume_continues_the_trace_exactly(pair, tmp_path, monkeypatch) -> None:
    _, reference = pair
    real_save = Checkpoints.save

    def crash_before_round_3_is_saved(self, **kw):  # round 3's steps are written, its checkpoint not
        if kw["info"]["round"] == 3:
            raise KeyboardInterrupt
        return real_save(self, **kw)

    monkeypatch.setattr(Checkpoints, "save", crash_before_round_3_is_saved)
    out = tmp_path / "crashed"
    with pytest.raises(KeyboardInterrupt):
        fedlatent.run(load_config(DIGITS_CONFIG, SHORT + TRACE), out)
    assert max(s["round"] for s in _lines(out / "terms_trace.jsonl")) == 3
    monkeypatch.undo()
    fedlatent.run(load_config(DIGITS_CONFIG, SHORT + TRACE), out, resume=True)
    assert _lines(out / "terms_trace.jsonl") == _lines(reference / "terms_trace.jsonl")


def test_ditto_records_its_personal_step(tmp_path) -> None:
    config = load_config(DIGITS_CONFIG, ["train.rounds=1", "data.num_clients=3", "data.local_test_fraction=0.2",
                                         'algorithm.name="ditto_cosine"', "algorithm.mu=0.5"] + TRACE)
    fedlatent.run(config, tmp_path / "ditto")
    steps = _lines(tmp_path / "ditto" / "terms_trace.jsonl")
    assert set(steps[0]) == {"round", "client", "step", "task", "personal_task", "personal_cosine"}


@pytest.mark.parametrize("method", [["algorithm.name=moon"], ["algorithm.name=ditto_cosine", "algorithm.mu=0.5"]])
def test_vectorized_traces_what_simulation_traces(tmp_path, method: list[str]) -> None:
    """The same trace lines (keys, clients, steps; values to float rounding) from both embedded
    backends: MOON's term is absent for a client's first round on both."""
    traces = {}
    for backend in ("simulation", "vectorized"):
        config = load_config(DIGITS_CONFIG, [*SHORT[:3], *method, f"backend={backend}", *TRACE])
        fedlatent.run(config, tmp_path / backend)
        traces[backend] = _lines(tmp_path / backend / "terms_trace.jsonl")
    ref, got = traces["simulation"], traces["vectorized"]
    assert [sorted(r) for r in got] == [sorted(r) for r in ref] and len(ref) > 10
    key = lambda r: (r["round"], r["client"], r["step"])  # noqa: E731
    for a, b in zip(sorted(got, key=key), sorted(ref, key=key)):
        assert key(a) == key(b)
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)


def test_fedrep_traces_both_phases(tmp_path) -> None:
    """The client's own layers' steps (the head phase) come first, then the shared layers' steps."""
    config = load_config(DIGITS_CONFIG, ["train.rounds=1", "data.num_clients=2", "data.local_test_fraction=0.2",
                                         'algorithm.name="fedrep"', "algorithm.head_epochs=1"] + TRACE)
    fedlatent.run(config, tmp_path / "fedrep")
    steps = [s for s in _lines(tmp_path / "fedrep" / "terms_trace.jsonl") if s["client"] == 0]
    n = len(build_federation(config.data, config.data_seed).clients[0].train)
    per_epoch = len(batches(n, config.train.batch_size, config.train.drop_last, torch.Generator()))
    assert [s["step"] for s in steps] == list(range(1, 2 * per_epoch + 1))
