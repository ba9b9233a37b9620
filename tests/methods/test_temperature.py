"""Cross-entropy with a temperature (SphereFed Sec. 4.3 / Table 3: τ·Wz, here logits / T with
T = 1/τ): the loss against a float64 hand computation, a local step against SGD written out, the
same weights from both backends, and the bad values."""
from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from fedlatent.backends import simulation
from fedlatent.data.federation import build_federation
from fedlatent.errors import ConfigError
from fedlatent.federated.trainer.schedule import batches
from fedlatent.federated.trainer import lockstep_update
from fedlatent.methods import resolve
from fedlatent.methods.parts import task_loss
from fedlatent.seeding import LOCAL_TRAINING, derive_seed

from tests.test_vectorized import _digits, _rounds


def test_loss_is_cross_entropy_of_scaled_logits() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 3.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([0, 2])
    t = 0.25
    by_hand = []
    for row, label in zip(logits.tolist(), y.tolist()):
        scaled = [v / t for v in row]
        by_hand.append(math.log(sum(math.exp(v) for v in scaled)) - scaled[label])
    assert task_loss("ce", logits, y, temperature=t).item() == pytest.approx(sum(by_hand) / 2, rel=1e-12)
    per_sample = task_loss("ce", logits, y, reduction="none", temperature=t)
    assert per_sample.tolist() == pytest.approx(by_hand, rel=1e-12)
    assert torch.equal(task_loss("ce", logits, y, temperature=1.0), F.cross_entropy(logits, y))


def test_a_round_with_a_temperature_is_sgd_on_scaled_logits() -> None:
    config = _digits("fedavg", temperature=0.5)
    config.train.rounds, config.train.participation = 1, 1.0
    fed = build_federation(config.data, config.data_seed)
    s = simulation.setup(config, fed, resolve(config.algorithm))
    initial = {k: v.clone() for k, v in s.server.global_state.items()}
    simulation.run_round(s, 0)
    t = config.train
    states, sizes = [], []
    for cid, client in enumerate(fed.clients):
        model = simulation.make_model(config, fed, s.spec)
        model.load_state_dict(initial)
        generator = torch.Generator().manual_seed(derive_seed(config.seed, LOCAL_TRAINING, 0, cid))
        opt = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
        for idx in batches(len(client.train), t.batch_size, t.drop_last, generator):
            opt.zero_grad()
            F.cross_entropy(model(client.train.x[idx]).logits / 0.5, client.train.y[idx]).backward()
            opt.step()
        states.append(model.state_dict())
        sizes.append(len(client.train))
    for name, value in s.server.global_state.items():
        mean = sum(st[name] * (n / sum(sizes)) for st, n in zip(states, sizes))
        torch.testing.assert_close(value, mean, rtol=0, atol=1e-6, msg=name)


def test_both_backends_train_the_same_with_a_temperature() -> None:
    config = _digits("fedavg", temperature=2.0)
    ref, ref_lines = _rounds(config, simulation.train_in_turn)
    got, got_lines = _rounds(config, lockstep_update)
    for k, v in ref.server.global_state.items():
        torch.testing.assert_close(got.server.global_state[k], v, atol=2e-5, rtol=1e-4, msg=k)
    assert got_lines[-1]["train_loss"] == pytest.approx(ref_lines[-1]["train_loss"], rel=1e-4)
    untempered, _ = _rounds(_digits("fedavg"), lockstep_update)
    assert any(not torch.allclose(untempered.server.global_state[k], v) for k, v in got.server.global_state.items())


@pytest.mark.parametrize("algorithm", [{"name": "fedavg", "temperature": 0.0},
                                       {"name": "spherefed", "temperature": 0.1},
                                       {"name": "fedavg", "loss": "mse", "temperature": 2.0},
                                       {"name": "fedavg", "temperature": "hot"}])
def test_bad_temperatures(algorithm) -> None:
    with pytest.raises(ConfigError, match="algorithm.temperature"):
        resolve(algorithm)
    assert resolve({"name": "spherefed", "loss": "ce", "temperature": 0.1}).temperature == 0.1
