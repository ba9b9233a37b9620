"""Checkpoints written by the background writer: the same files as a direct write, sealed by
checksums of the bytes written, a snapshot of the state at the call, damage still detected and
skipped; written at most every ``interval`` seconds, after the last round and on any way out; the
writer itself runs jobs in order and hands failures back to the caller."""
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
from fedlatent.federated.state import Checkpoints


def _state(rnd: int) -> dict:
    return {"global_state": {"w": torch.arange(6.0).reshape(2, 3) + rnd, "b": torch.full((3,), float(rnd))},
            "server_state": {"m": torch.ones(2) * -rnd},
            "client_states": [{"c": torch.ones(2) * rnd}, {}, {"c": torch.zeros(1), "d": torch.tensor([rnd])}],
            "info": {"round": rnd, "elapsed_s": 0.5 * rnd}}


def test_background_checkpoints_equal_direct_ones_and_verify(tmp_path: Path) -> None:
    with Checkpoints(tmp_path / "bg", interval=0.0) as checkpoints:
        for rnd in (1, 2, 3):
            checkpoints.save(**_state(rnd))
    for rnd in (1, 2, 3):
        checkpoint_store.write_sealed(tmp_path / "direct", rnd, checkpoint_store.encode_checkpoint(**_state(rnd)))
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
    """The files hold the tensors as they were when ``save`` returned, whatever the run does to
    them while the writer works or while the snapshot waits for its write (in-place updates, a
    client's state replaced)."""
    for interval, root in ((0.0, tmp_path / "written"), (3600.0, tmp_path / "pending")):
        state = _state(1)
        gate = threading.Event()
        with Checkpoints(root, interval=interval) as checkpoints:
            checkpoints.writer.submit(gate.wait)  # holds the writer until the state has changed
            checkpoints.save(**state)
            state["global_state"]["w"].add_(100.0)
            state["client_states"][0] = {"c": torch.full((2,), 7.0)}
            gate.set()
        folder = root / "round00001"
        assert torch.equal(load_file(str(folder / "global.safetensors"))["w"], torch.arange(6.0).reshape(2, 3) + 1)
        assert torch.equal(checkpoint_store.client_tensors(folder)["0/c"], torch.ones(2))


def test_a_damaged_newest_background_checkpoint_falls_back(tmp_path: Path) -> None:
    with Checkpoints(tmp_path, interval=0.0) as checkpoints:
        for rnd in (1, 2):
            checkpoints.save(**_state(rnd))
    newest = tmp_path / "round00002" / checkpoint_store.segment_name(2)  # its own segment, the full set
    newest.write_bytes(newest.read_bytes()[:-1] + b"!")
    warnings: list[str] = []
    *_, info = checkpoint_store.load_checkpoint(tmp_path, 3, warnings.append)
    assert info["round"] == 1
    assert len(warnings) == 1 and f"{checkpoint_store.segment_name(2)} does not match its checksum" in warnings[0]


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


class FakeClock:
    """A clock that reads ``at`` (seconds), moved by the test."""

    def __init__(self) -> None:
        self.at = 0.0

    def __call__(self) -> float:
        return self.at


def _written(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rounds whose folder is written (in the writer's thread), in order."""
    written: list[int] = []
    real = checkpoint_store.write_sealed

    def write_sealed(root, rnd, files):
        written.append(rnd)
        return real(root, rnd, files)

    monkeypatch.setattr(checkpoint_store, "write_sealed", write_sealed)
    return written


def test_rounds_are_written_once_the_last_write_is_interval_old_and_the_last_always(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written, clock = _written(monkeypatch), FakeClock()
    ends = {1: 0.4, 2: 0.9, 3: 1.0, 4: 1.5, 5: 1.9, 6: 2.0, 7: 2.1, 8: 4.5, 9: 4.6}  # round -> its end
    with Checkpoints(tmp_path, interval=1.0, clock=clock) as checkpoints:
        for rnd, at in ends.items():
            clock.at = at
            checkpoints.save(**_state(rnd), last=rnd == 9)
    # 3: 1.0 s after the start; 6: 1.0 s after round 3's write; 8: long after; 9: the last
    assert written == [3, 6, 8, 9]
    assert [p.name for p in checkpoint_store.round_folders(tmp_path)] == ["round00009", "round00008"]
    assert checkpoint_store.load_checkpoint(tmp_path, 3)[3] == _state(9)["info"]


def test_the_default_interval_is_read_at_construction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Checkpoints(tmp_path / "a").interval == checkpoint_store.CHECKPOINT_SECONDS == 1.0
    monkeypatch.setattr(checkpoint_store, "CHECKPOINT_SECONDS", 0.0)
    written = _written(monkeypatch)
    with Checkpoints(tmp_path / "b", clock=FakeClock()) as checkpoints:  # the clock never moves
        for rnd in (1, 2, 3):
            checkpoints.save(**_state(rnd))
    assert written == [1, 2, 3]


@pytest.mark.parametrize("exception", [KeyboardInterrupt, RuntimeError])
def test_leaving_with_an_exception_writes_the_pending_round_and_keeps_the_exception(
        exception: type[BaseException], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = _written(monkeypatch)
    with pytest.raises(exception, match="in round 3"):
        with Checkpoints(tmp_path, interval=1.0, clock=FakeClock()) as checkpoints:
            for rnd in (1, 2, 3):
                if rnd == 3:
                    raise exception("in round 3")
                checkpoints.save(**_state(rnd))
    assert written == [2]  # round 1 was never due, round 2 was pending
    assert checkpoint_store.verify(tmp_path / "round00002") is None
    assert checkpoint_store.load_checkpoint(tmp_path, 3)[3] == _state(2)["info"]


def test_a_failed_write_is_raised_at_the_end_unless_an_exception_is_on_its_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(root, rnd, files):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_store, "write_sealed", failing)
    with pytest.raises(OSError, match="disk full"):
        with Checkpoints(tmp_path, interval=0.0) as checkpoints:
            checkpoints.save(**_state(1))
    with pytest.raises(KeyboardInterrupt):
        with Checkpoints(tmp_path, interval=1.0, clock=FakeClock()) as checkpoints:
            checkpoints.save(**_state(1), last=True)  # written at once: fails
            checkpoints.save(**_state(2))  # pending: its write, on the way out, raises round 1's failure
            while checkpoints.writer._error is None:  # the failure is known before the exception leaves
                time.sleep(0.01)
            raise KeyboardInterrupt
