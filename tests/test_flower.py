"""backend = "flower": parity with the embedded backend, faults, the records between the halves.

The server's logic runs here through :class:`tests.flower_procs.InProcessGrid` (fedlatent's
ClientApp called in this process: fast, and a client can be made to fail by patching); the same
runs on Flower's simulation engine (Ray) are the slow parity tests, and ``test_flower_deploy.py``
starts real SuperLink and SuperNode processes.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedlatent[flower]')")

import fedlatent  # noqa: E402
from fedlatent.backends.flower import client_app, messages, server_app  # noqa: E402
from fedlatent.errors import ConfigError, DataError, RunStopped  # noqa: E402
from fedlatent.experiment import run as run_experiment  # noqa: E402
from fedlatent.federated.failures import ClientFailure  # noqa: E402
from fedlatent.data.types import ClientData, Split  # noqa: E402
from fedlatent.federated import driver, state  # noqa: E402
from fedlatent.federated.round import ClientTask  # noqa: E402
from fedlatent.methods import PRESETS  # noqa: E402
from fedlatent.methods.parts import Upload  # noqa: E402
from tests.conftest import in_ci_or_long  # noqa: E402
from tests.flower_procs import InProcessGrid  # noqa: E402

SMALL = ["data.num_clients=4", "train.rounds=3", "flower.supernodes=2", "flower.cpus=2"]
METHODS = {"fedavg": [], "scaffold": [], "feduv": [],
           "ditto_mkmmd": ["data.local_test_fraction=0.2", "algorithm.beta_every=3"]}
# calibration from statistics the clients send in an extra round of messages: FFC after training
# and every round, CCVR
CALIBRATED = {"spherefed": ['algorithm.name="spherefed"'],
              "spherefed_every_round": ['algorithm.name="spherefed"', "algorithm.ffc_every=1"],
              "ccvr": ['algorithm.name="ccvr"', "data.local_test_fraction=0.2"]}


def config(backend: str, extra=()):
    return fedlatent.load_config(Path(__file__).parents[1] / "configs" / "digits_fedavg.toml",
                                 [*SMALL, f'backend="{backend}"', *extra])


def record_globals(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, torch.Tensor]]:
    """The global state after each round of the runs that start from now on (until the next call),
    as the backends' shared loop (``driver.play_rounds``) snapshots it for its checkpoints."""
    seen: list[dict[str, torch.Tensor]] = []

    class Recording(state.Checkpoints):
        def save(self, **kwargs):
            seen.append({k: v.clone() for k, v in kwargs["global_state"].items()})
            return super().save(**kwargs)

    monkeypatch.setattr(driver, "Checkpoints", Recording)
    return seen


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def run_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str], grid=None):
    embedded_rounds = record_globals(monkeypatch)
    embedded = fedlatent.run(config("simulation", extra), tmp_path / "embedded")
    flower_rounds = record_globals(monkeypatch)
    flower = run_experiment(config("flower", extra), tmp_path / "flower", echo=None, grid=grid)
    return embedded, flower, embedded_rounds, flower_rounds


def assert_parity(embedded, flower, embedded_rounds, flower_rounds) -> None:
    assert len(embedded_rounds) == len(flower_rounds) == 3
    for rnd, (ours, theirs) in enumerate(zip(embedded_rounds, flower_rounds)):  # every round's global weights
        assert max_diff(ours, theirs) <= 1e-5, rnd
    assert abs(embedded["final"]["accuracy"] - flower["final"]["accuracy"]) <= 0.005
    for key in ("personalized_accuracy", "majority_baseline_accuracy"):
        assert (key in embedded["final"]) == (key in flower["final"])
        if key in embedded["final"]:
            assert abs(embedded["final"][key] - flower["final"][key]) <= 0.005
    assert flower["backend"] == "flower" and flower["status"] == "completed"


# every preset through the messages: the local test split for the personalised ones, the MMD
# constraints' kernels refreshed within the three rounds
PLAIN = ["train.momentum=0", "train.weight_decay=0"]  # pFedMe's and Per-FedAvg's papers' step: plain SGD
EVERY = {name: ["data.local_test_fraction=0.2", *{"ditto_mkmmd": ["algorithm.beta_every=3"],
                                                  "ditto_mmdd": ["algorithm.kernel_every=3", "algorithm.train_steps=2"],
                                                  "pfedme": PLAIN, "perfedavg": PLAIN,
                                                  }.get(name, [])] for name in PRESETS}


@pytest.mark.parametrize("method", in_ci_or_long(sorted(EVERY)))  # the other presets: --long
def test_parity_through_messages(method, tmp_path, monkeypatch):
    """The same config and seed through fedlatent's Flower apps (in-process grid, two nodes
    serving two clients each) and the embedded backend: the same weights every round and the same
    accuracies, for every preset."""
    extra = [f'algorithm.name="{method}"', *EVERY[method]]
    assert_parity(*run_both(tmp_path, monkeypatch, extra, grid=InProcessGrid(2)))


@pytest.mark.parametrize("name", sorted(CALIBRATED))
def test_calibration_parity_through_messages(name, tmp_path, monkeypatch):
    embedded, flower, embedded_rounds, flower_rounds = run_both(tmp_path, monkeypatch, CALIBRATED[name],
                                                                grid=InProcessGrid(2))
    assert_parity(embedded, flower, embedded_rounds, flower_rounds)
    assert max_diff(embedded_rounds[-1], flower_rounds[-1]) <= 1e-5
    for key in ("accuracy", "uncalibrated_accuracy"):
        assert embedded["final"][key] == pytest.approx(flower["final"][key], abs=1e-9)
    assert flower["final"]["bytes_calibration_up"] == embedded["final"]["bytes_calibration_up"] > 0


