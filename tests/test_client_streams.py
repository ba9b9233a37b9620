"""Each client's own draws come from its stream seed (federated.randomness.Randomness.client_seed):
the run seed in a seeded run (every number as before), a secret of the server's key in a secret run,
sent to that client alone. On Flower no message a node receives carries the run seed, nor the stream
seed of a client it does not serve, and a node holding every message it received cannot compute
another client's batches; two secret runs draw other batches; a resumed secret run draws the
uninterrupted run's (the key is server state)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.federated import round as round_module
from fedlatent.federated.randomness import SECRET_KEY, Randomness
from fedlatent.seeding import LOCAL_TRAINING, NO_SEED, derive_seed
from tests.private_runs import small_config

DP = ["privacy.clip_norm=0.5", "privacy.noise_multiplier=0.8"]
RUN_SEED, DATA_SEED = 918273645, 4242  # distinctive, so that a message carrying either is found


def test_a_clients_stream_seed_is_the_run_seed_when_seeded_and_a_secret_of_the_key_when_secret() -> None:
    """Seeded: every client's stream seed is the run seed (the draws of the runs before). Secret: one
    63-bit seed per client, the same for one key, other for another key, none the run seed."""
    assert {Randomness("seeded", 7).client_seed(c) for c in range(50)} == {7}
    one, again, other = (Randomness("secret", 7, key) for key in (b"B" * 32, b"B" * 32, b"C" * 32))
    seeds = [one.client_seed(c) for c in range(50)]
    assert len(set(seeds)) == 50 and all(0 <= s < 2**63 for s in seeds) and 7 not in seeds
    assert seeds == [again.client_seed(c) for c in range(50)]
    assert not set(seeds) & {other.client_seed(c) for c in range(50)}


def test_a_seeded_tasks_generators_are_the_run_seeds_and_a_secret_ones_each_clients_own() -> None:
    """client_generators: one shared stream seed hashed for all clients at once (the seeded runs'
    generators, bit for bit); a seed per client, each client's (derive_seed(its seed, LOCAL_TRAINING,
    round, client))."""
    ids, secret = [0, 3, 5], Randomness("secret", 11, b"K" * 32)
    shared = [g.initial_seed() for g in round_module.client_generators(11, 2, ids)]
    assert shared == [derive_seed(11, LOCAL_TRAINING, 2, c) for c in ids]
    assert [g.initial_seed() for g in round_module.client_generators([11] * 3, 2, ids)] == shared
    own = [g.initial_seed() for g in round_module.client_generators([secret.client_seed(c) for c in ids], 2, ids)]
    assert own == [derive_seed(secret.client_seed(c), LOCAL_TRAINING, 2, c) for c in ids]
    assert not set(own) & set(shared)


def _recording_batches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """(round, client, seed of its local-training generator) of every embedded client round from now on."""
    seen: list[tuple[int, int, int]] = []
    real = simulation.client_generators

    def recording(seeds, rnd, client_ids):
        generators = real(seeds, rnd, client_ids)
        seen.extend((rnd, cid, g.initial_seed()) for cid, g in zip(client_ids, generators))
        return generators

    monkeypatch.setattr(simulation, "client_generators", recording)
    return seen


def _key_of(run: Path) -> bytes:
    from safetensors.torch import load_file
    last = sorted((run / "checkpoints").iterdir())[-1]
    return bytes(load_file(str(last / "server.safetensors"))[SECRET_KEY].tolist())


def test_two_secret_runs_draw_other_batches_each_from_its_key_and_seeded_runs_the_run_seeds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two secret runs of one configuration: every client round's generator differs between them,
    and each is derive_seed(the client's stream seed of the run's key, LOCAL_TRAINING, round,
    client), never the run seed's; a seeded run's are the run seed's (the numbers of the runs before)."""
    base = [*DP, 'backend="simulation"', "train.rounds=2", "eval.every=2"]
    draws = {}
    for name in ("secret0", "secret1", "seeded"):
        seen = _recording_batches(monkeypatch)
        mode = "seeded" if name == "seeded" else "secret"
        fedlatent.run(small_config(*base, f'privacy.randomness="{mode}"'), tmp_path / name)
        draws[name] = list(seen)
    assert all(len(d) == 6 for d in draws.values())  # 2 rounds × 3 clients
    assert [g for *_, g in draws["secret0"]] != [g for *_, g in draws["secret1"]]
    assert all(g == derive_seed(0, LOCAL_TRAINING, rnd, cid) for rnd, cid, g in draws["seeded"])
    for name in ("secret0", "secret1"):
        randomness = Randomness("secret", 0, _key_of(tmp_path / name))
        assert all(g == derive_seed(randomness.client_seed(cid), LOCAL_TRAINING, rnd, cid) for rnd, cid, g in draws[name])
        assert not {g for *_, g in draws[name]} & {g for *_, g in draws["seeded"]}


