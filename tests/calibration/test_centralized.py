"""The centralised classifier-only baseline (``calibration = "centralized"``): the head retrained on
the pooled real training features of every client under the final encoder, the encoder untouched,
the pooled training loss lowered; the key's values."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import fedlatent
from fedlatent.backends import simulation
from fedlatent.calibration.ccvr import retrain_classifier
from fedlatent.data.federation import build_federation
from fedlatent.errors import ConfigError
from fedlatent.methods import resolve
from fedlatent.seeding import CALIBRATION, derive_seed

HEAD = ("classifier.weight", "classifier.bias")


def test_head_retrained_on_pooled_features_of_the_final_encoder() -> None:
    config = fedlatent.load_config(None, ["seed=2", "data.num_clients=4", 'data.partition="dirichlet"',
                                          "data.alpha=0.1", "train.rounds=1", "model.hidden=[16]"])
    config.algorithm = {"name": "fedavg", "calibration": "centralized", "calibration_epochs": 3,
                        "calibration_lr": 0.05}
    fed = build_federation(config.data, config.data_seed)
    s = simulation.setup(config, fed, resolve(config.algorithm))
    simulation.run_round(s, 0)
    state = s.server.global_state
    calibrated, _ = simulation.calibrated(s, state, s.config.train.rounds)
    model = simulation.make_model(config, fed, s.spec)
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():  # pooled in client order, by hand
        z = torch.cat([model(c.train.x).z for c in fed.clients])
    y = torch.cat([c.train.y for c in fed.clients])
    generator = torch.Generator().manual_seed(derive_seed(config.seed, CALIBRATION))
    weight, bias = retrain_classifier(state["classifier.weight"], state["classifier.bias"], z, y, epochs=3,
                                      lr=0.05, batch_size=64, generator=generator)
    torch.testing.assert_close(calibrated["classifier.weight"], weight, rtol=0, atol=1e-6)
    torch.testing.assert_close(calibrated["classifier.bias"], bias, rtol=0, atol=1e-6)
    for key in state:
        if key not in HEAD:
            assert torch.equal(calibrated[key], state[key]), key
    before = F.cross_entropy(F.linear(z, state["classifier.weight"], state["classifier.bias"]), y)
    after = F.cross_entropy(F.linear(z, weight, bias), y)
    assert after < before  # the oracle fits the pooled training data better


def test_calibration_keys() -> None:
    spec = resolve({"name": "fedavg", "calibration": "centralized"})
    assert (spec.calibration.kind, spec.calibration.epochs, spec.calibration.lr) == ("centralized", 5, 0.01)
    with pytest.raises(ConfigError, match="algorithm.calibration"):
        resolve({"name": "fedavg", "calibration": "central"})
    with pytest.raises(ConfigError, match="algorithm.calibration_lr"):
        resolve({"name": "fedavg", "calibration": "centralized", "calibration_lr": -1.0})


def test_mse_retraining_lowers_the_mse_and_is_a_key() -> None:
    """SphereFed Table 4's sanity check tries CE and MSE: ``calibration_loss = "mse"`` retrains the
    head on (1/C)‖Wz + b − onehot(y)‖², and lowers that loss on the features it is given."""
    generator = torch.Generator().manual_seed(0)
    z, y = torch.randn(64, 8, generator=generator), torch.randint(0, 4, (64,), generator=generator)
    weight, bias = torch.zeros(4, 8), torch.zeros(4)
    w, b = retrain_classifier(weight, bias, z, y, epochs=20, lr=0.1, batch_size=16, generator=generator, loss="mse")
    target = F.one_hot(y, 4).float()
    assert F.mse_loss(F.linear(z, w, b), target) < F.mse_loss(F.linear(z, weight, bias), target)
    assert resolve({"name": "fedavg", "calibration": "centralized"}).calibration.loss == "ce"
    assert resolve({"name": "fedavg", "calibration": "centralized", "calibration_loss": "mse"}).calibration.loss == "mse"
    with pytest.raises(ConfigError, match="algorithm.calibration_loss"):
        resolve({"name": "fedavg", "calibration": "centralized", "calibration_loss": "l1"})
    with pytest.raises(ValueError, match="loss must be"):
        retrain_classifier(weight, bias, z, y, epochs=1, lr=0.1, batch_size=16, generator=generator, loss="l1")
