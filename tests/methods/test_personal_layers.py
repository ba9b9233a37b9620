"""FedRep and LG-FedAvg (layers kept per client): a FedRep round against plain SGD written out,
the identities of the brief (no head epochs leaves the head at its initial value, every layer
global is FedAvg), personal evaluation with the client's own layers, resume, the lockstep refusal,
bad keys, and a run that learns on digits."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

import fedlatent
from fedlatent.backends import simulation
from fedlatent.data.federation import build_federation
from fedlatent.errors import ConfigError
from fedlatent.federated.client import LOCAL, Workspace, prefixed
from fedlatent.federated.trainer.schedule import batches
from fedlatent.federated.personal import client_model
from fedlatent.methods import resolve
from fedlatent.methods.lg_fedavg import local_keys
from fedlatent.seeding import LOCAL_TRAINING, derive_seed
from tests.methods.resume import resumed_equals_uninterrupted

HEAD = ("classifier.weight", "classifier.bias")


def small_config(name: str, rounds: int = 2, **algorithm):
    """4 Synthetic(0.5, 0.5) clients × 200 samples, a 60 → 20 → 10 MLP, SGD with momentum and decay."""
    config = fedlatent.load_config(None, [
        "seed=5", 'data.dataset="synthetic"', 'data.partition="given"', "data.num_clients=4",
        "data.samples_per_client=200", "data.synthetic_alpha=0.5", "data.synthetic_beta=0.5",
        'model.arch="mlp"', "model.hidden=[20]", f"train.rounds={rounds}", "train.local_epochs=1",
        "train.batch_size=10", "train.lr=0.05", "train.momentum=0.9", "train.weight_decay=0.001"])
    config.algorithm = {"name": name, **algorithm}
    return config


def train_rounds(config):
    """The simulation backend's setup and rounds in process, plus the initial global state."""
    fed = build_federation(config.data, config.data_seed)
    s = simulation.setup(config, fed, resolve(config.algorithm, config.terms))
    initial = {k: v.clone() for k, v in s.server.global_state.items()}
    for rnd in range(config.train.rounds):
        simulation.run_round(s, rnd)
    return s, initial


def test_fedrep_round_is_head_sgd_then_body_sgd() -> None:
    config = small_config("fedrep", rounds=1, head_epochs=2, body_epochs=1)
    s, initial = train_rounds(config)
    t = config.train
    bodies, sizes = [], []
    for cid, client in enumerate(s.federation.clients):
        model = simulation.make_model(config, s.federation, s.spec)
        model.load_state_dict(initial)
        generator = torch.Generator().manual_seed(derive_seed(config.seed, LOCAL_TRAINING, 0, cid))
        head = [p for n, p in model.named_parameters() if n in HEAD]
        body = [p for n, p in model.named_parameters() if n not in HEAD]
        for params, epochs in ((head, 2), (body, 1)):  # a fresh optimiser per phase, one batch order
            opt = torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
            for _ in range(epochs):
                for idx in batches(len(client.train), t.batch_size, t.drop_last, generator):
                    opt.zero_grad()
                    F.cross_entropy(model(client.train.x[idx]).logits, client.train.y[idx]).backward()
                    opt.step()
        own = prefixed(s.client_states[cid], LOCAL)
        assert set(own) == set(HEAD)
        for name in HEAD:
            torch.testing.assert_close(own[name], model.state_dict()[name], rtol=0, atol=1e-6)
        bodies.append({n: v for n, v in model.state_dict().items() if n not in HEAD})
        sizes.append(len(client.train))
    total = sum(sizes)
    for name in bodies[0]:  # the body is the sample-weighted mean; the global head never moves
        mean = sum(b[name] * (n / total) for b, n in zip(bodies, sizes))
        torch.testing.assert_close(s.server.global_state[name], mean, rtol=0, atol=1e-6)
    for name in HEAD:
        torch.testing.assert_close(s.server.global_state[name], initial[name], rtol=0, atol=0)


def test_fedrep_without_head_epochs_leaves_each_head_at_its_initial_value() -> None:
    s, initial = train_rounds(small_config("fedrep", rounds=2, head_epochs=0, body_epochs=1))
    for state in s.client_states:
        own = prefixed(state, LOCAL)
        for name in HEAD:
            torch.testing.assert_close(own[name], initial[name], rtol=0, atol=0)
    # while the body did train (the identity is not vacuous)
    assert not torch.allclose(s.server.global_state["layers.0.0.weight"], initial["layers.0.0.weight"])


