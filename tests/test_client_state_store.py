"""The clients' states within a memory budget (``federated.client_states``, ``train.client_state_memory``):
the values read back are the bytes written, the memory held stays within the budget, a checkpoint
writes a segment of the changed states alone (or compacts from its files) and never loads the whole set, and a run with a budget —
killed mid-round and resumed, or not — gives the numbers of the run without one, bit for bit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.config import memory_budget, to_toml
from fedlatent.errors import ConfigError
from fedlatent.experiment.runner import single
from fedlatent.experiment.runner.state_size import one_state_bytes
from fedlatent.experiment.runner.validation import validate
from fedlatent.federated import state
from fedlatent.federated.client_states import FOLDER, ClientStates, state_bytes
from fedlatent.federated.state import Checkpoints, load_checkpoint
from fedlatent.methods import resolve


@pytest.mark.parametrize(("value", "expected"), [(4096, 4096), ("4096", 4096), ("256MiB", 256 * 2**20),
                                                 ("2 GB", 2 * 10**9), ("1.5KiB", 1536), ("unbounded", None)])
def test_a_budget_reads_as_bytes(value: int | str, expected: int | None) -> None:
    assert memory_budget(value) == expected


@pytest.mark.parametrize("value", ["lots", "12 parsecs", "-1", 0, "0MiB", ""])
def test_a_nonsense_budget_is_one_line(value: int | str) -> None:
    with pytest.raises(ConfigError, match=r"^train\.client_state_memory = "):
        memory_budget(value)


def _state(i: int) -> dict[str, torch.Tensor]:
    """A state of many kinds of tensor (0-d, bfloat16, integers, booleans, empty), its keys not sorted."""
    return {"z.w": torch.arange(6, dtype=torch.float32).reshape(2, 3) + i, "a.half": torch.full((3,), i / 7,
            dtype=torch.bfloat16), "n": torch.tensor(i), "mask": torch.tensor([i % 2 == 0, True]),
            "none": torch.zeros(0), "big": torch.randn(40, generator=torch.Generator().manual_seed(i))}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_states_spilled_to_disk_read_back_bit_for_bit_and_the_memory_held_stays_within_the_budget(tmp_path: Path) -> None:
    one = state_bytes(_state(0))
    store = ClientStates(50, 3 * one, tmp_path / "store")
    for i in range(50):
        store[i] = _state(i)
        assert store.held <= 3 * one and len(store.cache) <= 3
    assert (tmp_path / "store").is_dir() and len(store.cache) == 3
    store[7] = {"other": torch.ones(2, dtype=torch.float64)}  # a state of other keys replaces the old one whole
    assert all(_same(store[i], _state(i)) for i in range(50) if i != 7)
    assert _same(store[7], {"other": torch.ones(2, dtype=torch.float64)})
    assert store.held <= 3 * one
    assert ClientStates(4, one, tmp_path / "empty")[3] == {}  # a client that never kept a state
    with pytest.raises(IndexError):
        store[50]
    store.close()
    assert not (tmp_path / "store").exists()


def test_a_state_read_back_and_not_replaced_is_not_written_again_and_stored_holds_nothing(tmp_path: Path) -> None:
    one = state_bytes(_state(0))
    store = ClientStates(10, one, tmp_path / "store")
    for i in range(10):
        store[i] = _state(i)
    writes = []
    for column in store.columns:
        column.write = lambda cid, value, real=column.write: (writes.append(cid), real(cid, value))[1]
    for i in range(9):
        assert _same(store[i], _state(i))  # read back, evicting one another: none is new
    assert set(writes) == {9} and list(store.cache) == [8]  # the one written is the last set, on its way out
    assert _same(store.stored(3), _state(3)) and list(store.cache) == [8]  # not held: a checkpoint's read
    store.close()


def _common(rnd: int) -> dict:
    return {"global_state": {"w": torch.ones(2) * rnd}, "server_state": {}, "info": {"round": rnd, "elapsed_s": 0.0}}


def _new(folder: Path, before: Path) -> set[str]:
    """The folder's files of client states its own write wrote (not hard-linked from ``before``)."""
    linked = {(before / name).stat().st_ino for name in state.client_files(before)}
    return {name for name in state.client_files(folder) if (folder / name).stat().st_ino not in linked}


def _segments(folder: Path) -> list[int]:
    """The rounds whose segments ``folder`` holds, in its log's order."""
    return sorted({state._client_order(name)[0] for name in state.client_files(folder)})


def _clients(folder: Path, names: set[str]) -> tuple[set[int], int]:
    """The clients the files ``names`` hold (listed empty ones included), and the bytes the files take."""
    held, size = set(), 0
    for name in names:
        header, _ = state._header(folder / name)
        held |= {int(k.partition("/")[0]) for k in header if k != "__metadata__"} | set(state._empty(header))
        size += (folder / name).stat().st_size
    return held, size


