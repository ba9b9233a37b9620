"""``backend = "auto"``: which backend it picks and why, the choice logged and recorded, and a resumed
run continuing on the backend it started with whatever ``auto`` would pick at resume time."""
from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

import fedlatent
from fedlatent.backends import auto
from fedlatent.config import to_toml
from fedlatent.data.federation import build_federation
from fedlatent.errors import ConfigError
from fedlatent.experiment.runner import single
from fedlatent.federated.round import clients_per_round
from fedlatent.methods import resolve
from fedlatent.models.base import FedModel

DIGITS_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"
SMALL = ["train.rounds=3", "data.num_clients=5", "eval.every=1"]


def _choice(config: fedlatent.RunConfig) -> tuple[str, str]:
    federation = build_federation(config.data, config.data_seed)
    return auto.choose(config, federation, resolve(config.algorithm, config.terms))


def _cnn_config(tmp_path, *overrides: str) -> fedlatent.RunConfig:
    rng = np.random.default_rng(0)
    arrays = {}
    for i in range(2):
        arrays[f"client{i}_train_x"] = rng.standard_normal((8, 3, 32, 32), dtype=np.float32)
        arrays[f"client{i}_train_y"] = rng.integers(0, 4, 8).astype(np.int64)
    np.savez(tmp_path / "images.npz", **arrays)
    return fedlatent.load_config(None, ['data.dataset="arrays"', f'data.path="{tmp_path / "images.npz"}"',
                                        'data.partition="given"', 'model.arch="cnn"', *overrides])


def test_auto_is_the_default_and_picks_vectorized_for_a_lockstep_mlp_run() -> None:
    config = fedlatent.load_config(DIGITS_CONFIG, SMALL)
    assert config.backend == "auto"
    for algorithm in ("fedavg", "fedprox", "scaffold", "ditto_mkmmd", "moon", "feddyn", "fedproto", "fednova",
                      "fedrep", "lg_fedavg"):
        assert _choice(fedlatent.load_config(DIGITS_CONFIG, [*SMALL, f'algorithm.name="{algorithm}"']))[0] \
            == "vectorized", algorithm


def test_auto_chooses_by_speed_alone_for_models_with_dropout(monkeypatch) -> None:
    """Lockstep draws an independent dropout mask per client (same distribution): a model with
    dropout goes where the speed rules send it, the choice a function of the configuration."""
    build = auto.simulation.make_model

    def with_dropout(*args):
        model = build(*args)
        model.projector = torch.nn.Dropout(0.2)
        return model

    monkeypatch.setattr(auto.simulation, "make_model", with_dropout)
    config = fedlatent.load_config(DIGITS_CONFIG, SMALL)
    assert _choice(config) == ("vectorized", "the run trains in lockstep") == _choice(config)


def test_auto_keeps_convolutions_on_simulation_on_a_cpu_only(tmp_path) -> None:
    config = _cnn_config(tmp_path)
    backend, why = _choice(config)
    assert backend == "simulation" and "convolution" in why
    # the model is built on the CPU either way: the device only steers the decision
    on_cuda = dataclasses.replace(config, train=dataclasses.replace(config.train, device="cuda"))
    assert _choice(on_cuda)[0] == "vectorized"


def _assert_choices(cases: list[tuple[str, int, float, str]]) -> None:
    """Each (algorithm, clients, participation) of the digits MLP goes to the expected backend; a
    round kept on simulation says so with the sampled count, and goes vectorized on CUDA."""
    for algorithm, clients, participation, expected in cases:
        config = fedlatent.load_config(DIGITS_CONFIG, [*SMALL, f'algorithm.name="{algorithm}"',
                                                       f"data.num_clients={clients}",
                                                       f"train.participation={participation}"])
        backend, why = _choice(config)
        assert backend == expected, (algorithm, clients, participation, why)
        if expected == "simulation":
            per_round = clients_per_round(clients, participation)
            assert why.startswith(f"{per_round} clients a round train faster in turn"), why
            on_cuda = dataclasses.replace(config, train=dataclasses.replace(config.train, device="cuda"))
            assert _choice(on_cuda)[0] == "vectorized"


def test_auto_keeps_rounds_of_one_client_on_simulation_for_a_stacked_model_on_a_cpu() -> None:
    """The MLP has a stacked forward: lockstep pays off from auto.FEWEST_CLIENTS["stacked"] (2)
    clients a round (the measured break-even), whatever the method."""
    assert auto.FEWEST_CLIENTS["stacked"] == 2
    _assert_choices([("fedavg", 10, 0.1, "simulation"), ("fedavg", 2, 1.0, "vectorized"),
                     ("fedprox", 1, 1.0, "simulation"), ("scaffold", 2, 1.0, "vectorized"),
                     ("ditto", 1, 1.0, "simulation"), ("ditto", 2, 1.0, "vectorized"),
                     ("fedavg", 10, 0.4, "vectorized")])


