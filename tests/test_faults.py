"""Fault injection: diverging and raising clients under both policies and both backends, damaged
checkpoints, and kill -9 at seeded moments (inside checkpoint writes too) followed by --resume."""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedlatent.backends import simulation
from fedlatent.cli import main
from fedlatent.errors import ConfigError
from fedlatent.experiment.runner import single
from fedlatent.federated import state as checkpoint_store
from fedlatent.federated.trainer import lockstep_update

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "configs" / "digits_fedavg.toml"
# faults are injected into the simulation backend's client update (tests below that name the
# vectorized backend override this)
RUN = ["--no-progress", "--set", "train.rounds=3", "--set", "data.num_clients=4", "--set", 'backend="simulation"']


def _run(out: Path, *extra: str) -> int:
    return main(["run", str(DIGITS), *RUN, *extra, "--out", str(out)])


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("time_")} for row in rows]


def _weights(out: Path, rnd: int) -> dict[str, torch.Tensor]:
    return load_file(str(out / "checkpoints" / f"round{rnd:05d}" / "global.safetensors"))


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _same_run(out: Path, reference: Path) -> None:
    """Final weights, metrics (but wall-clock times) and final evaluation equal the reference's."""
    a, b = _weights(out, 3), _weights(reference, 3)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _untimed(_metrics(out)) == _untimed(_metrics(reference))
    assert _summary(out)["final"] == _summary(reference)["final"]
    assert _summary(out)["status"] == "completed"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run every faulty run is compared with."""
    out = tmp_path_factory.mktemp("reference") / "run"
    assert _run(out) == 0
    return out


def _inject(monkeypatch: pytest.MonkeyPatch, client: int, rnd: int, fault: str) -> list:
    """Make client ``client``'s local update in round ``rnd`` (1-based) raise (``"raise"``, or
    ``"config"``: a ConfigError) or upload NaN weights;
    returns the list the uploads of every call are collected in."""
    real = simulation.local_update
    seen: list = []

    def faulty(ws, global_state, data, spec, rc, settings, generator):
        upload = real(ws, global_state, data, spec, rc, settings, generator)
        seen.append(upload)
        if rc.client_id == client and sum(u.client_id == client for u in seen) == rnd:
            if fault == "raise":
                raise RuntimeError("injected failure\nsecond line")
            if fault == "config":
                raise ConfigError("algorithm.x = 1: refused by the client")
            first = sorted(upload.state)[0]
            upload.state[first] = upload.state[first].clone().fill_(float("nan"))
        return upload

    monkeypatch.setattr(simulation, "local_update", faulty)
    return seen


@pytest.mark.parametrize("fault,quantity", [("nan", "non-finite weight"),
                                            ("raise", "RuntimeError: injected failure second line")])
def test_stop_policy_ends_with_one_line_and_keeps_the_last_good_checkpoint(
        fault: str, quantity: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    _inject(monkeypatch, client=2, rnd=2, fault=fault)
    out = tmp_path / "run"
    assert _run(out) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedlatent: run stopped: round 2, client 2: " + quantity), err
    summary = _summary(out)
    assert summary["status"] == "stopped" and summary["rounds_completed"] == 1
    assert summary["stop_reason"] in err[0] and "final" not in summary
    assert [m["round"] for m in _metrics(out)] == [1]
    assert [p.name for p in checkpoint_store.round_folders(out / "checkpoints")] == ["round00001"]
    assert checkpoint_store.verify(out / "checkpoints" / "round00001") is None


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoints' clock stopped: no round is ever due, only the last one and the ways out
    of the loop write a checkpoint (what a run shorter than CHECKPOINT_SECONDS does)."""
    monkeypatch.setattr(checkpoint_store, "now", lambda: 0.0)


def test_a_fast_run_writes_only_its_last_round(reference: Path, tmp_path: Path, frozen_clock) -> None:
    out = tmp_path / "run"
    assert _run(out) == 0
    assert [p.name for p in checkpoint_store.round_folders(out / "checkpoints")] == ["round00003"]
    _same_run(out, reference)


