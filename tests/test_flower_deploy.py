"""fedlatent on a real Flower deployment: a ``flower-superlink`` and ``flower-supernode`` processes on
127.0.0.1 with TLS and SuperNode authentication on, the run submitted with ``flwr run`` as the
README's recipe does (``tests/flower_procs.py`` starts and always kills them)."""
from __future__ import annotations

import ast
import json
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedlatent[flower]')")

from tests.flower_procs import LocalFederation  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """A SuperLink and three registered SuperNodes (partition-id 0, 1, 2 of 3), each of their
    processes logging its reads of the digits data set's file (the open guard) and each ClientApp
    the messages it is handed."""
    import sklearn.datasets
    fed = LocalFederation(tmp_path_factory.mktemp("flower"), 3)
    fed.guarded = Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz"
    fed.logs_messages = True
    try:
        fed.start_superlink()
        for index in range(3):
            fed.start_supernode(index)
        yield fed
    finally:
        fed.stop()


def flwr_run(fed: LocalFederation, out: Path, overrides: str):
    """``flwr run`` of this checkout's app on the test SuperLink, streaming until the run ends."""
    done = fed.flwr("run", str(ROOT), "test", "--stream", "--run-config",
                    f'overrides="data.num_clients=3; train.rounds=3; eval.personalized=never; {overrides}" '
                    f'out="{out}"', timeout=900)  # an evaluation is an exchange too: ~20 on two cores
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + fed.logs()
    return done


def assert_only_the_clientapps_opened_the_data(fed: LocalFederation) -> None:
    """The open guard's log: a ServerApp process started and never opened the data set's file; a
    ClientApp's process did."""
    seen = fed.guard_lines()
    assert ("flwr-serverapp", "started") in seen, seen[:5]
    assert not [x for x in seen if x[0] == "flwr-serverapp" and x[1] != "started"]
    assert [x for x in seen if x[0] != "flwr-serverapp" and x[1].startswith("open ")], seen[:5]


RUN_SEED, DATA_SEED = 918273645, 4242  # distinctive, so that a message carrying either is found


def assert_no_message_carries_the_run_seed(fed: LocalFederation) -> None:
    """Every message the nodes' ClientApps were handed (the census, the train messages, the
    evaluations): none holds the run seed, in its configuration's text, its numbers or its integer
    arrays; each node was sent the stream seed of its own client and of no other."""
    received = fed.received()
    assert {"query.census", "train", "evaluate.test"} <= {m["type"] for m in received}, received[:3]
    seeds: dict[str, set[int]] = {}
    for m in received:
        assert str(RUN_SEED) not in json.dumps(m["config"]) and RUN_SEED not in m["ints"], m["type"]
        if "streams" in m["config"]:
            streams = ast.literal_eval(m["config"]["streams"])
            assert streams["clients"] == [int(m["node"])], m  # partition-id k of 3 serves client k alone
            seeds.setdefault(m["node"], set()).update(streams["seeds"])
    assert sorted(seeds) == ["0", "1", "2"] and all(len(s) == 1 for s in seeds.values())
    for m in received:
        others = set().union(*(s for node, s in seeds.items() if node != m["node"]))
        assert not any(str(seed) in json.dumps(m["config"]) for seed in others), m["type"]


def assert_each_process_built_one_nodes_clients(fed: LocalFederation) -> None:
    """The open guard's log of built clients: the ServerApp's process built none, and each
    ClientApp's process only clients of the one node it serves (partition ids of one residue mod 3:
    here its one client), never the whole federation."""
    built: dict[str, set[int]] = {}
    for program, what in fed.guard_lines():
        if what.startswith("built "):
            _, pid, cid = what.split()
            assert program != "flwr-serverapp", "the ServerApp's process built a client"
            built.setdefault(pid, set()).add(int(cid))
    assert built and all(len({cid % 3 for cid in cids}) == 1 for cids in built.values()), built


def test_one_round_on_three_supernodes_completes_and_the_serverapp_never_opens_the_data(federation, tmp_path):
    """The README's deployment recipe at CI's budget: one round of FedAvg on the three SuperNodes,
    each node's client served and the global model evaluated on the nodes; the ServerApp's process
    never opened the data set's file, the ClientApps' did. The run is secret: no message a node
    received carries the run seed, nor another node's client's stream seed."""
    flwr_run(federation, tmp_path / "run", f"train.rounds=1; seed={RUN_SEED}; data.seed={DATA_SEED}; "
                                           "privacy.randomness=secret")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["backend"], summary["rounds_completed"]) == ("completed", "flower", 1)
    assert 0.1 < summary["final"]["accuracy"] <= 1.0
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["clients"] == [0, 1, 2] and not line.get("dropped")
    assert_only_the_clientapps_opened_the_data(federation)
    assert_no_message_carries_the_run_seed(federation)
    assert_each_process_built_one_nodes_clients(federation)