@pytest.mark.parametrize("method", ["fedavg", "fedrep", "spherefed"])
def test_clipping_codec_parity_through_messages(method, tmp_path, monkeypatch):
    """The update codec runs on the nodes as on the embedded backend: each client's update clipped
    to privacy.clip_norm (below every update's norm) before it travels, the same weights every round
    (the clients' own layers and a fixed head left out of the clip on both sides)."""
    extra = [f'algorithm.name="{method}"', "data.local_test_fraction=0.2", "privacy.clip_norm=0.1"]
    assert_parity(*run_both(tmp_path, monkeypatch, extra, grid=InProcessGrid(2)))


DP = {"fixed": [],
      # adaptive clipping: the clip norm travels in the payload, each client's bit in its extras
      "adaptive": ["privacy.target_quantile=0.5", "privacy.clip_count_noise=1.0"],
      # FFC every round: the nodes clip their statistics, the ServerApp noises the sums
      "ffc": ['algorithm.name="spherefed"', "algorithm.ffc_every=1", "privacy.statistics_clip_norm=50",
              "privacy.statistics_noise_multiplier=4"]}


@pytest.mark.parametrize("case", sorted(DP))
def test_dp_fedavg_parity_through_messages(case, tmp_path, monkeypatch):
    """DP-FedAvg through the messages: the nodes clip, the ServerApp adds the noise (seeded by the
    run's seed and round) in the codec's combine, as the embedded server does — the same weights
    every round, the same ε at δ in every metrics line and in summary.json (the final calibration's
    release counted in it), the same adaptive clip norm every round."""
    pytest.importorskip("dp_accounting", reason="the privacy extra (pip install 'fedlatent[privacy]')")
    extra = ["privacy.clip_norm=0.1", "privacy.noise_multiplier=0.5", "train.participation=0.5", *DP[case],
             'privacy.randomness="seeded"']  # parity needs the seed's draws (on Flower "auto" is secret)
    embedded, flower, embedded_rounds, flower_rounds = run_both(tmp_path, monkeypatch, extra, grid=InProcessGrid(2))
    assert_parity(embedded, flower, embedded_rounds, flower_rounds)
    lines = {name: [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
             for name in ("embedded", "flower")}
    for key in ("privacy_epsilon", "privacy_clip_norm"):
        assert [x.get(key) for x in lines["flower"]] == [x.get(key) for x in lines["embedded"]], key
    epsilons = [x["privacy_epsilon"] for x in lines["flower"]]
    assert epsilons == sorted(epsilons)
    assert flower["privacy_epsilon"] == embedded["privacy_epsilon"] >= epsilons[-1]
    assert ("privacy_clip_norm" in lines["flower"][-1]) == (case == "adaptive")
    assert flower["final"]["accuracy"] == embedded["final"]["accuracy"]


@pytest.mark.slow  # FedAvg's in CI (a minute); the others --long: their programs go through the messages above
@pytest.mark.parametrize("method", in_ci_or_long(sorted(METHODS), keep=("fedavg",)))
def test_parity_on_the_simulation_engine(method, tmp_path, monkeypatch):
    """The same on Flower's simulation engine (Ray): weights within 1e-5 every round, final
    accuracies within 0.5 points after three."""
    extra = [f'algorithm.name="{method}"', *METHODS[method]]
    embedded, flower, embedded_rounds, flower_rounds = run_both(tmp_path, monkeypatch, extra)
    assert_parity(embedded, flower, embedded_rounds, flower_rounds)
    lines = [json.loads(x) for x in (tmp_path / "flower" / "metrics.jsonl").read_text().splitlines()]
    assert [x["clients"] for x in lines] == [[0, 1, 2, 3]] * 3


def failing_client(monkeypatch: pytest.MonkeyPatch, client: int, error: Exception | None = None) -> None:
    """Make ``client``'s local update raise ``error`` (by default a RuntimeError, "disk full") on the
    nodes (the in-process grid's ClientApp)."""
    real = client_app.client_update

    def update(ws, spec, task, *args, **kwargs):
        if task.client_id == client:
            raise error or RuntimeError("disk full")
        return real(ws, spec, task, *args, **kwargs)

    monkeypatch.setattr(client_app, "client_update", update)


def test_a_raising_client_is_left_out_and_named(tmp_path, monkeypatch, capsys):
    failing_client(monkeypatch, 2)
    summary = run_experiment(config("flower", ['train.on_client_error="drop"']), tmp_path / "run", echo=None,
                             grid=InProcessGrid(2))
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(x["clients"] == [0, 1, 3] for x in lines)
    assert all(x["dropped"] == [{"client": 2, "kind": "error", "detail": "RuntimeError: disk full"}] for x in lines)
    assert [d["client"] for d in summary["clients_dropped"]] == [2, 2, 2]
    assert "round 1: client 2 left out: RuntimeError: disk full" in capsys.readouterr().err


def test_a_raising_client_stops_the_run_by_default(tmp_path, monkeypatch):
    failing_client(monkeypatch, 1)
    with pytest.raises(RunStopped, match=r"round 1, client 1: RuntimeError: disk full"):
        run_experiment(config("flower"), tmp_path / "run", echo=None, grid=InProcessGrid(2))


def test_a_config_error_on_a_node_is_the_user_s_whatever_the_policy(tmp_path, monkeypatch):
    """A ConfigError crosses the message boundary as such (kind "config"), not as a client to drop."""
    failing_client(monkeypatch, 2, ConfigError("algorithm.x = 1: refused on the node"))
    with pytest.raises(ConfigError, match=r"^algorithm.x = 1: refused on the node$"):
        run_experiment(config("flower", ['train.on_client_error="drop"']), tmp_path / "run", echo=None,
                       grid=InProcessGrid(2))


def test_a_silent_node_is_left_out_after_the_timeout(tmp_path):
    """Node 2 (clients 1 and 3) never replies: its clients are dropped, the run goes on."""
    grid = InProcessGrid(2)
    grid.silent.add(2)
    run_experiment(config("flower", ['train.on_client_error="drop"', "eval.personalized=\"never\""]),
                   tmp_path / "run", echo=None, grid=_census_first(grid))
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(x["clients"] == [0, 2] for x in lines)
    assert [d["client"] for d in lines[0]["dropped"]] == [1, 3]
    assert "no reply within flower.timeout" in lines[0]["dropped"][0]["detail"]


def _census_first(grid: InProcessGrid) -> InProcessGrid:
    """Let the silent nodes answer the census (they go silent afterwards)."""
    silent, grid.silent = set(grid.silent), set()
    real = grid.send_and_receive

    def send(messages, *, timeout=None):
        messages = list(messages)
        replies = real(messages, timeout=timeout)
        if any(m.metadata.message_type == "query.census" for m in messages):
            grid.silent = silent
        return replies

    grid.send_and_receive = send
    return grid


def test_too_few_replies_stop_the_round_with_a_clear_message(tmp_path, monkeypatch):
    failing_client(monkeypatch, 0)
    extra = ['train.on_client_error="drop"', "train.min_clients=4"]
    with pytest.raises(RunStopped, match=r"round 1: 3 client\(s\) left after dropping 1 \(client 0: RuntimeError: "
                                         r"disk full\), fewer than train.min_clients = 4"):
        run_experiment(config("flower", extra), tmp_path / "run", echo=None, grid=InProcessGrid(2))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "stopped" and "train.min_clients = 4" in summary["stop_reason"]


def test_client_state_lives_in_the_node_context(tmp_path):
    """SCAFFOLD's c_i is kept per client in its node's Context.state, one ArrayRecord per client."""
    grid = InProcessGrid(2)
    run_experiment(config("flower", ['algorithm.name="scaffold"', "train.rounds=1"]), tmp_path / "run",
                   echo=None, grid=grid)
    held = {node: sorted(ctx.state.array_records) for node, ctx in grid.contexts.items()}
    assert held == {1: ["client.0", "client.2"], 2: ["client.1", "client.3"]}
    state = messages.from_record(grid.contexts[1].state["client.0"])
    assert state and all(torch.isfinite(v).all() for v in state.values())


def test_resume_restores_client_states_from_the_checkpoint(tmp_path, monkeypatch):
    """A run stopped after round 2 and resumed on fresh nodes (empty contexts) ends with the
    weights of the uninterrupted run: the server hands each client its checkpointed state."""
    extra = ['algorithm.name="scaffold"']
    whole = record_globals(monkeypatch)
    run_experiment(config("flower", extra), tmp_path / "whole", echo=None, grid=InProcessGrid(2))
    uninterrupted = whole[-1]
    real_round = driver.play_round

    def crash(s, rnd):
        if rnd == 2:
            raise KeyboardInterrupt
        return real_round(s, rnd)

    monkeypatch.setattr(driver, "play_round", crash)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config("flower", extra), tmp_path / "cut", echo=None, grid=InProcessGrid(2))
    monkeypatch.setattr(driver, "play_round", real_round)
    resumed = record_globals(monkeypatch)
    run_experiment(config("flower", extra), tmp_path / "cut", resume=True, echo=None, grid=InProcessGrid(2))
    assert len(resumed) == 1  # round 3 only: round 2's checkpoint was written on the way out
    assert max_diff(uninterrupted, resumed[-1]) == 0.0