@pytest.mark.parametrize("way_out", ["stop", "exception", "ctrl-c"])
def test_leaving_in_round_r_keeps_round_r_minus_1_and_resumes_to_the_same_numbers(
        way_out: str, reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, frozen_clock) -> None:
    """The failure policy's stop, a bug and Ctrl-C in round 3 leave round 2's checkpoint, never
    written before (the clock never made it due), and --resume ends as the uninterrupted run."""
    if way_out == "stop":
        _inject(monkeypatch, client=1, rnd=3, fault="raise")
    else:
        real_round = simulation.run_round

        def failing(s, rnd):
            if rnd == 2:
                raise RuntimeError("a bug in round 3") if way_out == "exception" else KeyboardInterrupt
            return real_round(s, rnd)

        monkeypatch.setattr(simulation, "run_round", failing)
    out = tmp_path / "run"
    if way_out == "exception":
        with pytest.raises(RuntimeError, match="a bug in round 3"):
            _run(out)
    else:
        assert _run(out) == 1
    assert [p.name for p in checkpoint_store.round_folders(out / "checkpoints")] == ["round00002"]
    assert checkpoint_store.verify(out / "checkpoints" / "round00002") is None
    monkeypatch.undo()
    monkeypatch.setattr(checkpoint_store, "now", lambda: 0.0)
    assert _run(out, "--resume") == 0
    _same_run(out, reference)


@pytest.mark.parametrize("fault,kind", [("nan", "nonfinite"), ("raise", "error")])
def test_drop_policy_aggregates_the_others_and_records_the_client(
        fault: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkpoint_every_round) -> None:
    seen = _inject(monkeypatch, client=1, rnd=2, fault=fault)
    out = tmp_path / "run"
    assert _run(out, "--set", f"train.{'on_nonfinite' if fault == 'nan' else 'on_client_error'}=drop") == 0
    rows = _metrics(out)
    assert [r["clients"] for r in rows] == [[0, 1, 2, 3], [0, 2, 3], [0, 1, 2, 3]]
    assert [d["client"] for d in rows[1]["dropped"]] == [1] and rows[1]["dropped"][0]["kind"] == kind
    assert "dropped" not in rows[0] and "dropped" not in rows[2]
    summary = _summary(out)
    assert summary["status"] == "completed"
    assert [(d["round"], d["client"]) for d in summary["clients_dropped"]] == [(2, 1)]
    # round 2's global model is the sample-weighted mean of clients 0, 2 and 3 (FedAvg), in float64
    kept = [u for u in seen[4:8] if u.client_id != 1]
    total = sum(u.num_samples for u in kept)
    w2 = load_file(str(out / "checkpoints" / "round00002" / "global.safetensors"))
    for name, value in w2.items():
        if value.is_floating_point():
            expected = sum(u.state[name].double() * u.num_samples for u in kept) / total
            assert torch.allclose(value.double(), expected, atol=1e-6), name


def test_too_few_clients_left_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    _inject(monkeypatch, client=3, rnd=1, fault="raise")
    out = tmp_path / "run"
    assert _run(out, "--set", "train.on_client_error=drop", "--set", "train.min_clients=4") == 1
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "round 1: 3 client(s) left" in line and "train.min_clients = 4" in line
    assert _summary(out)["rounds_completed"] == 0


def test_every_client_diverging_with_drop_keeps_the_global_model(tmp_path: Path, capsys) -> None:
    """The issue's diverged run (lr 1e6) with "drop" (default min_clients = 0): it finishes, records
    every dropped client and ends with one warning line counting them."""
    out = tmp_path / "run"
    assert _run(out, "--set", "train.lr=1e6", "--set", "train.on_nonfinite=drop") == 0
    (warning,) = capsys.readouterr().err.strip().splitlines()
    assert warning.startswith("fedlatent: warning: ") and "dropped by the failure policy" in warning
    rows = _metrics(out)
    assert all(r["dropped"] for r in rows)
    for rnd in (2, 3):
        if rows[rnd - 1]["clients"] == []:                  # nobody left: the model did not move
            a, b = _weights(out, rnd - 1), _weights(out, rnd)
            assert all(torch.equal(a[k], b[k]) for k in a)
    assert _summary(out)["status"] == "completed"
    assert len(_summary(out)["clients_dropped"]) == sum(len(r["dropped"]) for r in rows)
    assert f"{len(_summary(out)['clients_dropped'])} client update(s)" in warning


