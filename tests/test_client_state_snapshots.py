"""A checkpoint's snapshot copies only the client states a round replaced (the rest shared with the
previous snapshot), and writes the same files as a snapshot copying every state."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.experiment.runner import single
from fedlatent.federated import state
from fedlatent.federated.state import Checkpoints, load_checkpoint
from safetensors.torch import save


def test_only_the_changed_states_are_copied_and_the_files_are_the_full_copys(tmp_path: Path) -> None:
    states = [{"c": torch.full((3,), float(i))} for i in range(6)]
    every, only = Checkpoints(tmp_path / "every", interval=0.0), Checkpoints(tmp_path / "only", interval=0.0)
    common = {"global_state": {"w": torch.ones(2)}, "server_state": {}}
    with every, only:
        for rnd, trained in enumerate(([1, 4], [0, 4], [5])):
            for cid in trained:  # a round replaces its clients' states (never changes one in place)
                states[cid] = {"c": states[cid]["c"] + 10}
            before = None if only.copies is None else list(only.copies)
            every.save(**common, client_states=states, info={"round": rnd + 1, "elapsed_s": 0.0})
            only.save(**common, client_states=states, info={"round": rnd + 1, "elapsed_s": 0.0}, changed=trained)
            if before is not None:  # the untrained clients' copies are the previous snapshot's objects
                assert all((only.copies[c] is before[c]) == (c not in trained) for c in range(6))
    a, b = load_checkpoint(tmp_path / "every", 6), load_checkpoint(tmp_path / "only", 6)
    assert a is not None and b is not None and a[3] == b[3]
    assert all(torch.equal(x["c"], y["c"]) and torch.equal(x["c"], s["c"]) for x, y, s in zip(a[2], b[2], states))
    sets = [state.client_tensors(tmp_path / side / "round00003") for side in ("every", "only")]
    assert sets[0].keys() == sets[1].keys() and all(torch.equal(sets[0][k], sets[1][k]) for k in sets[0])


# the client states' segments: only the changed states written ---------------------------------------------

def _states(n: int) -> list[dict[str, torch.Tensor]]:
    return [{"c": torch.full((4,), float(i))} for i in range(n)]


COMMON = {"global_state": {"w": torch.ones(2)}, "server_state": {}}


def _info(rnd: int) -> dict:
    return {"round": rnd, "elapsed_s": 0.0}


def _new(folder: Path, before: Path) -> set[str]:
    """The folder's files of client states its own write wrote (not hard-linked from ``before``)."""
    linked = {(before / name).stat().st_ino for name in state.client_files(before)}
    return {name for name in state.client_files(folder) if (folder / name).stat().st_ino not in linked}


def segment_bytes(states: dict[int, dict[str, torch.Tensor]], path: Path) -> int:
    """What a segment of exactly ``states`` takes: its header (of those clients' keys, ``{}`` ones
    listed as empty) and their tensors' bytes."""
    header, start = state._header(path)
    assert {k for k in header if k != "__metadata__"} == {f"{c}/{n}" for c, s in states.items() for n in s}
    assert state._empty(header) == sorted(c for c, s in states.items() if not s)
    return start + sum(v.nbytes for s in states.values() for v in s.values())


