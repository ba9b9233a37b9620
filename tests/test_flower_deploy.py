"""fedlatent on a real Flower deployment: a ``flower-superlink`` and ``flower-supernode`` processes on
127.0.0.1 with TLS and SuperNode authentication on, the run submitted with ``flwr run`` as the
README's recipe does (``tests/flower_procs.py`` starts and always kills them)."""
from __future__ import annotations

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
    processes logging its reads of the digits data set's file (the open guard)."""
    import sklearn.datasets
    fed = LocalFederation(tmp_path_factory.mktemp("flower"), 3)
    fed.guarded = Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz"
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
    never opened the data set's file, the ClientApps' did."""
    flwr_run(federation, tmp_path / "run", "train.rounds=1")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["backend"], summary["rounds_completed"]) == ("completed", "flower", 1)
    assert 0.1 < summary["final"]["accuracy"] <= 1.0
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["clients"] == [0, 1, 2] and not line.get("dropped")
    assert_only_the_clientapps_opened_the_data(federation)
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
