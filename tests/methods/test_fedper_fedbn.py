"""FedPer and FedBN (entries kept per client, ``methods.partial``): the identities (every layer
shared, a model without BatchNorm: FedAvg exactly), FedPer's rounds against plain SGD written out,
the entries each keeps, FedBN's BatchNorm statistics carried across rounds and through a resume."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import fedlatent
from fedlatent.backends import simulation
from fedlatent.data.federation import build_federation
from fedlatent.federated.client import LOCAL, prefixed
from fedlatent.federated.trainer.schedule import batches
from fedlatent.federated.trainer import lockstep_update
from fedlatent.methods import resolve
from fedlatent.methods.fedbn import batchnorm_keys
from fedlatent.methods.fedper import personal_keys
from fedlatent.seeding import LOCAL_TRAINING, derive_seed
from tests.methods.resume import resumed_equals_uninterrupted
from tests.methods.test_personal_layers import small_config

HEAD = ("classifier.weight", "classifier.bias")
TRAINERS = {"simulation": simulation.train_in_turn, "vectorized": lockstep_update}


def _rounds(config, trainer=simulation.train_in_turn):
    """The setup after ``config.train.rounds`` rounds on ``trainer``, and the initial global state."""
    fed = build_federation(config.data, config.data_seed)
    s = simulation.setup(config, fed, resolve(config.algorithm, config.terms), trainer)
    initial = {k: v.clone() for k, v in s.server.global_state.items()}
    for rnd in range(config.train.rounds):
        simulation.run_round(s, rnd)
    return s, initial


@pytest.mark.parametrize("backend", sorted(TRAINERS))
@pytest.mark.parametrize("name,keys", [("fedper", {"personal_layers": 0}), ("fedbn", {})])
def test_every_layer_shared_is_fedavg_exactly(backend: str, name: str, keys: dict) -> None:
    """FedPer with no personalisation layer, FedBN on the MLP (no BatchNorm): FedAvg's weights to the bit."""
    fedavg, _ = _rounds(small_config("fedavg"), TRAINERS[backend])
    other, _ = _rounds(small_config(name, **keys), TRAINERS[backend])
    assert set(other.server.global_state) == set(fedavg.server.global_state)
    for k, v in fedavg.server.global_state.items():
        torch.testing.assert_close(other.server.global_state[k], v, rtol=0, atol=0)
    assert all(not prefixed(state, LOCAL) for state in other.client_states)


def test_fedper_rounds_are_sgd_on_every_layer_from_the_global_base_and_the_own_head() -> None:
    """Two rounds written out: each client trains all layers (the global base, its own head: the
    initial one in round 1) by SGD on its batches; it keeps its head; the base is the sample-weighted mean."""
    config = small_config("fedper", rounds=2)
    s, initial = _rounds(config)
    t = config.train
    sizes = [len(c.train) for c in s.federation.clients]
    heads = [{k: initial[k] for k in HEAD} for _ in sizes]
    base = {k: v for k, v in initial.items() if k not in HEAD}
    for rnd in range(t.rounds):
        bodies = []
        for cid, client in enumerate(s.federation.clients):
            model = simulation.make_model(config, s.federation, s.spec)
            model.load_state_dict({**base, **heads[cid]})
            generator = torch.Generator().manual_seed(derive_seed(config.seed, LOCAL_TRAINING, rnd, cid))
            opt = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
            for idx in batches(len(client.train), t.batch_size, t.drop_last, generator):
                opt.zero_grad()
                F.cross_entropy(model(client.train.x[idx]).logits, client.train.y[idx]).backward()
                opt.step()
            trained = model.state_dict()
            heads[cid] = {k: trained[k].clone() for k in HEAD}
            bodies.append({k: trained[k].clone() for k in base})
        base = {k: sum(b[k] * (n / sum(sizes)) for b, n in zip(bodies, sizes)) for k in base}
    for cid, state in enumerate(s.client_states):
        own = prefixed(state, LOCAL)
        assert set(own) == set(HEAD)
        for k in HEAD:
            torch.testing.assert_close(own[k], heads[cid][k], rtol=0, atol=1e-6)
    for k in base:
        torch.testing.assert_close(s.server.global_state[k], base[k], rtol=0, atol=1e-6)
    for k in HEAD:  # the global head never moves
        torch.testing.assert_close(s.server.global_state[k], initial[k], rtol=0, atol=0)