@pytest.mark.long  # two rounds and the SecAgg+ stages: minutes on two cores
def test_ffc_under_secagg_on_three_supernodes_is_ffc_in_the_clear(federation, tmp_path):
    """SphereFed + FFC under SecAgg+ on the three SuperNodes (each client a party; the run before the
    one that kills a node): the global model after round 2, its head calibrated by FFC from the
    masked statistics' sum, is within 1e-4 of FFC in the clear (the embedded run of the same
    configuration: its checkpoint of round 2), and so is the final accuracy. The ServerApp's
    process never opened the data set's file; the ClientApps' did."""
    import fedlatent
    from safetensors.torch import load_file

    overrides = ["algorithm.name=spherefed", "algorithm.ffc_every=2", "train.rounds=2"]  # bare strings: inside quotes
    flwr_run(federation, tmp_path / "secure", "; ".join([*overrides, "privacy.secure_aggregation=secaggplus"]))
    clear = fedlatent.run(fedlatent.load_config(ROOT / "configs" / "digits_fedavg.toml", [
        "data.num_clients=3", "eval.personalized=never", *overrides]), tmp_path / "clear")
    secure = json.loads((tmp_path / "secure" / "summary.json").read_text())
    assert (secure["status"], secure["rounds_completed"]) == ("completed", 2)
    ours, theirs = (load_file(str(tmp_path / run / "checkpoints" / "round00002" / "global.safetensors"))
                    for run in ("clear", "secure"))
    assert ours.keys() == theirs.keys()
    assert max(float((ours[k].double() - theirs[k].double()).abs().max()) for k in ours) <= 1e-4
    assert secure["final"]["accuracy"] == pytest.approx(clear["final"]["accuracy"], abs=1e-9)
    assert_only_the_clientapps_opened_the_data(federation)


@pytest.mark.long  # two rounds and the SecAgg+ stages: minutes on two cores
def test_distributed_dp_under_secagg_on_three_supernodes_is_the_embedded_run(federation, tmp_path):
    """FedAvg with distributed Skellam DP under SecAgg+ on the three SuperNodes: each node's client
    adds its noise share to its clipped, rotated, rounded update and masks that integer vector in
    Z_{2^20}; the server unmasks the modular sum and decodes it. Seeded (the nodes are sent the
    round's rotation seed and their clients' noise seeds), the global model after round 2 is within
    1e-4 of the embedded distributed DP run's checkpoint, ε (at the worst case of t = 2 clients,
    SecAgg+'s threshold and train.min_clients) is its, and so is the final accuracy within a point.
    (Through the in-process messages the weights are the embedded run's to the bit; the nodes'
    processes may round their training's last bits apart: 4.2e-7 observed.)"""
    import fedlatent
    from safetensors.torch import load_file

    overrides = ["train.rounds=2", "privacy.clip_norm=1.0", "privacy.noise_multiplier=0.7", "privacy.distributed=skellam",
                 "privacy.randomness=seeded", "train.min_clients=2"]  # bare strings: inside quotes
    flwr_run(federation, tmp_path / "secure", "; ".join([*overrides, "privacy.secure_aggregation=secaggplus"]))
    clear = fedlatent.run(fedlatent.load_config(ROOT / "configs" / "digits_fedavg.toml", [
        "data.num_clients=3", "eval.personalized=never", *overrides]), tmp_path / "clear")
    secure = json.loads((tmp_path / "secure" / "summary.json").read_text())
    assert (secure["status"], secure["rounds_completed"]) == ("completed", 2)
    ours, theirs = (load_file(str(tmp_path / run / "checkpoints" / "round00002" / "global.safetensors"))
                    for run in ("clear", "secure"))
    assert ours.keys() == theirs.keys()
    diff = max(float((ours[k].double() - theirs[k].double()).abs().max()) for k in ours)
    print(f"distributed DP on three SuperNodes: round 2's weights within {diff:.3g} of the embedded run's")
    assert diff <= 1e-4
    assert secure["privacy_epsilon"] == clear["privacy_epsilon"] > 0
    assert secure["final"]["accuracy"] == pytest.approx(clear["final"]["accuracy"], abs=0.01)