def test_restored_client_states_go_only_to_the_node_serving_each_client():
    """After a resume, the final report sends a checkpointed client state to its own node only,
    and none to a client this process has reached already (its node holds it) or that has none."""
    census = server_app.Census({0: 1, 1: 2, 2: 1, 3: 2}, [5] * 4, [0] * 4, [5] * 4)
    states = [{"w": torch.full((2,), float(cid))} for cid in range(3)] + [{}]
    run = server_app.ServerRun(grid=None, config=None, federation=None, spec=None, census=census,
                               client_states=states, contacted={2})
    own = run.restored_states()
    assert {node: sorted(records) for node, records in own.items()} == {1: ["client.0"], 2: ["client.1"]}
    assert torch.equal(messages.from_record(own[2]["client.1"])["w"], states[1]["w"])


def test_task_and_outcome_records_round_trip():
    """Tasks and outcomes come back from their records as they left: values, dtypes, NaN metrics."""
    shared = {"scaffold.c.w": torch.ones(2, 3)}
    tasks = [ClientTask(cid, 1, {"w": torch.randn(2, 3), "n": torch.tensor(7)}, shared, 0.05, 10, 1437, 900 + cid)
             for cid in (7, 3)]
    back = messages.unpack_tasks(messages.pack_tasks(tasks, {3: {"c": torch.zeros(2)}}))
    assert [t.client_id for t, _ in back] == [3, 7]
    (task, restore), (_, none) = back
    assert (task.round, task.lr, task.num_clients, task.total_samples, task.seed) == (1, 0.05, 10, 1437, 903)
    assert torch.equal(task.global_state["w"], tasks[0].global_state["w"]) and task.global_state["n"].dtype == torch.int64
    assert torch.equal(task.payload["scaffold.c.w"], shared["scaffold.c.w"])
    assert torch.equal(restore["c"], torch.zeros(2)) and none is None
    own = [ClientTask(cid, 0, {"w": torch.zeros(1)}, {"p": torch.full((1,), float(cid))}, 0.1, 2, 20, 5) for cid in (0, 1)]
    assert [float(t.payload["p"]) for t, _ in messages.unpack_tasks(messages.pack_tasks(own, {}))] == [0.0, 1.0]
    upload = Upload(3, {"w": torch.randn(2)}, 144, 5, 0.05, 0.9, {"scaffold": {"dc": torch.ones(1)}},
                    {"train_loss": float("nan"), "steps": 5})
    failure = ClientFailure(2, "nonfinite", "non-finite train loss (nan)")
    got = messages.unpack_outcomes(messages.pack_outcomes([(upload, {"personal.w": torch.ones(2)}), (failure, None)]))
    (u, state), (f, no_state) = got[3], got[2]
    assert (u.client_id, u.num_samples, u.steps, u.lr, u.momentum) == (3, 144, 5, 0.05, 0.9)
    assert torch.equal(u.state["w"], upload.state["w"]) and torch.equal(u.extras["scaffold"]["dc"], torch.ones(1))
    assert u.metrics["steps"] == 5 and u.metrics["train_loss"] != u.metrics["train_loss"]  # NaN kept
    assert torch.equal(state["personal.w"], torch.ones(2))
    assert f == failure and no_state is None