def test_a_checkpoint_writes_one_segment_of_exactly_the_changed_states(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "KEEP", 3)  # the three folders kept, to compare their files
    n = 2500
    states = _states(n)
    with Checkpoints(tmp_path, interval=0.0) as ckpt:
        ckpt.save(**COMMON, client_states=states, info=_info(1), changed=None)
        trained = [7, 1400, 2499]
        states[7] = {"c": states[7]["c"] * -1}
        states[1400] = {}  # a state become empty: listed as such, so that the earlier one is superseded
        states[2499] = {"other": torch.ones(3, dtype=torch.float64)}  # a state of other keys
        ckpt.save(**COMMON, client_states=states, info=_info(2), changed=trained)
        ckpt.save(**COMMON, client_states=states, info=_info(3), changed=[5])  # 5's state the same object
    first, second, third = tmp_path / "round00001", tmp_path / "round00002", tmp_path / "round00003"
    assert state.verify(second) is None and state.client_files(second) == [state.segment_name(1), state.segment_name(2)]
    assert _new(second, first) == {state.segment_name(2)}  # the base linked, no byte of it written
    written = (second / state.segment_name(2)).stat().st_size
    assert written == segment_bytes({c: states[c] for c in trained}, second / state.segment_name(2))  # bytes counted
    assert written < 0.01 * (second / state.segment_name(1)).stat().st_size
    assert state.client_files(third)[-1] == state.segment_name(3) and _new(third, second) == {state.segment_name(3)}
    loaded = load_checkpoint(tmp_path, n)
    assert loaded is not None and loaded[2][1400] == {} and list(loaded[2][2499]) == ["other"]
    assert all(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(loaded[2], states))
    names = json.loads((third / state.MANIFEST).read_text())["sha256"]
    assert list(names) == ["global.safetensors", "server.safetensors", *state.client_files(third), "state.json"]
    with Checkpoints(tmp_path / "quiet", interval=0.0) as ckpt:  # a write that changed no state adds no segment
        ckpt.save(**COMMON, client_states=states, info=_info(1), changed=None)
        ckpt.save(**COMMON, client_states=states, info=_info(2), changed=[])
    assert _new(tmp_path / "quiet" / "round00002", tmp_path / "quiet" / "round00001") == set()


