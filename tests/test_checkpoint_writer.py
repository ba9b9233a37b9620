"""Checkpoints written by the background writer: the same files as a direct write, sealed by
checksums of the bytes written, a snapshot of the state at the call, damage still detected and
skipped; the writer itself runs jobs in order and hands failures back to the caller."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedlatent.federated import state as checkpoint_store
from fedlatent.federated.background import BackgroundWriter


def _state(rnd: int) -> dict:
    return {"global_state": {"w": torch.arange(6.0).reshape(2, 3) + rnd, "b": torch.full((3,), float(rnd))},
            "server_state": {"m": torch.ones(2) * -rnd},
            "client_states": [{"c": torch.ones(2) * rnd}, {}, {"c": torch.zeros(1), "d": torch.tensor([rnd])}],
            "info": {"round": rnd, "elapsed_s": 0.5 * rnd}}


def test_background_checkpoints_equal_direct_ones_and_verify(tmp_path: Path) -> None:
    with BackgroundWriter() as writer:
        for rnd in (1, 2, 3):
            checkpoint_store.save_checkpoint(tmp_path / "bg", **_state(rnd), writer=writer)
    for rnd in (1, 2, 3):
        checkpoint_store.save_checkpoint(tmp_path / "direct", **_state(rnd))
    bg, direct = checkpoint_store.round_folders(tmp_path / "bg"), checkpoint_store.round_folders(tmp_path / "direct")
    assert [p.name for p in bg] == [p.name for p in direct] == ["round00003", "round00002"]
    for a, b in zip(bg, direct):
        assert checkpoint_store.verify(a) is None
        assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
        for f in a.iterdir():  # byte-identical files, manifest included
            assert f.read_bytes() == (b / f.name).read_bytes()
        manifest = json.loads((a / "manifest.json").read_text())["sha256"]
        assert all(manifest[f] == checkpoint_store.sha256(a / f) for f in manifest)  # a file's hash as read back
    global_state, server_state, clients, info = checkpoint_store.load_checkpoint(tmp_path / "bg", 3)
    expected = _state(3)
    assert info == expected["info"]
    assert all(torch.equal(global_state[k], v) for k, v in expected["global_state"].items())
    assert torch.equal(server_state["m"], expected["server_state"]["m"])
    assert clients[1] == {} and torch.equal(clients[2]["d"], torch.tensor([3]))


def test_the_checkpoint_is_the_state_at_the_call(tmp_path: Path) -> None:
    """The files hold the tensors as they were when save_checkpoint returned, whatever the run
    does to them while the writer works (in-place updates, a client's state replaced)."""
    state = _state(1)
    gate = threading.Event()
    with BackgroundWriter() as writer:
        writer.submit(gate.wait)  # holds the writer until the state has changed
        checkpoint_store.save_checkpoint(tmp_path, **state, writer=writer)
        state["global_state"]["w"].add_(100.0)
        state["client_states"][0] = {"c": torch.full((2,), 7.0)}
        gate.set()
    folder = tmp_path / "round00001"
    assert torch.equal(load_file(str(folder / "global.safetensors"))["w"], torch.arange(6.0).reshape(2, 3) + 1)
    assert torch.equal(load_file(str(folder / "clients.safetensors"))["0/c"], torch.ones(2))


def test_a_damaged_newest_background_checkpoint_falls_back(tmp_path: Path) -> None:
    with BackgroundWriter() as writer:
        for rnd in (1, 2):
            checkpoint_store.save_checkpoint(tmp_path, **_state(rnd), writer=writer)
    newest = tmp_path / "round00002" / "clients.safetensors"
    newest.write_bytes(newest.read_bytes()[:-1] + b"!")
    warnings: list[str] = []
    *_, info = checkpoint_store.load_checkpoint(tmp_path, 3, warnings.append)
    assert info["round"] == 1
    assert len(warnings) == 1 and "clients.safetensors does not match its checksum" in warnings[0]


def test_writer_runs_jobs_in_order_and_close_waits() -> None:
    done: list[int] = []
    writer = BackgroundWriter(depth=1)
    for i in range(20):
        writer.submit(done.append, i)
    writer.close()
    assert done == list(range(20))
    with pytest.raises(RuntimeError, match="after close"):
        writer.submit(done.append, 20)


def test_a_failed_job_is_raised_to_the_caller_and_stops_later_jobs() -> None:
    done: list[str] = []
    gate = threading.Event()

    def fail() -> None:
        gate.wait()
        raise OSError("disk full")

    writer = BackgroundWriter()
    writer.submit(fail)
    writer.submit(done.append, "queued")  # queued before the failure: it must not run
    gate.set()
    with pytest.raises(OSError, match="disk full"):
        writer.close()
    assert done == []
    failing = BackgroundWriter()
    failing.submit(fail)
    with pytest.raises(OSError, match="disk full"):  # once known, raised by the next submit
        for _ in range(1000):
            failing.submit(done.append, "later")
            time.sleep(0.01)
    failing.close()  # reported once: nothing left to raise
    assert done == []


def test_leaving_with_an_exception_keeps_that_exception_and_finishes_the_writes() -> None:
    done: list[int] = []
    with pytest.raises(KeyboardInterrupt):
        with BackgroundWriter() as writer:
            writer.submit(done.append, 1)
            raise KeyboardInterrupt
    assert done == [1]