def test_withheld_entries_come_from_the_nodes_initial_model():
    """A ``train`` message without the withheld entries; the node completes the global model from
    its own initial one (in its key order), and its uploads leave out what the server asked."""
    glob = {"body": torch.randn(3), "head": torch.randn(2)}
    task = ClientTask(0, 0, glob, {}, 0.1, 1, 10, 5)
    content = messages.pack_tasks([task], {}, frozenset({"head"}), frozenset({"head"}))
    assert set(content["global"]) == {"body"} and messages.withheld(content) == ({"head"}, {"head"})
    initial = {"head": torch.zeros(2), "body": torch.ones(3)}
    (back, _), = messages.unpack_tasks(content, initial)
    assert list(back.global_state) == ["head", "body"]
    assert torch.equal(back.global_state["body"], glob["body"]) and torch.equal(back.global_state["head"], torch.zeros(2))
    upload = Upload(0, dict(glob), 10, 1, 0.1, 0.0, {}, {})
    assert set(messages.pack_outcomes([(upload, None)], {"head"})["weights.0"]) == {"body"}


def test_served_clients_follow_the_partition_id():
    assert client_app.served({"partition-id": 1, "num-partitions": 3}, 10) == [1, 4, 7]
    assert client_app.served({"partition-id": 4, "num-partitions": 10}, 10) == [4]
    assert client_app.served({"partition-id": 3, "num-partitions": 3}, 10) == []  # beyond the partitions: none
    with pytest.raises(ValueError, match="partition-id"):
        client_app.served({}, 10)


def test_a_run_record_is_parsed_once_and_a_nodes_clients_indexed_once():
    """Every message carries the run record: a node parses its text once (the same configuration
    back for the same text, a new one for another); the server's census answers which clients a node
    serves, training and held-out, in id order, from an index rather than a scan per message."""
    from fedlatent.backends.flower import node_view
    record = node_view.run_record(config("flower"))
    first = node_view.node_config(record)
    assert node_view.node_config(record) is first
    other = node_view.node_config(node_view.run_record(config("flower", ["train.lr=0.2"])))
    assert other is not first and other.train.lr == 0.2 and first.train.lr != 0.2
    census = server_app.Census({0: 7, 1: 8, 2: 7}, [5, 5, 5], [0, 0, 0], [0, 0, 0], new_node_of={3: 8})
    assert [census.clients_of(node) for node in (7, 8, 9)] == [[0, 2], [1, 3], []]


def test_a_node_serves_its_own_arrays_file(tmp_path, monkeypatch):
    """A SuperNode with ``data-path`` in its node config trains client partition-id on that file."""
    rng = np.random.default_rng(0)
    own = tmp_path / "mine.npz"
    np.savez(own, client0_train_x=rng.random((30, 1, 8, 8), dtype=np.float32),
             client0_train_y=rng.integers(0, 10, 30))
    sizes = {}
    real = client_app.client_update

    def update(ws, spec, task, data, *args, **kwargs):
        sizes[task.client_id] = len(data)
        return real(ws, spec, task, data, *args, **kwargs)

    monkeypatch.setattr(client_app, "client_update", update)
    summary = run_experiment(config("flower", ["data.num_clients=2", "train.rounds=1"]), tmp_path / "run", echo=None,
                             grid=InProcessGrid(2, {2: {"data-path": str(own)}}))
    assert summary["status"] == "completed"
    assert sizes[1] == 30 and sizes[0] > 500  # client 1 from the file, client 0 from digits


