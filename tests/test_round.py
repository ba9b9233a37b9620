"""The round at a message boundary (``federated/round.py``): the halves driven by hand reproduce the
embedded backend's round exactly, reply order cannot change the numbers, the client half leaves
the state it is given alone, and a client's own non-finite state becomes its failure."""
from __future__ import annotations

import copy

import pytest
import torch

from fedlatent.backends import simulation
from fedlatent.data.federation import build_federation
from fedlatent.federated.failures import ClientFailure
from fedlatent.federated.round import (checked, checked_all, client_update, close_round, local_settings, plan_round,
                                       sample_clients)
from fedlatent.methods import resolve
from fedlatent.methods.parts import Upload

from tests.methods.test_ditto import small_config


def _setup(name: str, **algorithm):
    config = small_config(name, rounds=2, **algorithm)
    config.train.participation = 0.75
    fed = build_federation(config.data, config.data_seed)
    return simulation.setup(config, fed, resolve(config.algorithm, config.terms))


def _by_hand(s, rnd: int, reverse: bool = False):
    """One round through plan_round → client_update per task → close_round, with the clients'
    states kept here; replies handed back in reverse client order when ``reverse``."""
    fed, cfg = s.federation, s.config
    tasks = plan_round(s.server, cfg, rnd, [len(c.train) for c in fed.clients])
    outcomes, states = [], {}
    for task in tasks:
        settings = local_settings(cfg.train, task.lr, cfg.train.local_epochs, fed.augment, fed.num_classes, s.device)
        upload, states[task.client_id] = client_update(s.workspace, s.spec, task, fed.clients[task.client_id].train,
                                                       s.client_states[task.client_id], settings)
        outcomes.append(upload)
    result = close_round(s.server, cfg, rnd, tasks, outcomes[::-1] if reverse else outcomes)
    for upload in result.uploads:
        s.client_states[upload.client_id] = states[upload.client_id]
    return tasks, result


@pytest.mark.parametrize("name,algorithm", [("scaffold", {}), ("ditto_mkmmd", {})])
@pytest.mark.parametrize("reverse", [False, True])
def test_the_halves_by_hand_are_the_embedded_round(name: str, algorithm: dict, reverse: bool) -> None:
    ref, got = _setup(name, **algorithm), _setup(name, **algorithm)
    for rnd in range(2):
        line = simulation.run_round(ref, rnd)
        tasks, result = _by_hand(got, rnd, reverse)
        assert [t.client_id for t in tasks] == line["clients"] == [u.client_id for u in result.uploads]
        assert result.metrics["train_loss"] == line["train_loss"]
        assert result.metrics["bytes_down"] == line["bytes_down"] and result.metrics["bytes_up"] == line["bytes_up"]
    for k, v in ref.server.global_state.items():
        assert torch.equal(got.server.global_state[k], v), k
    for k, v in ref.server.state.items():
        assert torch.equal(got.server.state[k], v), k
    for a, b in zip(ref.client_states, got.client_states):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_plan_round_tasks_follow_the_census_in_client_order() -> None:
    s = _setup("scaffold")
    _by_hand(s, 0)  # the server's c exists from the first aggregation on
    census = [7, 11, 13, 17]
    tasks = plan_round(s.server, s.config, 1, census)
    assert [t.client_id for t in tasks] == sample_clients(s.config.seed, 1, 4, 0.75) == sorted(t.client_id for t in tasks)
    assert len(tasks) == 3
    assert all(t.total_samples == sum(census) and t.num_clients == 4 and t.round == 1 for t in tasks)
    assert all(t.lr == s.config.train.lr and t.global_state is s.server.global_state for t in tasks)
    expected = {k for part in s.spec.all_parts() for k in part.payload(s.server.state)}
    assert expected and set(tasks[0].payload) == expected  # SCAFFOLD's c, flat under its part's prefix


def test_client_update_leaves_the_given_state_alone() -> None:
    s = _setup("scaffold")
    _by_hand(s, 0)
    task = plan_round(s.server, s.config, 1, [len(c.train) for c in s.federation.clients])[0]
    cid, fed, cfg = task.client_id, s.federation, s.config
    state = s.client_states[cid]
    assert state  # SCAFFOLD's c_i after the first round (every client of round 0 kept one)
    before = copy.deepcopy(state)
    settings = local_settings(cfg.train, task.lr, 1, fed.augment, fed.num_classes, s.device)
    _, new = client_update(s.workspace, s.spec, task, fed.clients[cid].train, state, settings)
    assert state.keys() == before.keys() and all(torch.equal(state[k], before[k]) for k in state)
    assert any(not torch.equal(new[k], state[k]) for k in state)


def test_a_client_s_nonfinite_state_is_its_own_failure_and_the_server_drops_it() -> None:
    s = _setup("fedavg")
    s.config.train.on_nonfinite = "drop"
    tasks = plan_round(s.server, s.config, 0, [len(c.train) for c in s.federation.clients])
    uploads = [Upload(t.client_id, {k: v.clone() for k, v in t.global_state.items()}, 10, 1, t.lr, 0.0,
                      metrics={"train_loss": 1.0, "train_seconds": 0.0}) for t in tasks]
    bad = checked(uploads[1], {"personal.w": torch.tensor([float("nan")])})
    assert bad == ClientFailure(tasks[1].client_id, "nonfinite", "non-finite client state personal.w")
    assert checked(uploads[0], {"personal.w": torch.ones(1)}) is uploads[0]
    result = close_round(s.server, s.config, 0, tasks, [uploads[2], bad, uploads[0]])
    assert [u.client_id for u in result.uploads] == [tasks[0].client_id, tasks[2].client_id]
    assert result.metrics["dropped"] == [bad.record()]


def test_checking_a_round_s_uploads_together_names_what_checking_them_one_by_one_names() -> None:
    """checked_all (every tensor of the round in one pass first) gives each client the reply
    checked() gives it alone: the good ones pass unchanged, each bad one fails with its own quantity."""
    s = _setup("fedavg")
    tasks = plan_round(s.server, s.config, 0, [len(c.train) for c in s.federation.clients])

    def upload(t, loss=1.0, scale=1.0):
        return Upload(t.client_id, {k: v.clone() * scale for k, v in t.global_state.items()}, 10, 1, t.lr, 0.0,
                      metrics={"train_loss": loss, "train_seconds": 0.0})

    states = {t.client_id: {"personal.w": torch.ones(2)} for t in tasks}
    good = [upload(t) for t in tasks]
    assert checked_all(good, states) == good
    failure = ClientFailure(tasks[0].client_id, "error", "RuntimeError: boom")
    mixed = [failure, upload(tasks[1], scale=float("inf")), upload(tasks[2], loss=float("nan"))]
    states[tasks[2].client_id] = {"personal.w": torch.tensor([float("nan"), 1.0])}
    replies = checked_all(mixed, states)
    assert replies[0] is failure
    assert replies[1:] == [checked(o, states[o.client_id]) for o in mixed[1:]]
    assert [r.detail for r in replies[1:]] == [f"non-finite weight {sorted(tasks[1].global_state)[0]}",
                                               "non-finite train loss (nan)"]