def test_auto_keeps_rounds_of_few_clients_on_simulation_for_a_vmapped_model_on_a_cpu(monkeypatch) -> None:
    """A model without a stacked forward runs under vmap: below auto.FEWEST_CLIENTS clients a round
    (5 for a method without a loss term or personal model, 3 with one: the measured break-even)
    the clients train in turn; the count is the sampled one; not on CUDA."""
    monkeypatch.setattr(FedModel, "has_stacked_forward", property(lambda self: False))
    _assert_choices([("fedavg", 10, 0.4, "simulation"), ("fedavg", 5, 1.0, "vectorized"),
                     ("fedavgm", 4, 1.0, "simulation"), ("fednova", 3, 1.0, "simulation"),
                     ("scaffold", 4, 1.0, "simulation"), ("scaffold", 5, 1.0, "vectorized"),
                     ("fedprox", 2, 1.0, "simulation"), ("fedprox", 3, 1.0, "vectorized"),
                     ("moon", 10, 0.3, "vectorized"), ("ditto", 2, 1.0, "simulation"), ("ditto", 3, 1.0, "vectorized")])


def test_explicit_backends_are_kept() -> None:
    for backend in ("simulation", "vectorized"):
        config = fedlatent.load_config(DIGITS_CONFIG, [*SMALL, f'backend="{backend}"'])
        federation, spec = single.prepare(config)
        assert single.resolve_backend(config, federation, spec) is config


def test_auto_run_logs_records_and_matches_the_chosen_backend(tmp_path) -> None:
    lines: list[str] = []
    summary = fedlatent.experiment.run(fedlatent.load_config(DIGITS_CONFIG, SMALL), tmp_path / "auto", echo=lines.append)
    assert [line for line in lines if line.startswith("backend")] == \
        ["backend = 'auto': vectorized (the run trains in lockstep)"]
    on_disk = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert summary["backend"] == on_disk["backend"] == "vectorized"
    assert tomllib.loads((tmp_path / "auto" / "config.toml").read_text())["backend"] == "vectorized"
    explicit = fedlatent.experiment.run(fedlatent.load_config(DIGITS_CONFIG, [*SMALL, 'backend="vectorized"']),
                                        tmp_path / "explicit", echo=None)
    assert explicit["backend"] == "vectorized" and explicit["final"] == summary["final"]
    simulated = fedlatent.experiment.run(fedlatent.load_config(DIGITS_CONFIG, [*SMALL, 'backend="simulation"']),
                                         tmp_path / "sim", echo=None)
    assert simulated["backend"] == "simulation"
    assert simulated["final"]["accuracy"] == pytest.approx(summary["final"]["accuracy"], abs=0.02)


def test_resume_continues_on_the_backend_the_run_started_with(tmp_path, crash_at_round_2, monkeypatch) -> None:
    config = fedlatent.load_config(DIGITS_CONFIG, SMALL)
    out = tmp_path / "crashed"
    with pytest.raises(KeyboardInterrupt):
        fedlatent.experiment.run(config, out, echo=None)
    monkeypatch.undo()
    reference = fedlatent.experiment.run(config, tmp_path / "whole", echo=None)

    def refuse(*args, **kwargs):
        raise AssertionError("the resumed run switched backend")

    # were auto asked again, it would now answer simulation; the resume must not ask it
    monkeypatch.setattr(auto, "choose", lambda *a: ("simulation", "changed"))
    monkeypatch.setitem(single.BACKENDS, "simulation", refuse)
    resumed = fedlatent.experiment.run(config, out, resume=True, echo=None)
    assert resumed["backend"] == "vectorized" and resumed["final"] == reference["final"]


def test_resume_with_another_explicit_backend_is_refused(tmp_path) -> None:
    config = fedlatent.load_config(DIGITS_CONFIG, [*SMALL, "train.rounds=1"])
    fedlatent.experiment.run(config, tmp_path / "run", echo=None)
    assert single.as_started(config, tmp_path / "run" / "config.toml").backend == "vectorized"
    with pytest.raises(ConfigError, match="differs"):
        fedlatent.experiment.run(dataclasses.replace(config, backend="simulation"), tmp_path / "run", resume=True)
    started = dataclasses.replace(config, backend="vectorized", train=dataclasses.replace(config.train, precision="fp32"))
    assert (tmp_path / "run" / "config.toml").read_text() == to_toml(started)


def test_auto_chooses_by_speed_whatever_the_local_optimiser() -> None:
    """Adam/AdamW, a kept optimiser state and a step budget train in lockstep too: they no longer
    keep a run on simulation, whose choice is then the speed rule's."""
    base = _choice(fedlatent.load_config(DIGITS_CONFIG, SMALL))
    for extra in (['train.optimizer="adamw"'], ['train.optimizer_state="kept"'], ["train.local_steps=3"]):
        assert _choice(fedlatent.load_config(DIGITS_CONFIG, [*SMALL, *extra])) == base, extra
    assert base[0] == "vectorized"