@pytest.mark.parametrize("case", ["no test split", "own file"])
def test_a_nodes_held_out_clients_are_refused_as_the_embedded_checks_refuse_them(case, tmp_path, monkeypatch):
    """A node's build sets the held-out clients apart (the server opens no data): one without a test
    split is refused there with the embedded run's line, and a node with its own file, which does
    not build the configured data set, refuses holding clients out of it before building anything."""
    monkeypatch.setattr(client_app, "_BUILT", {})  # no job kept from an earlier test
    own = tmp_path / "mine.npz"
    np.savez(own, client0_train_x=np.zeros((30, 1, 8, 8), dtype=np.float32), client0_train_y=np.zeros(30, np.int64))
    extra, nodes, says = {"no test split": (["data.num_clients=6", "data.holdout_clients=2"], {},
                                            r"^data.holdout_clients: held-out client\(s\) \[\d+, \d+\] have no test split"),
                          "own file": (["data.num_clients=4", "data.holdout_clients=1", "data.local_test_fraction=0.2"],
                                       {2: {"data-path": str(own)}}, "its own data-path does not build")}[case]
    with pytest.raises(ConfigError, match=says):
        run_experiment(config("flower", ["train.rounds=1", *extra]), tmp_path / "run", echo=None,
                       grid=InProcessGrid(2, nodes))
    if case == "no test split":  # the embedded run's line
        with pytest.raises(ConfigError) as embedded:
            fedlatent.run(config("simulation", ["train.rounds=1", *extra]), tmp_path / "embedded")
        assert re.match(says, str(embedded.value))


def test_auto_never_picks_flower(tmp_path):
    summary = fedlatent.run(fedlatent.load_config(None, ["train.rounds=1", 'backend="auto"']), tmp_path / "a")
    assert summary["backend"] in ("simulation", "vectorized")


def test_flower_backend_without_flower_is_a_config_error(tmp_path, monkeypatch):
    """Without the extra, backend = "flower" is refused in one line before any work (exit 2)."""
    from fedlatent.experiment.runner import validation
    real = validation.importlib.util.find_spec
    monkeypatch.setattr(validation.importlib.util, "find_spec", lambda name, *a: None if name == "flwr" else real(name, *a))
    with pytest.raises(ConfigError, match=r"backend = 'flower': Flower is not installed; pip install 'fedlatent\[flower\]'"):
        fedlatent.run(fedlatent.load_config(None, ['backend="flower"']), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_clients_no_node_serves_stop_the_run_after_the_census(tmp_path, monkeypatch):
    """Node 2 never answers the census: its clients have no node, the run stops with a summary."""
    monkeypatch.setattr(server_app, "CENSUS_WAIT_S", 0.5)
    grid = InProcessGrid(2)
    grid.silent.add(2)
    with pytest.raises(RunStopped, match=r"census: no SuperNode serves client\(s\) \[1, 3\]"):
        run_experiment(config("flower"), tmp_path / "run", echo=None, grid=grid)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["rounds_completed"] == 0


DIAGNOSED = {"test_split": ['diagnostics.which=["collapse","classifier","alignment","uniformity","per_class","tsne",'
                            '"data","flops"]', "diagnostics.clients=true", "diagnostics.max_samples=300"],
             "client_val_split": ['diagnostics.which=["collapse","uniformity","per_class","tsne"]',
                                  'diagnostics.split="val"', "data.val_fraction=0.2", "diagnostics.clients=true",
                                  "diagnostics.max_samples=100", "diagnostics.every=2"],
             # the global test split measured on the server, which reads the data set for it
             "server_test_split": ['diagnostics.which=["collapse","uniformity","per_class"]', "diagnostics.clients=true",
                                   "diagnostics.max_samples=300", "flower.server_reads_data=true"],
             # FedRep's own head is measured in the uploads: with the clients' models asked, it travels up
             "fedrep_uploads": ['diagnostics.which=["classifier","alignment","per_class"]', "diagnostics.clients=true",
                                'algorithm.name="fedrep"', "algorithm.head_epochs=1", "data.local_test_fraction=0.2"]}


def diagnostics_lines(run: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run / "diagnostics.jsonl").read_text().splitlines()]
    for line in lines:
        line.pop("time_s", None)
    return lines


def assert_close(a, b, path="") -> None:
    """Equal JSON values, numbers up to float rounding."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-4, abs=1e-6), path
    else:
        assert a == b, path


@pytest.mark.parametrize("name", sorted(DIAGNOSED))
def test_diagnostics_parity_through_messages(name, tmp_path, monkeypatch):
    """``[diagnostics]`` on Flower (client halves on the nodes, gathered in extra messages) write
    the embedded backend's ``diagnostics.jsonl``: the global test split measured on a node (or on
    the server that reads it), a validation split the clients hold, each client's local model,
    t-SNE and the data figures."""
    grid = InProcessGrid(2)
    run_both(tmp_path, monkeypatch, DIAGNOSED[name], grid=grid)
    asked = {"test_split": {"query.diagnostics", "query.tsne", "query.data"},
             "client_val_split": {"query.diagnostics", "query.tsne"}, "server_test_split": set(),
             "fedrep_uploads": {"query.diagnostics"}}
    assert {t for t in grid.sent if t in ("query.diagnostics", "query.tsne", "query.data")} == asked[name]
    embedded, flower = diagnostics_lines(tmp_path / "embedded"), diagnostics_lines(tmp_path / "flower")
    assert [(x["round"], x["model"]) for x in flower] == [(x["round"], x["model"]) for x in embedded]
    assert len({x["model"] for x in flower}) > 2  # the global model and clients' local models
    assert_close(embedded, flower)
    if "flops" in DIAGNOSED[name][0]:  # counted on the nodes, summed on the server
        assert all(x["flops"] > 0 for x in flower if x["model"] != "data")


class Recording(InProcessGrid):
    """An in-process grid that keeps the content of every ``train`` message and its replies."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.trains: list = []
        self.uploads: list = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout=timeout)
        if messages and messages[0].metadata.message_type == "train":
            self.trains += [m.content for m in messages]
            self.uploads += [r.content for r in replies]
        return replies