def test_a_resumed_secret_run_draws_the_batches_of_the_uninterrupted_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_at_round_2) -> None:
    """The OS's keys made B (the stopped run), C (its resume), B (a run never stopped): the resumed
    rounds' batches are drawn from key B, the one its checkpoint kept — those of the uninterrupted
    run, to the generator — and so are its final weights."""
    import secrets as secrets_module
    from safetensors.torch import load_file

    keys = iter([b"B" * 32, b"C" * 32, b"B" * 32])
    monkeypatch.setattr(secrets_module, "token_bytes", lambda n: next(keys))
    config = small_config("train.rounds=4", *DP, 'privacy.randomness="secret"', 'backend="simulation"')
    stopped = _recording_batches(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        fedlatent.run(config, tmp_path / "stopped")
    monkeypatch.setattr(simulation, "run_round", crash_at_round_2)  # the real round again
    fedlatent.run(config, tmp_path / "stopped", resume=True)
    stopped = list(stopped)
    whole = _recording_batches(monkeypatch)
    fedlatent.run(config, tmp_path / "whole")
    assert stopped == whole and len(whole) == 12
    key_b = Randomness("secret", 0, b"B" * 32)
    assert all(g == derive_seed(key_b.client_seed(cid), LOCAL_TRAINING, rnd, cid) for rnd, cid, g in whole)
    a, b = (load_file(str(sorted((tmp_path / run / "checkpoints").iterdir())[-1] / "global.safetensors"))
            for run in ("stopped", "whole"))
    assert all(torch.equal(a[k], b[k]) for k in a)


# Flower ----------------------------------------------------------------------------------------
flwr = pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedlatent[flower]')")

from fedlatent.backends.flower import node_view  # noqa: E402
from fedlatent.experiment import run as run_experiment  # noqa: E402
from tests.flower_procs import InProcessGrid  # noqa: E402

FLOWER = ['backend="flower"', "flower.supernodes=3", "flower.cpus=2"]


def test_a_nodes_configuration_holds_no_run_seed_and_any_draw_from_one_is_refused() -> None:
    """The run record: the configuration's text without the run seed, the data seed written out as
    data.seed (the run seed where data.seed is unset: the split every node builds alike), the
    randomness the server resolves ("auto" with noise on Flower: secret), the initial model's seeds;
    the node reads NO_SEED as its run seed, and a draw derived from it raises."""
    import tomllib
    record = node_view.run_record(small_config(*FLOWER, *DP, f"seed={RUN_SEED}"))
    text = tomllib.loads(str(record["config"]))
    assert "seed" not in text and text["data"]["seed"] == RUN_SEED
    node = node_view.node_config(record)
    assert (node.seed, node.data.seed, node.data_seed, node.privacy.randomness) == (NO_SEED, RUN_SEED, RUN_SEED, "secret")
    assert node_view.model_seeds(record) == simulation.init_seeds(RUN_SEED)
    with pytest.raises(ValueError, match="a Flower SuperNode is never sent it"):
        derive_seed(node.seed, LOCAL_TRAINING, 0, 0)
    own = node_view.run_record(small_config(*FLOWER, f"seed={RUN_SEED}", f"data.seed={DATA_SEED}"))
    assert str(RUN_SEED) not in str(own["config"]) and node_view.node_config(own).data_seed == DATA_SEED
    assert node_view.node_config(own).privacy.randomness == "seeded"  # no noise: "auto" is seeded


class CapturingGrid(InProcessGrid):
    """An in-process grid that keeps every message each node received (by node)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.received: dict[int, list] = {node: [] for node in self.contexts}

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        for msg in messages:
            self.received[msg.metadata.dst_node_id].append(msg)
        return super().send_and_receive(messages, timeout=timeout)


def _integers(message) -> set[int]:
    """Every integer a message's content holds: config values (lists, and the numbers of the TOML
    text), integer-valued array entries."""
    import re
    found: set[int] = set()
    for record in message.content.config_records.values():
        for value in record.values():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, bool):
                    continue
                if isinstance(item, int):
                    found.add(item)
                elif isinstance(item, (str, bytes)):
                    text = item if isinstance(item, str) else item.decode("latin-1")
                    found |= {int(n) for n in re.findall(r"\d+", text)}
    for record in message.content.array_records.values():
        for array in record.values():
            t = torch.from_numpy(array.numpy().copy()).flatten()
            values = t if not t.is_floating_point() else t[(t == t.round()) & (t.abs() < 2**53)]
            found |= {int(v) for v in values.to(torch.float64 if t.is_floating_point() else torch.int64).tolist()}
    return found


def test_on_flower_a_node_receives_no_run_seed_and_cannot_compute_another_clients_batches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A secret FedBABU run of six clients (one held out) on three in-process nodes, with t-SNE, the
    personalised reports and the new client's fine-tuning: no message a node receives holds the run
    seed (nor the data seed but as data.seed); each node is sent the stream seeds of its own clients
    (training and held out) and no other's; and from every integer a node received, with the run
    seed besides (public in a secret run), no candidate seed gives another client's batch
    permutation of any round, which the node serving it drew from the stream seed of the server's key."""
    drawn: list[tuple[int, int, int]] = []  # (round, client, seed of its generator) on the nodes
    real = round_module.client_generator

    def recording(seed, task):
        generator = real(seed, task)
        drawn.append((task.round, task.client_id, generator.initial_seed()))
        return generator

    monkeypatch.setattr(round_module, "client_generator", recording)
    grid = CapturingGrid(3)
    config = small_config(*FLOWER, f"seed={RUN_SEED}", f"data.seed={DATA_SEED}", "train.rounds=2",  # t-SNE: no noise
                          'privacy.randomness="secret"', 'algorithm.name="fedbabu"', "data.holdout_clients=1",
                          "data.local_test_fraction=0.2", 'diagnostics.which=["tsne"]')
    summary = run_experiment(config, tmp_path / "run", echo=None, grid=grid)
    assert summary["status"] == "completed" and summary["final"]["new_clients"] == [5]
    randomness = Randomness("secret", RUN_SEED, _key_of(tmp_path / "run"))
    stream = {cid: randomness.client_seed(cid) for cid in range(6)}
    served = {node: set(range(node - 1, 6, 3)) for node in grid.contexts}  # partition-id k of 3: ids ≡ k (mod 3)
    types = {m.metadata.message_type for msgs in grid.received.values() for m in msgs}
    assert {"train", "query.tsne", "evaluate.report", "evaluate.new"} <= types
    for node, messages in grid.received.items():
        held = set().union(*(_integers(m) for m in messages))
        assert RUN_SEED not in held
        for m in messages:
            if node_view.STREAMS in m.content.config_records:
                record = m.content[node_view.STREAMS]
                assert dict(zip(record["clients"], record["seeds"])) == {c: stream[c] for c in sorted(served[node])}
        assert {stream[c] for c in served[node]} <= held  # its own clients' seeds reached it
        others = set(range(6)) - served[node]
        assert not held & {stream[c] for c in others}
        theirs = [(rnd, cid, seed) for rnd, cid, seed in drawn if cid in others]
        assert theirs  # the other nodes' clients trained
        candidates = {c for c in held if c >= 0} | {RUN_SEED, DATA_SEED}
        for rnd, cid, seed in theirs:
            assert seed == derive_seed(stream[cid], LOCAL_TRAINING, rnd, cid)  # the real draw: the server's key's
            perm = lambda s: torch.randperm(300, generator=torch.Generator().manual_seed(s))  # noqa: E731
            real_perm = perm(seed)
            assert not any(torch.equal(perm(derive_seed(c, LOCAL_TRAINING, rnd, cid)), real_perm) for c in candidates)
    assert {(rnd, cid) for rnd, cid, _ in drawn} == {(rnd, cid) for rnd in range(2) for cid in
                                                     json.loads((tmp_path / "run" / "metrics.jsonl").read_text()
                                                                .splitlines()[rnd])["clients"]}