def test_a_checkpoint_of_a_store_writes_a_segment_of_the_changed_states_and_compacts_from_the_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "KEEP", 20)  # every folder kept, to compare their files
    monkeypatch.setattr(state, "PART", 400)  # segments of several files
    n = 1030
    one = state_bytes(_state(0))
    store = ClientStates(n, 20 * one, tmp_path / "store")
    plain = [_state(i) if i % 3 else {} for i in range(n)]  # a third of the clients hold no state: 686 do
    for i in range(n):
        store[i] = plain[i]
    root = tmp_path / "checkpoints"
    # states of one size: 3 superseded by round 4, 690 by round 5 (of 1,030 live), 1,390 by round 6 (of 1,029)
    rounds = {2: [103, 499, 1029], 3: [3], 4: [1], 5: list(range(n)), 6: list(range(700)), 7: [5, 1000]}
    sizes = {}  # each round's changed states' bytes
    with Checkpoints(root, interval=0.0) as ckpt:
        ckpt.save(**_common(1), client_states=store, changed=range(n))  # the first write: the full set, from the store
        for rnd, trained in rounds.items():
            for cid in trained:
                plain[cid] = {} if (cid, rnd) in ((499, 2), (600, 6)) else _state(cid + 7 * rnd)
                store[cid] = plain[cid]
            sizes[rnd] = sum(state_bytes(plain[cid]) for cid in trained)
            ckpt.save(**_common(rnd), client_states=store, changed=trained)
    folders = {rnd: root / f"round{rnd:05d}" for rnd in range(1, 8)}
    assert all(state.verify(folder) is None for folder in folders.values())
    assert _segments(folders[1]) == [1] and len(state.client_files(folders[1])) == 2  # 686 states, files of 400
    for rnd in (2, 3, 4, 5, 7):  # one segment of exactly the round's states, the earlier ones linked
        assert _segments(folders[rnd]) == ([*range(1, rnd + 1)] if rnd < 7 else [6, 7])
        new = _new(folders[rnd], folders[rnd - 1])
        assert {state._client_order(name)[0] for name in new} == {rnd}
        held, size = _clients(folders[rnd], new)
        headers = sum(state._header(folders[rnd] / name)[1] for name in new)
        assert held == set(rounds[rnd]) and size == headers + sizes[rnd]
    assert state._empty(state._header(folders[2] / state.segment_name(2))[0]) == [499]  # its state became empty
    # round 6 compacts: the live set (330 states read from round 5's files, 700 from the round) as one base
    assert _segments(folders[6]) == [6] and len(new := _new(folders[6], folders[5])) == 3
    held, size = _clients(folders[6], new)
    assert held == {c for c in range(n) if plain[c]} and len(held) == 1029
    assert size == sum(state._header(folders[6] / name)[1] for name in new) + sum(map(state_bytes, plain))
    loaded = load_checkpoint(root, n)
    assert loaded is not None and all(_same(dict(sorted(a.items())), dict(sorted(b.items())))
                                      for a, b in zip(loaded[2], plain))
    again = load_checkpoint(root, n, into=ClientStates(n, 5 * one, tmp_path / "again"))
    assert again is not None and isinstance(again[2], ClientStates) and again[2].held <= 5 * one
    assert all(_same(a, b) for a, b in zip(again[2], loaded[2]))
    names = json.loads((folders[7] / state.MANIFEST).read_text())["sha256"]
    assert list(names) == ["global.safetensors", "server.safetensors", *state.client_files(folders[7]), "state.json"]
    store.close()


SCAFFOLD = ["seed=3", 'data.dataset="synthetic"', 'data.partition="given"', "data.num_clients=3000",
            "data.samples_per_client=20", "model.hidden=[8]", "train.rounds=4", "train.participation=0.002",
            "train.threads=1", 'algorithm.name="scaffold"', "eval.every=10", "eval.final_clients=50",
            'backend="simulation"']
BUDGET = 'train.client_state_memory="16KiB"'  # seven of SCAFFOLD's 2,312-byte states; 24 clients train