def weight_keys(content) -> set[str]:
    keys = set(content["global"]) if "global" in content else set()
    for name, record in content.array_records.items():
        if name.startswith("weights."):
            keys |= set(record)
    return keys


UNTRANSMITTED = {"spherefed": ['algorithm.name="spherefed"'],
                 "fedrep": ['algorithm.name="fedrep"', "algorithm.head_epochs=1", "data.local_test_fraction=0.2"],
                 "lg_fedavg": ['algorithm.name="lg_fedavg"', "data.local_test_fraction=0.2"]}


@pytest.mark.parametrize("name", sorted(UNTRANSMITTED))
def test_only_what_travels(name, tmp_path, monkeypatch):
    """The ``train`` messages and the uploads leave out what no client needs (SphereFed's fixed
    head, which each node builds from the run's seed; FedRep's and LG-FedAvg's own layers): the
    numbers are still the embedded backend's."""
    extra = UNTRANSMITTED[name]
    grid = Recording(2)
    embedded, flower, embedded_rounds, flower_rounds = run_both(tmp_path, monkeypatch, extra, grid=grid)
    assert_parity(embedded, flower, embedded_rounds, flower_rounds)
    assert max_diff(embedded_rounds[-1], flower_rounds[-1]) <= 1e-5
    untransmitted = set(flower_rounds[0]) - set().union(*(weight_keys(c) for c in grid.trains + grid.uploads))
    head = {k for k in flower_rounds[0] if k.startswith("classifier.")}
    # SphereFed's fixed head and FedRep's own head; LG-FedAvg's own layers are the body's, its head is shared
    assert untransmitted == head if name != "lg_fedavg" else (untransmitted and not untransmitted & head)
    assert all(set(c["withheld"]["down"]) == untransmitted for c in grid.trains)


def test_own_files_are_standardised_with_the_pooled_statistics(tmp_path, monkeypatch):
    """Two SuperNodes with their own (raw) files: the server pools their censuses (Σx, Σx², n) and
    each node standardises with the pooled mean and std — the float64 statistics of the two
    files' training samples together — so the run's numbers are those of the embedded backend on
    the same data standardised centrally."""
    rng = np.random.default_rng(3)
    raw = {c: {"train_x": rng.normal(2.0 + c, 1.5 + c, (40, 1, 8, 8)).astype(np.float32),
               "train_y": rng.integers(0, 10, 40), "test_x": rng.normal(2.5, 2.0, (15, 1, 8, 8)).astype(np.float32),
               "test_y": rng.integers(0, 10, 15)} for c in (0, 1)}
    pooled = np.concatenate([raw[c]["train_x"] for c in (0, 1)]).astype(np.float64)
    mean, std = pooled.mean(axis=(0, 2, 3)).reshape(-1, 1, 1), pooled.std(axis=(0, 2, 3)).reshape(-1, 1, 1)
    for c in (0, 1):
        np.savez(tmp_path / f"node{c}.npz", **{f"client0_{k}": v for k, v in raw[c].items()})
    central = {f"client{c}_{k}": ((v - mean) / std).astype(np.float32) if k.endswith("_x") else v
               for c in (0, 1) for k, v in raw[c].items()}
    np.savez(tmp_path / "central.npz", **central)
    seen = []
    real = client_app.normalized

    def spy(split, m, s):
        seen.append((m.double(), s.double()))
        return real(split, m, s)

    monkeypatch.setattr(client_app, "normalized", spy)
    extra = ['data.dataset="arrays"', f'data.path="{tmp_path / "central.npz"}"', 'data.partition="given"',
             "data.num_clients=2", "flower.supernodes=2"]
    grid = InProcessGrid(2, {1: {"data-path": str(tmp_path / "node0.npz")}, 2: {"data-path": str(tmp_path / "node1.npz")}})
    embedded, flower, embedded_rounds, flower_rounds = run_both(tmp_path, monkeypatch, extra, grid=grid)
    assert seen and all(torch.equal(m, seen[0][0]) and torch.equal(s, seen[0][1]) for m, s in seen)
    np.testing.assert_allclose(seen[0][0].numpy(), mean, rtol=1e-6)
    np.testing.assert_allclose(seen[0][1].numpy(), std, rtol=1e-6)
    assert max_diff(embedded_rounds[-1], flower_rounds[-1]) <= 1e-5
    assert flower["final"]["accuracy"] == pytest.approx(embedded["final"]["accuracy"], abs=1e-9)


