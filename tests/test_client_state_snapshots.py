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
    digests = [(tmp_path / side / "round00003" / "clients.safetensors").read_bytes() for side in ("every", "only")]
    assert digests[0] == digests[1]


# the client states' files: only the changed ones written -----------------------------------------------------

def _states(n: int) -> list[dict[str, torch.Tensor]]:
    return [{"c": torch.full((4,), float(i))} for i in range(n)]


def test_a_checkpoint_writes_only_the_shards_whose_clients_changed(tmp_path: Path) -> None:
    n = 2 * state.SHARD + 500  # three files of client states
    states = _states(n)
    common = {"global_state": {"w": torch.ones(2)}, "server_state": {}}
    with Checkpoints(tmp_path, interval=0.0) as ckpt:
        ckpt.save(**common, client_states=states, info={"round": 1, "elapsed_s": 0.0}, changed=None)
    first = tmp_path / "round00001"
    assert {p.name for p in first.glob("clients*")} == {state.shard_name(k) for k in range(3)}
    trained = [state.SHARD + 7, state.SHARD + 400]  # both in the second file
    with Checkpoints(tmp_path, interval=0.0) as ckpt:
        ckpt.save(**common, client_states=states, info={"round": 1, "elapsed_s": 0.0}, changed=None)
        for cid in trained:
            states[cid] = {"c": states[cid]["c"] * -1}
        ckpt.save(**common, client_states=states, info={"round": 2, "elapsed_s": 0.0}, changed=trained)
    second = tmp_path / "round00002"
    assert state.verify(second) is None
    new = {p.name for p in second.glob("clients*") if p.stat().st_nlink == 1}
    linked = {p.name: p.stat().st_ino for p in second.glob("clients*") if p.stat().st_nlink > 1}
    assert new == {state.shard_name(1)}  # the only file of client states written (bytes counted below)
    assert linked == {state.shard_name(k): (first / state.shard_name(k)).stat().st_ino for k in (0, 2)}
    written = sum((second / name).stat().st_size for name in new)
    assert written < 0.45 * sum(p.stat().st_size for p in second.glob("clients*"))  # 1,000 of the 2,500 states
    loaded = load_checkpoint(tmp_path, n)
    assert loaded is not None and all(torch.equal(a["c"], b["c"]) for a, b in zip(loaded[2], states))
    names = json.loads((second / state.MANIFEST).read_text())["sha256"]
    assert list(names) == ["global.safetensors", "server.safetensors", *[state.shard_name(k) for k in range(3)],
                           "state.json"]


def test_a_damaged_linked_shard_is_found_by_its_checksum(tmp_path: Path) -> None:
    states = _states(state.SHARD + 10)
    common = {"global_state": {"w": torch.ones(2)}, "server_state": {}}
    with Checkpoints(tmp_path, interval=0.0) as ckpt:
        ckpt.save(**common, client_states=states, info={"round": 1, "elapsed_s": 0.0})
        ckpt.save(**common, client_states=states, info={"round": 2, "elapsed_s": 0.0}, changed=[])
    (tmp_path / "round00002" / state.shard_name(1)).write_bytes(b"torn")  # the same inode as round 1's
    assert "does not match its checksum" in str(state.verify(tmp_path / "round00002"))


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