def test_a_scaffold_run_of_3000_clients_with_a_budget_killed_mid_round_resumes_identical_to_one_without(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "CHECKPOINT_SECONDS", 0.0)  # every round checkpointed: the links exercised
    whole = single.run(fedlatent.load_config(None, SCAFFOLD), tmp_path / "whole", echo=None, figures=False)
    config = fedlatent.load_config(None, [*SCAFFOLD, BUDGET])
    real_round, seen = simulation.run_round, []

    def killed(s, rnd):
        seen.append(s.client_states.held)
        if rnd == 2:
            assert (tmp_path / "cut" / FOLDER).is_dir()
            raise KeyboardInterrupt  # mid-round 3
        return real_round(s, rnd)

    monkeypatch.setattr(simulation, "run_round", killed)
    with pytest.raises(KeyboardInterrupt):
        single.run(config, tmp_path / "cut", echo=None, figures=False)
    assert max(seen) <= memory_budget("16KiB")
    second = tmp_path / "cut" / "checkpoints" / "round00002"
    names = state.client_files(second)  # the first write's full set, round 2's 6 clients' states
    assert names == [state.segment_name(1), state.segment_name(2)] and (second / names[0]).stat().st_nlink == 2
    monkeypatch.setattr(simulation, "run_round", real_round)
    resumed = single.run(config, tmp_path / "cut", resume=True, echo=None, figures=False)
    assert resumed["final"] == whole["final"]
    assert not (tmp_path / "cut" / FOLDER).exists()  # the store's files are scratch
    lines = [[{k: v for k, v in json.loads(line).items() if not k.startswith("time_")}
              for line in (tmp_path / side / "metrics.jsonl").read_text().splitlines()] for side in ("whole", "cut")]
    assert lines[0] == lines[1]
    a, b = (load_checkpoint(tmp_path / side / "checkpoints", 3000) for side in ("whole", "cut"))
    assert a is not None and b is not None and all(torch.equal(a[0][k], b[0][k]) for k in a[0])
    assert all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a[2], b[2]))
    assert sum(bool(x) for x in b[2]) == 24  # every trained client's c_i, through the disk


@pytest.mark.parametrize("backend", ["simulation", "vectorized"])
def test_a_ditto_run_with_a_budget_gives_the_numbers_of_the_run_without(backend: str, tmp_path: Path) -> None:
    ditto = [o for o in SCAFFOLD if not o.startswith(("algorithm", "data.num_clients", "train.participation",
                                                      "backend"))] + \
        ['algorithm.name="ditto"', "data.num_clients=200", "train.participation=0.05", "train.rounds=3",
         f'backend="{backend}"']
    plain = single.run(fedlatent.load_config(None, ditto), tmp_path / "plain", echo=None, figures=False)
    kept = single.run(fedlatent.load_config(None, [*ditto, 'train.client_state_memory="8KiB"']), tmp_path / "kept",
                      echo=None, figures=False)
    assert plain["final"] == kept["final"]
    assert "client_state_memory" in (tmp_path / "kept" / "config.toml").read_text()
    assert "client_state_memory" not in (tmp_path / "plain" / "config.toml").read_text()  # older folders resumable


def test_one_clients_state_is_measured_without_touching_the_runs_random_state() -> None:
    config = fedlatent.load_config(None, SCAFFOLD[:6] + ['algorithm.name="scaffold"'])
    spec = resolve(config.algorithm, config.terms)
    before = torch.random.get_rng_state()
    size = one_state_bytes(config, spec, (60,), 10)
    assert torch.equal(before, torch.random.get_rng_state())
    assert size == 4 * (60 * 8 + 8 + 8 * 10 + 10)  # SCAFFOLD's c_i: one float per trainable weight
    fedavg = fedlatent.load_config(None, SCAFFOLD[:6])
    assert one_state_bytes(fedavg, resolve(fedavg.algorithm, fedavg.terms), (60,), 10) == 0


def test_a_budget_below_one_clients_state_is_refused_and_the_default_is_left_out_of_config_toml() -> None:
    config = fedlatent.load_config(None, ['algorithm.name="scaffold"', 'train.client_state_memory="1KiB"'])
    with pytest.raises(ConfigError, match=r"^train\.client_state_memory = '1KiB': 1,024 bytes is below one client's"):
        validate(config)
    assert "client_state_memory" not in to_toml(fedlatent.load_config(None, []))


def test_a_run_started_without_a_budget_resumes_within_one_to_the_same_numbers(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    small = [o for o in SCAFFOLD if not o.startswith(("data.num_clients", "train.participation"))] + \
        ["data.num_clients=300", "train.participation=0.02"]
    monkeypatch.setattr(state, "CHECKPOINT_SECONDS", 0.0)
    whole = single.run(fedlatent.load_config(None, small), tmp_path / "whole", echo=None, figures=False)
    real_round = simulation.run_round

    def killed(s, rnd):
        if rnd == 2:
            raise KeyboardInterrupt
        return real_round(s, rnd)

    monkeypatch.setattr(simulation, "run_round", killed)
    with pytest.raises(KeyboardInterrupt):
        single.run(fedlatent.load_config(None, small), tmp_path / "cut", echo=None, figures=False)
    monkeypatch.setattr(simulation, "run_round", real_round)
    resumed = single.run(fedlatent.load_config(None, [*small, 'train.client_state_memory="5KiB"']), tmp_path / "cut",
                         resume=True, echo=None, figures=False)
    assert resumed["final"] == whole["final"]