def test_the_issue_s_diverged_run_stops_naming_round_and_client(tmp_path: Path, capsys) -> None:
    assert _run(tmp_path / "run", "--set", "train.lr=1e6") == 1
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and re.match(r"fedlatent: run stopped: round 1, client \d: non-finite train loss", line)


def _vectorized(monkeypatch: pytest.MonkeyPatch, trainer) -> None:
    monkeypatch.setitem(single.BACKENDS, "vectorized", partial(simulation.run, trainer=trainer))


def test_vectorized_drops_a_nonfinite_client_after_the_fact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def corrupting(*args):
        uploads = lockstep_update(*args)
        uploads[2].metrics["train_loss"] = float("inf")
        return uploads

    _vectorized(monkeypatch, corrupting)
    out = tmp_path / "run"
    assert _run(out, "--set", "backend=vectorized", "--set", "train.on_nonfinite=drop") == 0
    assert all(r["clients"] == [0, 1, 3] and r["dropped"][0]["detail"] == "non-finite train loss (inf)"
               for r in _metrics(out))


def test_an_embedded_round_screens_the_replies_on_the_server_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clients' own check (their replies and states at once), then the server's screen of the
    replies — it never trusts a client's check (issue 53: a value changed after it) — then the new
    global model: three finiteness checks a round, in the embedded round as for replies received."""
    from fedlatent import load_config
    from fedlatent.data.federation import build_federation
    from fedlatent.federated import failures, round as round_
    from fedlatent.methods import resolve

    checked: list[int] = []
    real = failures.all_finite

    def counting(dicts):
        dicts = list(dicts)
        checked.append(len(dicts))
        return real(dicts)

    for module in (failures, round_):
        monkeypatch.setattr(module, "all_finite", counting)
    config = load_config(DIGITS, ["data.num_clients=4", 'backend="simulation"'])
    s = simulation.setup(config, build_federation(config.data, config.data_seed), resolve(config.algorithm, config.terms))
    simulation.run_round(s, 0)
    assert checked == [8, 4, 1]  # four replies and four client states at once, the server's screen, the global model
    checked.clear()
    tasks = round_.plan_round(s.server, config, 1, s.train_sizes)
    outcomes, _ = s.train(tasks)
    round_.close_round(s.server, config, 1, tasks, outcomes)  # as a server that received them
    assert checked == [8, 4, 1]  # the clients' own check, the server's screen, the global model


def test_vectorized_exception_concerns_every_client_trained_together(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    def raising(*args):
        raise RuntimeError("injected lockstep failure")

    _vectorized(monkeypatch, raising)
    assert _run(tmp_path / "a", "--set", "backend=vectorized") == 1
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "round 1, client 0: RuntimeError: injected lockstep failure" in line
    assert "trained together" in line
    assert _run(tmp_path / "b", "--set", "backend=vectorized", "--set", "train.on_client_error=drop",
                "--set", "train.min_clients=1") == 1
    line = capsys.readouterr().err.strip()
    assert "round 1: 0 client(s) left after dropping 4" in line


@pytest.mark.parametrize("policy", ["stop", "drop"])
def test_a_config_error_in_a_client_is_the_user_s_whatever_the_policy(
        policy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Not a client failure to drop (the run once ended 'completed' with every client dropped):
    exit 2 with the error's one line."""
    _inject(monkeypatch, client=1, rnd=2, fault="config")
    assert _run(tmp_path / "run", "--set", f"train.on_client_error={policy}") == 2
    assert capsys.readouterr().err.strip() == "fedlatent: error: algorithm.x = 1: refused by the client"


def test_a_config_error_of_clients_trained_together_is_the_user_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    def raising(*args):
        raise ConfigError("algorithm.x = 1: refused by the clients")

    _vectorized(monkeypatch, raising)
    assert _run(tmp_path / "run", "--set", "backend=vectorized", "--set", "train.on_client_error=drop") == 2
    assert capsys.readouterr().err.strip() == "fedlatent: error: algorithm.x = 1: refused by the clients"


def _killed_before_its_summary(out: Path) -> None:
    """``out`` as a run killed after its last checkpoint, before its summary (a completed run's
    --resume leaves it as it is, checkpoints unread)."""
    (out / "summary.json").unlink()