def test_the_pooled_census_is_the_float64_statistics_of_the_files_together():
    """The nodes' censuses pooled in client-id order: mean and std of all their samples together."""
    rng = np.random.default_rng(4)
    parts = [rng.normal(c, 1 + c, (n, 3, 4, 4)) for c, n in enumerate((7, 20, 1))]
    census = server_app.Census({0: 1, 1: 2, 2: 3}, [7, 20, 1], [0] * 3, [0] * 3,
                               {c: client_app.own_census(ClientData(Split(torch.from_numpy(x), torch.zeros(len(x))),
                                                                    None, None)) for c, x in enumerate(parts)})
    got = census.normalization()
    together = np.concatenate(parts)
    np.testing.assert_allclose(got["mean"].numpy().ravel(), together.mean(axis=(0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(got["std"].numpy().ravel(), together.std(axis=(0, 2, 3)), rtol=1e-6)
    assert server_app.Census({0: 1}, [7], [0], [0]).normalization() is None


def test_the_engine_silences_rays_future_notice_and_nothing_else():
    """Ray's FutureWarning at ray.init (its text as Ray 2.55 words it) does not reach the user; other
    warnings do, and Flower's logger is back at its level afterwards."""
    import logging
    import warnings

    from fedlatent.backends.flower.engine import quiet_engine
    flwr_logger = logging.getLogger("flwr")
    before = flwr_logger.level
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_engine():
            assert flwr_logger.level == logging.ERROR
            warnings.warn("Tip: In future versions of Ray, Ray will no longer override accelerator visible devices "
                          "env var if num_gpus=0 or num_gpus=None (default).", FutureWarning, stacklevel=1)
            warnings.warn("something else", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else"]
    assert flwr_logger.level == before


def test_the_server_side_never_builds_a_clients_data(tmp_path, monkeypatch):
    """A Flower run's server (single.run, the engine, the ServerApp) holds only its view of the
    data: a pool is partitioned and split into clients only while a ClientApp handles a message,
    and the partition table comes from the nodes' census, equal to the embedded run's."""
    from fedlatent.data import federation
    grid = InProcessGrid(2)
    app, serving = grid.app, []

    def node(msg, context):
        serving.append(msg)
        try:
            return app(msg, context)
        finally:
            serving.pop()

    grid.app = node
    built = {"server": 0, "node": 0}
    real = federation._from_pool

    def counted(*args):
        built["node" if serving else "server"] += 1
        return real(*args)

    monkeypatch.setattr(federation, "_from_pool", counted)
    monkeypatch.setattr(client_app, "_BUILT", {})  # no job kept from an earlier test
    extra = ['data.partition="dirichlet"', "data.alpha=0.5", 'diagnostics.which=["collapse", "data"]']
    embedded, flower, *_ = run_both(tmp_path, monkeypatch, extra, grid=grid)
    assert built == {"server": 1, "node": 1}  # the embedded run's federation; the nodes' job (built once, kept)
    assert flower["status"] == "completed"
    for name in ("partition.json", "partition.txt"):
        assert (tmp_path / "flower" / name).read_text() == (tmp_path / "embedded" / name).read_text()


@pytest.mark.parametrize("data", [["data.local_test_fraction=0.2"],  # a pool, its global test split held out
                                  ['data.dataset="synthetic"', 'data.partition="given"', "data.samples_per_client=40"]])
def test_a_node_builds_and_reads_its_own_clients_alone(data, tmp_path, monkeypatch):
    """Every client a node builds or reads, through a whole run with held-out clients (the
    federation's clients are built when read: data.clients.Clients), is one it serves: the nodes'
    clients partition the federation, and no node's message handling touches another's — where the
    global test split is the clients' tests together (Synthetic) too: each node tallies its own."""
    from fedlatent.data import clients as clients_module
    grid = InProcessGrid(2)
    app, serving = grid.app, []

    def node(msg, context):
        serving.append(int(context.node_config["partition-id"]))
        try:
            return app(msg, context)
        finally:
            serving.pop()

    grid.app = node
    read: dict[int, set[int]] = {0: set(), 1: set()}
    real = clients_module._Cache.get

    def counted(self, pid):
        assert serving, "a client built outside a node's message handling"
        read[serving[-1]].add(pid)
        return real(self, pid)

    monkeypatch.setattr(clients_module._Cache, "get", counted)
    monkeypatch.setattr(client_app, "_BUILT", {})  # no job kept from an earlier test
    extra = ["data.num_clients=6", "data.holdout_clients=2", *data]
    summary = run_experiment(config("flower", extra), tmp_path / "flower", echo=None, grid=grid)
    assert summary["status"] == "completed"
    held = summary["final"]["new_client_partition_ids"]
    ids = [pid for pid in range(6) if pid not in held] + held  # run ids 0..5 in partition ids
    served = {k: {ids[cid] for cid in range(6) if cid % 2 == k} for k in (0, 1)}
    assert read == served


class OpenGuard:
    """Every path under ``root`` opened or listed (audit events ``open``, ``os.listdir``,
    ``os.scandir``) by the server's side of an in-process Flower run, and by its nodes: an event
    while the grid's ClientApp handles a message is the nodes'. Audit hooks stay for the process's
    life, so one hook serves every guard, acting only while one is armed."""

    armed: OpenGuard | None = None
    hooked = False

    def __init__(self, root: Path, grid: InProcessGrid) -> None:
        self.root, self.serving, self.seen = str(root.resolve()), 0, {"server": [], "node": []}
        app = grid.app

        def node(msg, context):
            self.serving += 1
            try:
                return app(msg, context)
            finally:
                self.serving -= 1

        grid.app = node
        if not OpenGuard.hooked:
            import sys
            sys.addaudithook(OpenGuard._event)
            OpenGuard.hooked = True

    @staticmethod
    def _event(event: str, args: tuple) -> None:
        guard = OpenGuard.armed
        if guard is None or event not in ("open", "os.listdir", "os.scandir") or not args:
            return
        path = args[0]
        if isinstance(path, (str, Path)) and os.path.abspath(path).startswith(guard.root):
            guard.seen["node" if guard.serving else "server"].append(str(path))

    def __enter__(self) -> OpenGuard:
        OpenGuard.armed = self
        return self

    def __exit__(self, *exc) -> None:
        OpenGuard.armed = None


@pytest.mark.parametrize("reads", [False, True])
def test_the_server_never_opens_the_data_folder(reads, tmp_path, monkeypatch):
    """An image-folder data set (no declared shape, one client per domain: the classes, input shape
    and clients come from the census) with a global test split: the ServerApp's side of the run opens
    nothing under data.root — the nodes evaluate the global model on their shares of the test split
    — and its scores are the embedded run's, to the bit. With flower.server_reads_data the server
    reads the folder itself (the guard's control)."""
    from tests.data.test_image_folder import _solid_tree
    _solid_tree(tmp_path / "tree", {"art": {"dog": 6, "house": 5}, "photo": {"dog": 5, "house": 6},
                                    "sketch": {"dog": 7, "house": 4}})
    monkeypatch.setattr(client_app, "_BUILT", {})  # no job kept from an earlier test
    extra = ['data.dataset="domains"', 'data.partition="domains"', f'data.root="{tmp_path / "tree"}"',
             "data.num_clients=auto", "data.test_fraction=0.3", "train.rounds=2", "eval.batch_size=4",
             'eval.personalized="never"', f"flower.server_reads_data={str(reads).lower()}"]
    embedded = fedlatent.run(config("simulation", extra), tmp_path / "embedded")
    grid = InProcessGrid(3)
    with OpenGuard(tmp_path / "tree", grid) as guard:
        flower = run_experiment(config("flower", extra), tmp_path / "flower", echo=None, grid=grid)
    assert guard.seen["node"]  # the guard sees the folder's files being read
    assert bool(guard.seen["server"]) == reads, guard.seen["server"][:3]
    assert ("evaluate.test" in grid.sent) != reads
    lines = {name: [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
             for name in ("embedded", "flower")}
    for key in ("test_accuracy", "test_balanced_accuracy", "test_loss"):
        assert [x[key] for x in lines["flower"]] == [x[key] for x in lines["embedded"]], key
    assert flower["final"] == embedded["final"]


def test_the_nodes_tell_the_number_of_clients_when_the_data_fix_it(tmp_path):
    """Partition 'domains' without data.num_clients: one client per domain, counted by the nodes."""
    from tests.data.test_image_folder import _solid_tree
    _solid_tree(tmp_path / "tree", {"art": {"dog": 6, "house": 5}, "photo": {"dog": 5, "house": 6},
                                    "sketch": {"dog": 7, "house": 4}})
    extra = ['data.dataset="domains"', 'data.partition="domains"', f'data.root="{tmp_path / "tree"}"',
             "data.num_clients=auto", "train.rounds=1", 'eval.personalized="never"']
    summary = run_experiment(config("flower", extra), tmp_path / "run", echo=None, grid=InProcessGrid(3))
    assert summary["status"] == "completed"
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])["clients"] == [0, 1, 2]
    assert len(json.loads((tmp_path / "run" / "partition.json").read_text())["counts"]) == 3


def test_nodes_that_disagree_on_the_number_of_clients_are_refused():
    assert server_app.Tally().num_clients(None) is None
    assert server_app.Tally(sizes={1: 3, 2: 3}).num_clients(None) == 3
    assert server_app.Tally(sizes={1: 3}).num_clients(3) == 3
    with pytest.raises(DataError, match=r"^census: the SuperNodes' data make different numbers of clients "
                                        r"\(SuperNode 1: 3, SuperNode 2: 4\)$"):
        server_app.Tally(sizes={1: 3, 2: 4}).num_clients(None)
    with pytest.raises(DataError, match=r"\(SuperNode 1: 3; the configuration: 4\)$"):
        server_app.Tally(sizes={1: 3}).num_clients(4)


def test_without_a_count_the_simulation_engine_needs_flower_supernodes():
    from fedlatent.backends.flower import engine
    from fedlatent.data.types import ServerView
    cfg = config("flower")  # flower.supernodes = 2
    view = ServerView(None, 10, (1, 8, 8), num_clients=None)
    with pytest.raises(ConfigError, match=r"^flower.supernodes: set it \(or data.num_clients\)"):
        engine.num_supernodes(dataclasses.replace(cfg, flower=dataclasses.replace(cfg.flower, supernodes=0)), view)
    assert engine.num_supernodes(cfg, view) == 2
    assert engine.num_supernodes(cfg, ServerView(None, 10, (1, 8, 8), num_clients=1)) == 1


@pytest.mark.slow
def test_on_the_simulation_engine_only_the_clientapps_build_clients(tmp_path, monkeypatch):
    """The engine's ClientApps run in Ray's worker processes and build their clients there; in
    this process (the ServerApp's) building a client's data raises."""
    from fedlatent.data import federation

    def refuse(*args):
        raise AssertionError("the server's process built a client's data")

    monkeypatch.setattr(federation, "_from_pool", refuse)
    summary = run_experiment(config("flower", ["train.rounds=1", 'eval.personalized="never"']), tmp_path / "run",
                             echo=None)
    assert summary["status"] == "completed"
    assert len(json.loads((tmp_path / "run" / "partition.json").read_text())["counts"]) == 4