def test_lg_fedavg_with_every_layer_global_is_fedavg() -> None:
    fedavg, _ = train_rounds(small_config("fedavg", rounds=2))
    lg, _ = train_rounds(small_config("lg_fedavg", rounds=2, global_layers=100))
    assert set(lg.server.global_state) == set(fedavg.server.global_state)
    for name, value in fedavg.server.global_state.items():
        torch.testing.assert_close(lg.server.global_state[name], value, rtol=0, atol=0)
    assert all(not prefixed(state, LOCAL) for state in lg.client_states)


def test_lg_fedavg_keeps_the_representation_per_client() -> None:
    s, initial = train_rounds(small_config("lg_fedavg", rounds=2))
    names = list(initial)
    own = [prefixed(state, LOCAL) for state in s.client_states]
    assert set(own[0]) == {n for n in names if not n.startswith("classifier.")}
    # each client's representation is its own; the global one is never averaged
    assert not torch.allclose(own[0]["layers.0.0.weight"], own[1]["layers.0.0.weight"])
    torch.testing.assert_close(s.server.global_state["layers.0.0.weight"], initial["layers.0.0.weight"],
                               rtol=0, atol=0)
    assert not torch.allclose(s.server.global_state["classifier.weight"], initial["classifier.weight"])


def test_local_keys_count_layers_from_the_output() -> None:
    # FedModel registers the projector and the classifier before the encoder
    parameters = ["projector.0.weight", "projector.0.bias", "classifier.weight", "classifier.bias",
                  "enc.0.weight", "enc.1.weight", "enc.1.bias"]
    keys = parameters[:4] + ["enc.0.weight", "enc.1.weight", "enc.1.bias", "enc.1.running_mean"]
    encoder = ["enc.0.weight", "enc.1.weight", "enc.1.bias", "enc.1.running_mean"]
    assert local_keys(1, parameters, keys) == ["projector.0.weight", "projector.0.bias", *encoder]
    assert local_keys(2, parameters, keys) == encoder
    assert local_keys(3, parameters, keys) == ["enc.0.weight"]
    assert local_keys(4, parameters, keys) == [] == local_keys(9, parameters, keys)


@pytest.mark.parametrize("name", ["fedrep", "lg_fedavg"])
def test_personal_model_is_the_clients_own_layers_with_the_global_ones(name: str) -> None:
    s, initial = train_rounds(small_config(name, rounds=1))
    spec, global_state = s.spec, s.server.global_state
    for cid, state in enumerate(s.client_states):
        own = prefixed(state, LOCAL)
        assert own
        model = client_model(Workspace(s.workspace.model), spec, state, global_state, cid, s.federation.clients[cid].train, None,
                             torch.Generator())
        for key, value in model.state_dict().items():
            expected = own[key] if key in own else global_state[key]
            torch.testing.assert_close(value, expected, rtol=0, atol=0)
    # a client without its own layers yet evaluates the global model
    model = client_model(Workspace(s.workspace.model), spec, {}, global_state, 0, s.federation.clients[0].train, None,
                         torch.Generator())
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, global_state[key], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["fedrep", "lg_fedavg"])
def test_resume_reproduces_the_uninterrupted_run(tmp_path: Path, monkeypatch, crash_at_round_2, name: str) -> None:
    config = small_config(name, rounds=3, **({"head_epochs": 2} if name == "fedrep" else {}))
    assert all(prefixed(c, LOCAL) for c in resumed_equals_uninterrupted(config, tmp_path, monkeypatch))


@pytest.mark.parametrize("algorithm, key", [
    ({"name": "fedrep", "body_epochs": 0}, "algorithm.body_epochs"),
    ({"name": "fedrep", "head_epochs": -1}, "algorithm.head_epochs"),
    ({"name": "lg_fedavg", "global_layers": 0}, "algorithm.global_layers"),
    ({"name": "lg_fedavg", "finetune_epochs": 1}, "algorithm.finetune_epochs"),
])
def test_bad_keys_are_one_clear_line(algorithm: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        resolve(algorithm)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fedrep", "lg_fedavg"])
def test_learns_on_digits(tmp_path: Path, name: str) -> None:
    config = fedlatent.load_config(None, [
        'data.dataset="digits"', "data.num_clients=4", 'data.partition="dirichlet"', "data.alpha=0.3",
        "data.local_test_fraction=0.3", "train.rounds=5", f'algorithm.name="{name}"'])
    final = fedlatent.run(config, tmp_path / name)["final"]
    assert final["personalized_accuracy"] > final["majority_baseline_accuracy"] + 0.3
    assert len(final["per_client"]) == 4


def test_fedrep_with_a_fixed_head_skips_the_head_phase() -> None:
    s, initial = train_rounds(small_config("fedrep", rounds=1, head="fixed"))
    for state in s.client_states:
        for name, value in prefixed(state, LOCAL).items():
            torch.testing.assert_close(value, initial[name], rtol=0, atol=0)