def test_personal_keys_count_layers_from_the_output() -> None:
    parameters = ["projector.0.weight", "projector.0.bias", "classifier.weight", "classifier.bias",
                  "enc.0.weight", "enc.1.weight", "enc.1.bias"]
    keys = parameters[:4] + ["enc.0.weight", "enc.1.weight", "enc.1.bias", "enc.1.running_mean"]
    assert personal_keys(0, parameters, keys) == []
    assert personal_keys(1, parameters, keys) == ["classifier.weight", "classifier.bias"]
    assert personal_keys(2, parameters, keys) == keys[:4]
    assert personal_keys(3, parameters, keys) == [*keys[:4], "enc.1.weight", "enc.1.bias", "enc.1.running_mean"]
    assert personal_keys(9, parameters, keys) == keys


def test_batchnorm_keys_are_the_entries_of_layers_with_running_statistics() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.GroupNorm(2, 4),
                                torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(2))
    keys = list(model.state_dict())
    parameters = [n for n, _ in model.named_parameters()]
    assert batchnorm_keys(parameters, keys) == [
        "1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked",
        "4.weight", "4.bias", "4.running_mean", "4.running_var", "4.num_batches_tracked"]


def _images(tmp_path: Path, rounds: int):
    """FedBN on the small CNN (BatchNorm after each convolution and hidden layer): 3 clients of
    random CIFAR-shaped images of unequal sizes, batch 8."""
    rng = np.random.default_rng(0)
    arrays = {}
    for i, n in enumerate([16, 12, 20]):
        arrays[f"client{i}_train_x"] = rng.standard_normal((n, 3, 32, 32), dtype=np.float32)
        arrays[f"client{i}_train_y"] = rng.integers(0, 4, n).astype(np.int64)
    np.savez(tmp_path / "images.npz", **arrays)
    return fedlatent.load_config(None, [
        'data.dataset="arrays"', f'data.path="{tmp_path / "images.npz"}"', 'data.partition="given"',
        'model.arch="cnn"', "train.batch_size=8", "train.lr=0.01", f"train.rounds={rounds}", "train.threads=1",
        'backend="simulation"', 'algorithm.name="fedbn"'])


def test_fedbn_keeps_each_clients_batchnorm_layers_across_rounds(tmp_path: Path) -> None:
    s, initial = _rounds(_images(tmp_path, rounds=2))
    norms = batchnorm_keys([n for n, _ in s.workspace.model.named_parameters()], list(initial))
    assert norms and any(k.endswith("running_var") for k in norms)
    for cid, state in enumerate(s.client_states):
        own = prefixed(state, LOCAL)
        assert sorted(own) == sorted(norms)
        # the statistics carried from round 1 into round 2: two rounds' batches counted (the global
        # count, never averaged, stays 0)
        per_round = len(batches(len(s.federation.clients[cid].train), 8, False, torch.Generator()))
        assert all(int(v) == 2 * per_round for k, v in own.items() if k.endswith("num_batches_tracked"))
    own = [prefixed(state, LOCAL) for state in s.client_states]
    key = next(k for k in norms if k.endswith("running_mean"))
    assert not torch.equal(own[0][key], own[1][key])
    for k in norms:  # the global BatchNorm layers stay at their initialisation; the rest is averaged
        torch.testing.assert_close(s.server.global_state[k], initial[k], rtol=0, atol=0)
    conv = next(k for k in initial if k not in norms and k.endswith("weight"))
    assert not torch.equal(s.server.global_state[conv], initial[conv])


@pytest.mark.slow
def test_fedbn_resume_reproduces_the_uninterrupted_run(tmp_path: Path, monkeypatch, crash_at_round_2) -> None:
    clients = resumed_equals_uninterrupted(_images(tmp_path, rounds=3), tmp_path, monkeypatch, num_clients=3)
    assert all(prefixed(c, LOCAL) for c in clients)