def test_truncated_newest_checkpoint_resumes_from_the_previous_one(reference: Path, tmp_path: Path, capsys,
                                                                   checkpoint_every_round) -> None:
    """The issue's third command: a damaged newest global.safetensors."""
    out = tmp_path / "run"
    assert _run(out) == 0
    newest = out / "checkpoints" / "round00003" / "global.safetensors"
    newest.write_bytes(newest.read_bytes()[:100])
    _killed_before_its_summary(out)
    capsys.readouterr()
    assert _run(out, "--resume") == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "round00003" in err[0] and "global.safetensors does not match its checksum" in err[0]
    _same_run(out, reference)
    assert all(checkpoint_store.verify(p) is None for p in checkpoint_store.round_folders(out / "checkpoints"))


def test_a_short_run_s_only_checkpoint_truncated_resumes_from_the_initial_state(
        reference: Path, tmp_path: Path, capsys, frozen_clock) -> None:
    """The engine issue's case: a run shorter than CHECKPOINT_SECONDS keeps one checkpoint; with it
    truncated, --resume starts again from the initial state (fixed by the seed) and ends exactly as
    the uninterrupted run, saying so in one line after the damaged checkpoint's."""
    out = tmp_path / "run"
    assert _run(out) == 0
    (only,) = checkpoint_store.round_folders(out / "checkpoints")
    damaged = only / "global.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:100])
    _killed_before_its_summary(out)
    capsys.readouterr()
    assert _run(out, "--resume") == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "global.safetensors does not match its checksum" in lines[0]
    assert lines[1] == (f"fedlatent: warning: --resume: no intact checkpoint under {out / 'checkpoints'}; "
                        "starting again from the initial state (round 0)")
    _same_run(out, reference)
    assert [p.name for p in checkpoint_store.round_folders(out / "checkpoints")] == ["round00003"]
    assert checkpoint_store.verify(out / "checkpoints" / "round00003") is None


def test_no_intact_checkpoint_at_all_starts_again(reference: Path, tmp_path: Path, capsys,
                                                 checkpoint_every_round) -> None:
    out = tmp_path / "run"
    assert _run(out) == 0
    for folder in checkpoint_store.round_folders(out / "checkpoints"):
        for name in checkpoint_store.client_files(folder):
            (folder / name).write_bytes(b"")
    _killed_before_its_summary(out)
    capsys.readouterr()
    assert _run(out, "--resume") == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and "starting again from the initial state" in lines[-1]   # two warnings, then the restart
    _same_run(out, reference)