def test_a_write_compacts_when_the_superseded_states_outweigh_the_live_ones(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    states = _states(10)
    kept = []
    with Checkpoints(tmp_path, interval=0.0) as ckpt:
        ckpt.save(**COMMON, client_states=states, info=_info(1), changed=None)
        for rnd in range(2, 9):  # two of ten states of one size replaced a round
            trained = [rnd % 10, (rnd + 5) % 10]
            for cid in trained:
                states[cid] = {"c": states[cid]["c"] + rnd}
            ckpt.save(**COMMON, client_states=states, info=_info(rnd), changed=trained)
            live = {cid: s for cid, s in enumerate(states)}

            def seen(rnd: int = rnd, live: dict = live) -> None:  # in the writer, right after round rnd's write
                folder = tmp_path / f"round{rnd:05d}"
                kept.append((rnd, state.client_files(folder), _new(folder, tmp_path / f"round{rnd - 1:05d}")))
                assert len(state.round_folders(tmp_path)) == state.KEEP  # the older ones removed
                if rnd == 7:
                    assert (folder / state.segment_name(7)).stat().st_size == segment_bytes(
                        live, folder / state.segment_name(7))  # the live set, whole
            ckpt.writer.submit(seen)
    files = {rnd: (names, new) for rnd, names, new in kept}
    assert len(files[6][0]) == 6  # 5 rounds: 10 states superseded, not more than the 10 live ones
    assert files[7] == ([state.segment_name(7)], {state.segment_name(7)})  # the 6th would make 12: the live set rewritten, one base
    assert files[8] == ([state.segment_name(7), state.segment_name(8)], {state.segment_name(8)})
    loaded = load_checkpoint(tmp_path, 10)
    assert loaded is not None and all(torch.equal(a["c"], b["c"]) for a, b in zip(loaded[2], states))
    monkeypatch.setattr(state, "SEGMENTS", 3)  # the bound on segments compacts too
    with Checkpoints(tmp_path / "bound", interval=0.0) as ckpt:
        ckpt.save(**COMMON, client_states=_states(100), info=_info(1), changed=None)
        for rnd in (2, 3, 4):
            ckpt.save(**COMMON, client_states=_states(100), info=_info(rnd), changed=[rnd])
    assert state.client_files(tmp_path / "bound" / "round00004") == [state.segment_name(4)]
    assert state.client_files(tmp_path / "bound" / "round00003") == [state.segment_name(r) for r in (1, 2, 3)]


def test_a_damaged_or_missing_segment_is_found_and_the_previous_folder_read(tmp_path: Path) -> None:
    states = _states(30)
    with Checkpoints(tmp_path, interval=0.0) as ckpt:
        ckpt.save(**COMMON, client_states=states, info=_info(1))
        states[3] = {"c": torch.zeros(4)}
        ckpt.save(**COMMON, client_states=states, info=_info(2), changed=[3])
    second = tmp_path / "round00002"
    (second / state.segment_name(2)).write_bytes(b"torn")  # round 2's own segment
    warnings: list[str] = []
    loaded = load_checkpoint(tmp_path, 30, warnings.append)
    assert loaded is not None and loaded[3]["round"] == 1 and torch.equal(loaded[2][3]["c"], torch.full((4,), 3.0))
    assert len(warnings) == 1 and f"{state.segment_name(2)} does not match its checksum" in warnings[0]
    (second / state.segment_name(1)).unlink()  # a linked one gone: round 1's copy is still whole
    assert state.verify(second) == f"{state.segment_name(1)} is missing" and state.verify(tmp_path / "round00001") is None


def test_a_damaged_linked_segment_is_found_by_its_checksum(tmp_path: Path) -> None:
    states = _states(1010)
    with Checkpoints(tmp_path, interval=0.0) as ckpt:
        ckpt.save(**COMMON, client_states=states, info=_info(1))
        ckpt.save(**COMMON, client_states=states, info=_info(2), changed=[])
    (tmp_path / "round00002" / state.segment_name(1)).write_bytes(b"torn")  # the same inode as round 1's
    assert "does not match its checksum" in str(state.verify(tmp_path / "round00002"))


def test_a_folder_of_an_older_version_shard_files_reads_back(tmp_path: Path) -> None:
    states = _states(1500)
    states[4] = {}
    folder = tmp_path / "round00003"
    files = {"global.safetensors": save({"w": torch.ones(2)}), "server.safetensors": save({}),
             "clients.safetensors": save({f"{i}/{n}": v for i in range(1000) for n, v in states[i].items()}),
             "clients.1.safetensors": save({f"{i}/{n}": v for i in range(1000, 1500) for n, v in states[i].items()}),
             "state.json": json.dumps(_info(3)).encode()}
    state.write_sealed(tmp_path, 3, files)
    assert state.verify(folder) is None and state.client_files(folder) == ["clients.safetensors", "clients.1.safetensors"]
    loaded = load_checkpoint(tmp_path, 1500)
    assert loaded is not None and loaded[3]["round"] == 3
    assert all(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(loaded[2], states))


SCAFFOLD = ["seed=3", 'data.dataset="synthetic"', 'data.partition="given"', "data.num_clients=2100",
            "data.samples_per_client=20", "model.hidden=[8]", "train.rounds=3", "train.participation=0.001",
            "train.threads=1", 'algorithm.name="scaffold"', "eval.every=10", "eval.final_clients=50",
            'backend="simulation"']


def test_a_scaffold_run_of_2100_clients_killed_mid_round_resumes_identical(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    config = fedlatent.load_config(None, SCAFFOLD)
    monkeypatch.setattr(state, "CHECKPOINT_SECONDS", 0.0)  # every round checkpointed: the links exercised
    whole = single.run(config, tmp_path / "whole", echo=None, figures=False)
    real_round = simulation.run_round

    def killed(s, rnd):
        if rnd == 2:
            raise KeyboardInterrupt  # mid-round 3
        return real_round(s, rnd)

    monkeypatch.setattr(simulation, "run_round", killed)
    with pytest.raises(KeyboardInterrupt):
        single.run(config, tmp_path / "cut", echo=None, figures=False)
    second = tmp_path / "cut" / "checkpoints" / "round00002"
    assert sum(p.stat().st_nlink > 1 for p in second.glob("clients*")) >= 1  # round 2 (2 clients) linked what did not change
    monkeypatch.setattr(simulation, "run_round", real_round)
    resumed = single.run(config, tmp_path / "cut", resume=True, echo=None, figures=False)
    assert resumed["final"] == whole["final"]
    a, b = (load_checkpoint(tmp_path / side / "checkpoints", 2100) for side in ("whole", "cut"))
    assert a is not None and b is not None
    assert all(torch.equal(a[0][k], b[0][k]) for k in a[0])
    assert all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a[2], b[2]))