def test_on_flower_a_resumed_secret_run_sends_the_stream_seeds_of_the_key_its_checkpoint_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys B (a run never stopped), B (a run stopped after round 2), C (its resume, on fresh nodes):
    the resumed ServerApp adopts B from its checkpoint before it sends a train message, so round 3's
    batches are drawn from B's stream seeds and the final weights are the uninterrupted run's."""
    import secrets as secrets_module

    from fedlatent.federated import driver
    from safetensors.torch import load_file

    keys = iter([b"B" * 32, b"B" * 32, b"C" * 32])
    monkeypatch.setattr(secrets_module, "token_bytes", lambda n: next(keys))
    drawn: list[tuple[int, int, int]] = []
    real_generator = round_module.client_generator

    def recording(seed, task):
        generator = real_generator(seed, task)
        drawn.append((task.round, task.client_id, generator.initial_seed()))
        return generator

    monkeypatch.setattr(round_module, "client_generator", recording)
    config = small_config(*FLOWER, 'privacy.randomness="secret"', "data.num_clients=3", "train.participation=1")
    run_experiment(config, tmp_path / "whole", echo=None, grid=InProcessGrid(3))
    whole = list(drawn)
    real_round = driver.play_round

    def crash(s, rnd):
        if rnd == 2:
            raise KeyboardInterrupt
        return real_round(s, rnd)

    monkeypatch.setattr(driver, "play_round", crash)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path / "cut", echo=None, grid=InProcessGrid(3))
    monkeypatch.setattr(driver, "play_round", real_round)
    drawn.clear()
    run_experiment(config, tmp_path / "cut", resume=True, echo=None, grid=InProcessGrid(3))
    assert drawn == [d for d in whole if d[0] == 2] and len(drawn) == 3
    key_b = Randomness("secret", 0, b"B" * 32)
    assert all(g == derive_seed(key_b.client_seed(cid), LOCAL_TRAINING, rnd, cid) for rnd, cid, g in whole)
    a, b = (load_file(str(sorted((tmp_path / run / "checkpoints").iterdir())[-1] / "global.safetensors"))
            for run in ("whole", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)
