"""``train.precision``: bf16 and fp16 (dynamic loss scaling) local training under autocast, on every
embedded backend; ``auto`` resolved and recorded; the default leaves float32 runs as they were; bad
values refused before any folder exists."""
from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.cli import main
from fedlatent.config import ConfigError
from fedlatent.data.federation import build_federation
from fedlatent.experiment.runner.single import run
from fedlatent.federated import precision
from fedlatent.federated.trainer import lockstep_update
from fedlatent.federated.round import plan_round
from fedlatent.losses.amp import BACKOFF, INIT_SCALE
from fedlatent.methods import resolve
from fedlatent.methods.parts import Upload

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "configs" / "digits_fedavg.toml"


def _digits(*overrides: str):
    return fedlatent.load_config(DIGITS, ["train.rounds=3", *overrides])


def _run(config, out: Path) -> dict:
    return run(config, out, echo=lambda *_: None, figures=False)


def _lines(out: Path) -> list[dict]:
    """The metrics lines without their timings."""
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if "time" not in k and "seconds" not in k} for line in lines]


def test_auto_is_fp32_on_the_cpu_and_the_run_records_it(tmp_path: Path) -> None:
    assert precision.resolve("auto", "cpu") == "fp32"
    assert _digits().train.precision == "auto"
    _run(_digits("train.rounds=1"), tmp_path / "run")
    assert tomllib.loads((tmp_path / "run" / "config.toml").read_text())["train"]["precision"] == "fp32"


def test_the_default_leaves_a_digits_run_bit_identical_to_fp32(tmp_path: Path) -> None:
    default = _run(_digits(), tmp_path / "default")
    fp32 = _run(_digits('train.precision="fp32"'), tmp_path / "fp32")
    assert default["final"] == fp32["final"]
    assert _lines(tmp_path / "default") == _lines(tmp_path / "fp32")