def test_checkpoint_store_keeps_two_sealed_rounds_and_skips_unsealed(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    state = {"w": torch.arange(6.0).reshape(2, 3)}

    def save(rnd: int) -> None:
        checkpoint_store.write_sealed(root, rnd, checkpoint_store.encode_checkpoint(
            global_state={k: v + rnd for k, v in state.items()}, server_state={},
            client_states=[{"c": torch.ones(2) * rnd}, {}], info={"round": rnd, "elapsed_s": 0.0}))

    for rnd in (1, 2, 3):
        save(rnd)
    assert [p.name for p in checkpoint_store.round_folders(root)] == ["round00003", "round00002"]
    manifest = json.loads((root / "round00003" / "manifest.json").read_text())
    newest = root / "round00003" / "global.safetensors"
    assert manifest["sha256"]["global.safetensors"] == checkpoint_store.sha256(newest)
    # a write interrupted before its manifest: skipped with one warning, the sealed round before it is read
    (root / "round00004").mkdir()
    (root / "round00004" / "global.safetensors").write_bytes(b"partial")
    warnings: list[str] = []
    global_state, _, clients, info = checkpoint_store.load_checkpoint(root, 2, warnings.append)
    assert info["round"] == 3 and torch.equal(global_state["w"], state["w"] + 3)
    assert torch.equal(clients[0]["c"], torch.ones(2) * 3) and clients[1] == {}
    assert len(warnings) == 1 and "round00004" in warnings[0] and "no manifest" in warnings[0]
    # resuming from round 2 and writing round 3 again replaces the later folders
    save(3)
    assert [p.name for p in checkpoint_store.round_folders(root)] == ["round00003", "round00002"]


# --- kill -9 of a real process, then --resume ------------------------------------------------------

KILLER = """
import os, signal, sys
from fedlatent.federated import state
where, at = sys.argv[1], int(sys.argv[2])
calls = {"file": 0, "manifest": 0}
real_file, real_write = state.write_file, state.write_atomically

def write_file(path, data):  # the at-th safetensors file: writes half of it, then dies
    if path.suffix != ".safetensors":
        return real_file(path, data)
    calls["file"] += 1
    if where == "file" and calls["file"] == at:
        real_file(path, data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    real_file(path, data)

def write_atomically(path, text):  # dies with the manifest's temporary file half written
    if path.name == "manifest.json":
        calls["manifest"] += 1
        if where == "manifest" and calls["manifest"] == at:
            path.with_name(path.name + ".tmp").write_text(text[: len(text) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
    real_write(path, text)

state.write_file, state.write_atomically = write_file, write_atomically
state.CHECKPOINT_SECONDS = 0.0  # every round written: the kills are counted in checkpoint files
from fedlatent.cli import main
from fedlatent.errors import ConfigError
sys.exit(main(sys.argv[3:]))
"""


def _process(args: list[str], *, kill_in: tuple[str, int] | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    prefix = ["-c", KILLER, *map(str, kill_in)] if kill_in else ["-m", "fedlatent.cli"]
    return subprocess.Popen([sys.executable, *prefix, "run", str(DIGITS), *RUN, *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("kill_in", [("file", 7), ("file", 6), ("manifest", 3)],
                         ids=["round3-global", "round2-clients", "round3-manifest"])
def test_kill_inside_a_checkpoint_write_then_resume(kill_in: tuple[str, int], reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    killed = _process(["--out", str(out)], kill_in=kill_in)
    assert killed.wait(timeout=300) == -signal.SIGKILL
    assert _run(out, "--resume") == 0            # in this process: the resume needs no fresh interpreter
    _same_run(out, reference)


@pytest.mark.slow
def test_kill_at_seeded_random_moments_then_resume(reference: Path, tmp_path: Path) -> None:
    """Two kill -9s at moments drawn from a seeded generator (after k metrics lines plus a random
    delay), each followed by --resume; the last resume runs to the end."""
    rng = random.Random(19)
    out = tmp_path / "run"
    first = True
    for _ in range(2):
        proc = _process(["--out", str(out)] + ([] if first else ["--resume"]))
        lines, delay = rng.randint(0, 2), rng.uniform(0.0, 0.3)
        metrics = out / "metrics.jsonl"
        while proc.poll() is None and not (metrics.exists() and metrics.read_text().count("\n") >= lines
                                           and (out / "config.toml").exists()):
            time.sleep(0.01)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=300)
        first = first and not (out / "config.toml").exists()
    assert _run(out, *([] if first else ["--resume"])) == 0
    _same_run(out, reference)


def test_a_stopping_exception_is_kept_as_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From Python the stop carries the client's exception (and its traceback) as ``__cause__``."""
    from fedlatent import load_config, run
    from fedlatent.errors import RunStopped

    _inject(monkeypatch, client=0, rnd=1, fault="raise")
    with pytest.raises(RunStopped) as info:
        run(load_config(DIGITS, ["train.rounds=2", "data.num_clients=4", 'backend="simulation"']), tmp_path / "run")
    assert isinstance(info.value.__cause__, RuntimeError) and info.value.rounds_completed == 0


def test_screen_applies_each_policy_and_the_minimum() -> None:
    from fedlatent.config import TrainConfig
    from fedlatent.errors import RunStopped
    from fedlatent.federated.failures import ClientFailure, nonfinite_quantity, screen
    from fedlatent.methods.parts import Upload

    def upload(cid: int, loss: float = 0.5, w: float = 1.0) -> Upload:
        return Upload(cid, {"w": torch.full((2,), w), "steps": torch.tensor(3)}, 10, 3, 0.1, 0.0,
                      metrics={"train_loss": loss, "term_prox": 0.1})

    assert nonfinite_quantity(upload(0)) is None
    assert nonfinite_quantity(upload(0, loss=float("nan"), w=float("inf"))) == "train loss (nan)"  # losses first
    assert nonfinite_quantity(upload(0, w=float("-inf"))) == "weight w"
    assert nonfinite_quantity(upload(0), {"personal.w": torch.tensor([float("nan")])}) == "client state personal.w"
    outcomes = [upload(0), ClientFailure(1, "error", "ValueError: x"), upload(2, w=float("nan")), upload(3)]
    drop_all = TrainConfig(on_nonfinite="drop", on_client_error="drop", min_clients=2)
    kept, dropped = screen(4, outcomes, drop_all)
    assert [u.client_id for u in kept] == [0, 3] and [(f.client, f.kind) for f in dropped] == [(1, "error"), (2, "nonfinite")]
    with pytest.raises(RunStopped, match=r"^round 5: 2 client\(s\) left after dropping 2 \(client 1: ValueError: x, and 1 more\)"):
        screen(4, outcomes, TrainConfig(on_nonfinite="drop", on_client_error="drop", min_clients=3))
    with pytest.raises(RunStopped, match=r"^round 5, client 2: non-finite weight w \(train.on_nonfinite = 'stop'\)$"):
        screen(4, outcomes, TrainConfig(on_client_error="drop"))
    with pytest.raises(RunStopped, match=r"^round 5, client 1: ValueError: x \(train.on_client_error = 'stop'\)$"):
        screen(4, outcomes, TrainConfig(on_nonfinite="drop"))
    # a ConfigError a Flower ClientApp caught comes back as kind "config": the user's error, whatever the policy
    with pytest.raises(ConfigError, match=r"^cosine.depth = 9: too deep$"):
        screen(4, [upload(0), ClientFailure(1, "config", "cosine.depth = 9: too deep")], drop_all)


def test_first_nonfinite_names_the_first_bad_tensor_and_is_not_fooled_by_an_overflowing_norm() -> None:
    from fedlatent.federated.failures import first_nonfinite

    finite = {"b": torch.ones(3), "a": torch.zeros(2, 2), "steps": torch.tensor([7])}
    assert first_nonfinite(finite) is None
    assert first_nonfinite({}) is None and first_nonfinite({"n": torch.tensor([1, 2])}) is None
    huge = {"w": torch.full((4,), 3e38), "v": torch.ones(2)}  # finite, but its norm overflows float32
    assert torch.isinf(torch.linalg.vector_norm(huge["w"])) and first_nonfinite(huge) is None
    for bad in (float("nan"), float("inf"), float("-inf")):
        tensors = {**finite, "c": torch.tensor([1.0, bad]), "b2": torch.tensor([bad])}
        assert first_nonfinite(tensors) == "b2"  # the first in sorted order
    mixed = {"h": torch.tensor([1.0, float("nan")], dtype=torch.float16), "f": torch.ones(2, dtype=torch.float64)}
    assert first_nonfinite(mixed) == "h"
    assert first_nonfinite({**mixed, "h": torch.ones(2, dtype=torch.float16)}) is None


def test_losses_are_checked_in_one_sum_and_an_overflowing_sum_falls_back_to_each_upload() -> None:
    from fedlatent.config import TrainConfig
    from fedlatent.federated.failures import losses_finite, screen
    from fedlatent.federated.round import checked_all
    from fedlatent.methods.parts import Upload

    def upload(cid: int, **metrics: float | None) -> Upload:
        return Upload(cid, {"w": torch.ones(2)}, 10, 3, 0.1, 0.0,
                      metrics={"train_loss": 0.5, "train_seconds": float("inf"), **metrics})

    assert losses_finite([]) and losses_finite([upload(0), upload(1, term_prox=0.1, personal_loss=None)])
    for bad in (float("nan"), float("inf"), float("-inf")):
        assert not losses_finite([upload(0), upload(1, term_prox=bad)])
        assert not losses_finite([upload(0, personal_loss=bad)])
    assert losses_finite([upload(0, steps=float("inf"))])  # not a loss: nonfinite_quantity does not read it
    big = [upload(0, train_loss=1e308), upload(1, train_loss=1e308)]  # finite, but their sum overflows
    assert not losses_finite(big)
    kept, dropped = screen(0, big, TrainConfig(on_nonfinite="drop"))
    assert [u.client_id for u in kept] == [0, 1] and not dropped
    assert checked_all(big, {0: {}, 1: {}}) == big
    outcomes = checked_all([upload(0), upload(1, term_prox=float("nan"))], {0: {}, 1: {}})
    assert outcomes[0].client_id == 0 and (outcomes[1].client, outcomes[1].detail) == (1, "non-finite term prox (nan)")