@pytest.mark.long  # three rounds, one waiting out flower.timeout: minutes on two cores
def test_three_supernodes_run_and_one_killed_during_a_round_does_not_stop_the_run(federation, tmp_path):
    """One run on the three SuperNodes (one ``flwr run``: each starts app processes, a minute or more
    on two cores): round 1 is served by every node; then SuperNode 2 is killed once it has received
    its second round's task, so its client is left out of that round (no reply within flower.timeout)
    and of the next (the node is gone), and the run still completes its three rounds."""
    victim = federation.nodes[2]
    before = victim.text().count("Receiving: train message")  # the module's earlier runs

    def kill_in_round_2() -> None:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and victim.text().count("Receiving: train message") < before + 2:
            time.sleep(0.2)
        victim.kill()

    killer = threading.Thread(target=kill_in_round_2, daemon=True)
    killer.start()
    flwr_run(federation, tmp_path / "run", 'flower.timeout=60.0; train.on_client_error=drop')
    killer.join(timeout=10)
    assert not victim.alive()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["backend"], summary["rounds_completed"]) == ("completed", "flower", 3)
    assert 0.5 < summary["final"]["accuracy"] <= 1.0
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["clients"] == [0, 1, 2] and not lines[0].get("dropped")  # every node served round 1
    assert lines[1]["clients"] == lines[2]["clients"] == [0, 1]
    assert [d["client"] for d in lines[1]["dropped"]] == [2]
    assert {d["client"] for d in summary["clients_dropped"]} == {2}
    assert (tmp_path / "run" / "checkpoints" / "round00003" / "manifest.json").is_file()


def test_a_supernode_with_an_unregistered_key_is_refused(federation):
    """With SuperNode authentication on, a node whose public key was never registered cannot join."""
    stranger = federation.start_supernode(9, register=False, partitions=10)
    deadline = time.monotonic() + 120
    while stranger.alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not stranger.alive() and stranger.popen.returncode != 0
    assert "Failed to activate SuperNode" in stranger.text()
    listed = federation.flwr("supernode", "list", "test", "--format", "json")
    assert listed.returncode == 0 and len(json.loads(listed.stdout)["nodes"]) <= 3, listed.stdout


def refused(fed: LocalFederation, out: Path, overrides: str, term: str) -> None:
    """``flwr run`` with ``overrides`` ends at the census, refused by the node naming ``term``: no
    round trained, no summary written."""
    done = fed.flwr("run", str(ROOT), "test", "--stream", "--run-config",
                    f"overrides='data.num_clients=3; train.rounds=1; eval.personalized=never; {overrides}' "
                    f'out="{out}"', timeout=900)  # single quotes: a TOML literal string, which may hold "
    told = done.stdout + done.stderr + fed.logs()
    assert f"node terms: {term}" in told, told[-6000:]
    assert not (out / "summary.json").exists() or json.loads((out / "summary.json").read_text())["status"] != "completed"
    assert not (out / "checkpoints").exists()


def test_a_node_s_own_terms_refuse_clear_uploads_and_t_sne(federation, tmp_path):
    """A fourth SuperNode serving client 0 beside node 0, its --node-config pinning it to secure
    aggregation and not answering t-SNE: a ServerApp asking for clear uploads is refused at the
    census naming require-secagg, a secure one asking for t-SNE naming answer-tsne; the node is then
    stopped and unregistered (the module's other runs see three nodes)."""
    before = {n["node-id"] for n in json.loads(federation.flwr("supernode", "list", "test", "--format", "json")
                                               .stdout)["nodes"]}
    online = len(_online(federation))  # three, or two after the long test that kills a node
    pinned = federation.start_supernode(3, partition=0, terms="require-secagg=true answer-tsne=false")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(_online(federation)) <= online:
            time.sleep(1.0)
        assert len(_online(federation)) > online, federation.logs()
        refused(federation, tmp_path / "clear", "", "require-secagg = true")
        refused(federation, tmp_path / "tsne", 'privacy.secure_aggregation=secaggplus; diagnostics.which=["tsne"]',
                "answer-tsne = false")
    finally:
        pinned.kill()
        for node in {n["node-id"] for n in json.loads(federation.flwr("supernode", "list", "test", "--format",
                                                                      "json").stdout)["nodes"]} - before:
            federation.flwr("supernode", "unregister", str(node), "test")


def _online(fed: LocalFederation) -> list[dict]:
    listed = json.loads(fed.flwr("supernode", "list", "test", "--format", "json").stdout)["nodes"]
    return [n for n in listed if n["status"] == "online"]