def test_a_resumed_auto_run_continues_in_the_precision_it_recorded(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _run(_digits("train.rounds=1"), out)
    text = (out / "config.toml").read_text()
    assert run(_digits("train.rounds=1"), out, resume=True, echo=lambda *_: None, figures=False)["rounds_completed"] == 1
    assert (out / "config.toml").read_text() == text


@pytest.mark.parametrize("backend", ["simulation", "vectorized"])
def test_bf16_lands_within_a_point_of_fp32(tmp_path: Path, backend: str) -> None:
    overrides = ["train.rounds=5", f'backend="{backend}"']
    fp32 = _run(_digits(*overrides, 'train.precision="fp32"'), tmp_path / "fp32")
    bf16 = _run(_digits(*overrides, 'train.precision="bf16"'), tmp_path / "bf16")
    assert abs(bf16["final"]["accuracy"] - fp32["final"]["accuracy"]) <= 0.01
    assert _lines(tmp_path / "bf16") != _lines(tmp_path / "fp32")  # it did train in bfloat16


def _rounds(config, trainer, rounds: int = 2) -> simulation.Setup:
    fed = build_federation(config.data, config.data_seed)
    s = simulation.setup(config, fed, resolve(config.algorithm, config.terms), trainer)
    for rnd in range(rounds):
        simulation.run_round(s, rnd)
    return s


@pytest.mark.parametrize("arithmetic", ["bf16", "fp16"])
def test_lockstep_agrees_with_clients_in_turn(arithmetic: str) -> None:
    """The vectorized backend's stacked 16-bit forward against one client's own, round after
    round: the same to 16-bit rounding (their products are summed in other orders)."""
    config = _digits(f'train.precision="{arithmetic}"', "data.num_clients=4", "model.hidden=[32]")
    ref = _rounds(config, simulation.train_in_turn)
    got = _rounds(config, lockstep_update)
    for k, v in ref.server.global_state.items():
        torch.testing.assert_close(got.server.global_state[k], v, atol=2e-2, rtol=2e-2, msg=k)
        assert got.server.global_state[k].dtype == torch.float32  # master weights and aggregation
    if arithmetic == "fp16":  # the scale is client state: every client keeps its own
        for ref_state, got_state in zip(ref.client_states, got.client_states):
            assert sorted(got_state) == sorted(ref_state) == ["amp.good_steps", "amp.scale"]
            assert got_state["amp.scale"].dtype == torch.float32
            assert torch.equal(got_state["amp.good_steps"], ref_state["amp.good_steps"])


@pytest.mark.parametrize("trainer", [simulation.train_in_turn, lockstep_update], ids=["own", "stack"])
def test_fp16_overflow_skips_only_that_clients_steps(trainer) -> None:
    """Client 0 starts from a scale so large that its scaled loss overflows at every step: each of
    its steps is skipped (its weights stay the round's start) and halves its scale; client 1 in the
    same stack trains as it does alone, its scale untouched, every step counted."""
    config = _digits('train.precision="fp16"', "data.num_clients=2", "model.hidden=[32]")
    huge = 3e38
    states = {}
    for which in (trainer, simulation.train_in_turn):
        s = _rounds(config, which, rounds=0)
        s.client_states[0] = {"amp.scale": torch.tensor(huge), "amp.good_steps": torch.tensor(5)}
        tasks = plan_round(s.server, config, 0, s.train_sizes)
        outcomes, new_states = s.train(tasks)
        states[which] = (tasks, outcomes, new_states)
    tasks, outcomes, new_states = states[trainer]
    first, second = outcomes
    assert isinstance(first, Upload) and isinstance(second, Upload)
    for k, v in tasks[0].global_state.items():
        assert torch.equal(first.state[k], v), k
    steps = first.steps
    assert steps > 1
    assert float(new_states[0]["amp.scale"]) == pytest.approx(huge * BACKOFF ** steps, rel=1e-6)
    assert int(new_states[0]["amp.good_steps"]) == 0
    assert float(new_states[1]["amp.scale"]) == INIT_SCALE
    assert int(new_states[1]["amp.good_steps"]) == second.steps
    alone = states[simulation.train_in_turn][1][1]
    assert isinstance(alone, Upload)
    for k, v in alone.state.items():
        torch.testing.assert_close(second.state[k], v, atol=2e-3, rtol=2e-3, msg=k)
        assert not torch.equal(second.state[k], tasks[1].global_state[k]) or "running" in k


def test_fp8_is_refused_naming_the_key_and_the_allowed_values() -> None:
    with pytest.raises(ConfigError) as err:
        _digits('train.precision="fp8"')
    message = str(err.value)
    assert "train.precision" in message and "fp8" in message
    for allowed in precision.PRECISIONS:
        assert allowed in message


@pytest.mark.parametrize("command", ["run", "check"])
def test_the_cli_exits_2_on_fp8_with_no_run_folder(tmp_path: Path, capsys, command: str) -> None:
    out = tmp_path / "run"
    args = [command, str(DIGITS), "--set", 'train.precision="fp8"']
    assert main(args + (["--out", str(out), "--no-progress"] if command == "run" else [])) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.precision" in err[0] and "fp32" in err[0]


def test_a_device_without_bf16_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 on a CUDA device that lacks it, and 16-bit training where torch has no autocast, are
    one line each; ``auto`` there falls back to fp32 (nothing to refuse); the CPU takes both."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda kind: kind in ("cpu", "cuda"))
    assert "does not support bfloat16" in (precision.refusal("bf16", "cuda") or "")
    assert precision.resolve("auto", "cuda") == "fp32" and precision.refusal("auto", "cuda") is None
    assert precision.refusal("fp16", "cuda") is None
    assert "no autocast" in (precision.refusal("fp16", "meta") or "")
    assert precision.refusal("bf16", "cpu") is None and precision.refusal("fp16", "cpu") is None
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert precision.resolve("auto", "cuda:0") == "bf16"


def test_flower_on_a_gpu_leaves_auto_to_its_nodes() -> None:
    from fedlatent.experiment.runner.single import resolve_precision
    config = _digits()
    assert resolve_precision(dataclasses.replace(config, backend="flower")).train.precision == "fp32"
    on_gpu = dataclasses.replace(config, backend="flower", train=dataclasses.replace(config.train, device="cuda"))
    assert resolve_precision(on_gpu).train.precision == "auto"


def test_flower_nodes_train_in_the_configured_precision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fp16 through fedlatent's Flower apps (in-process grid, the scale kept in the nodes'
    contexts) gives the embedded backend's weights every round."""
    pytest.importorskip("flwr")
    from tests.flower_procs import InProcessGrid
    from tests.test_flower import assert_parity, run_both
    assert_parity(*run_both(tmp_path, monkeypatch, ['train.precision="fp16"'], grid=InProcessGrid(2)))
    assert tomllib.loads((tmp_path / "flower" / "config.toml").read_text())["train"]["precision"] == "fp16"
