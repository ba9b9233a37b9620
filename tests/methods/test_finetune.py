"""Fine-tuning at evaluation: the head alone on a fixed extractor (SphereFed's "Ours (SGD)") leaves
every encoder weight and BatchNorm statistic bit-identical and equals SGD on the frozen features
written out; FedBABU's head does not move during training rounds and is fine-tuned with the rest
at evaluation; the scope key's bad values."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import fedlatent
from fedlatent.backends import simulation
from fedlatent.data.federation import build_federation
from fedlatent.errors import ConfigError
from fedlatent.federated.trainer.schedule import batches
from fedlatent.federated.personal import client_model
from fedlatent.methods import resolve

HEAD = ("classifier.weight", "classifier.bias")


def small_config(rounds: int, **algorithm):
    """4 Synthetic(0.5, 0.5) clients × 200 samples (with test splits), a 60 → 20 MLP."""
    config = fedlatent.load_config(None, [
        "seed=3", 'data.dataset="synthetic"', 'data.partition="given"', "data.num_clients=4",
        "data.samples_per_client=200", "data.synthetic_alpha=0.5", "data.synthetic_beta=0.5",
        'model.arch="mlp"', "model.hidden=[20]", f"train.rounds={rounds}",
        "train.batch_size=10", "train.lr=0.05", "train.momentum=0.9"])
    config.algorithm = algorithm
    return config


def trained(config):
    fed = build_federation(config.data, config.data_seed)
    s = simulation.setup(config, fed, resolve(config.algorithm, config.terms))
    initial = {k: v.clone() for k, v in s.server.global_state.items()}
    for rnd in range(config.train.rounds):
        simulation.run_round(s, rnd)
    return s, initial


def finetuned(s, cid: int = 0, seed: int = 11):
    settings = simulation.settings(s, s.config.train.lr, s.spec.personalization.epochs)
    model = client_model(s.workspace, s.spec, s.client_states[cid], s.server.global_state, cid,
                         s.federation.clients[cid].train,
                         settings, torch.Generator().manual_seed(seed))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, settings


def test_head_only_finetuning_leaves_the_extractor_bit_identical() -> None:
    config = fedlatent.load_config(None, ["seed=3", "data.num_clients=4", 'model.arch="cifar_convnet"',
                                          "train.rounds=1", "train.lr=0.05"])
    config.algorithm = {"name": "fedavg", "finetune_epochs": 1, "finetune_scope": "head"}
    s, _ = trained(config)
    state, _ = finetuned(s)
    glob = s.server.global_state
    assert any("running_mean" in k for k in glob)  # BatchNorm statistics are checked too
    for key, value in glob.items():
        if key in HEAD:
            assert not torch.equal(state[key], value), key
        else:
            assert torch.equal(state[key], value), key
    assert all(p.requires_grad for p in s.workspace.model.parameters())  # flags restored


def test_head_only_finetuning_is_sgd_on_the_frozen_features() -> None:
    s, _ = trained(small_config(1, name="fedavg", finetune_epochs=2, finetune_scope="head"))
    state, settings = finetuned(s, cid=1, seed=4)
    model = simulation.make_model(s.config, s.federation, s.spec)
    model.load_state_dict(s.server.global_state)
    train = s.federation.clients[1].train
    with torch.no_grad():
        z = model(train.x).z.double()
    w = model.classifier.weight.detach().double().clone().requires_grad_(True)
    b = model.classifier.bias.detach().double().clone().requires_grad_(True)
    opt = torch.optim.SGD([w, b], lr=settings.lr, momentum=settings.momentum)
    generator = torch.Generator().manual_seed(4)
    for _ in range(2):
        for idx in batches(len(train), settings.batch_size, settings.drop_last, generator):
            opt.zero_grad()
            F.cross_entropy(z[idx] @ w.T + b, train.y[idx]).backward()
            opt.step()
    torch.testing.assert_close(state["classifier.weight"], w.detach().float(), rtol=0, atol=1e-5)
    torch.testing.assert_close(state["classifier.bias"], b.detach().float(), rtol=0, atol=1e-5)


def test_fedbabu_head_is_fixed_in_training_and_finetuned_at_evaluation() -> None:
    s, initial = trained(small_config(2, name="fedbabu", finetune_epochs=1))
    glob = s.server.global_state
    for key in HEAD:  # training rounds never move the head
        assert torch.equal(glob[key], initial[key]), key
    assert all(not torch.equal(glob[k], initial[k]) for k in glob if k not in HEAD)  # the body trains
    state, _ = finetuned(s)
    for key in glob:  # the whole model, head included, is fine-tuned
        assert not torch.equal(state[key], glob[key]), key
    head = s.workspace.model.classifier
    assert not head.weight.requires_grad and not head.bias.requires_grad  # fixed again afterwards


def test_fedbabu_defaults_and_head_scope_on_a_bias_free_head() -> None:
    spec = resolve({"name": "fedbabu"})
    assert (spec.head.fixed, spec.personalization.kind, spec.personalization.epochs,
            spec.personalization.scope) == (True, "finetune", 5, "all")
    assert resolve({"name": "fedbabu", "finetune_epochs": 2}).personalization.epochs == 2
    s, _ = trained(small_config(1, name="spherefed", finetune_epochs=1, finetune_scope="head"))
    state, _ = finetuned(s)
    assert torch.count_nonzero(state["classifier.bias"]) == 0  # SphereFed's head has no bias
    assert not torch.equal(state["classifier.weight"], s.server.global_state["classifier.weight"])


@pytest.mark.parametrize("algorithm, key", [
    ({"name": "fedavg", "finetune_scope": "head"}, "algorithm.finetune_scope"),    # nothing fine-tunes
    ({"name": "ditto", "finetune_scope": "all"}, "algorithm.finetune_scope"),
    ({"name": "fedavg", "finetune_epochs": 1, "finetune_scope": "body"}, "algorithm.finetune_scope"),
    ({"name": "fedbabu", "init": "uniform"}, "algorithm.init"),
])
def test_bad_scope(algorithm, key) -> None:
    with pytest.raises(ConfigError, match=key):
        resolve(algorithm)
