"""Calibration and evaluation as client-side computations the server combines: FFC from the
clients' statistics is least squares on the pooled data (float64), CCVR from the clients'
statistics is CCVR on the pooled features, a client's report is its own model on its own splits,
and the combined report is the same whatever order the rows come in."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlatent.calibration.ccvr import class_statistics, retrain_classifier, sample_virtual_features
from fedlatent.data.types import ClientData, Split
from fedlatent.federated.calibrate import apply_statistics, client_statistics, features, head_keys
from fedlatent.federated.client import PERSONAL, Workspace
from fedlatent.federated.evaluation import client_validation, evaluate, majority_rate
from fedlatent.federated.personal import client_report, combine_reports
from fedlatent.methods.ditto import DittoProgram
from fedlatent.methods.parts import Calibration, MethodSpec
from fedlatent.models.mlp import MLP

CPU = torch.device("cpu")


def _clients(sizes: list[int], num_classes: int = 3, dim: int = 6, seed: int = 0) -> list[Split]:
    g = torch.Generator().manual_seed(seed)
    return [Split(torch.randn(n, dim, generator=g), torch.randint(0, num_classes, (n,), generator=g)) for n in sizes]


def _model(dim: int = 6, num_classes: int = 3) -> MLP:
    torch.manual_seed(1)
    return MLP(dim, [4], num_classes).double()


@pytest.mark.parametrize("ridge", [0.0, 0.5])
def test_ffc_from_the_clients_statistics_is_least_squares_on_the_pooled_data(ridge: float) -> None:
    splits = [Split(s.x.double(), s.y) for s in _clients([17, 9, 30])]
    model = _model()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    cal = Calibration("ffc", ridge=ridge)
    stats = [client_statistics(model, state, split, cal, 8, CPU) for split in splits]
    out = apply_statistics(state, stats, cal, *head_keys(model), torch.Generator())
    z = torch.cat([features(model, split, 100, CPU) for split in splits]).double()
    y = torch.nn.functional.one_hot(torch.cat([s.y for s in splits]), 3).double()
    # ridge least squares: argmin ‖ZWᵀ − Y‖² + λ‖W‖², i.e. lstsq of [Z; √λ I] against [Y; 0]
    a = torch.cat([z, ridge ** 0.5 * torch.eye(z.shape[1], dtype=torch.float64)])
    b = torch.cat([y, torch.zeros(z.shape[1], 3, dtype=torch.float64)])
    expected = torch.linalg.lstsq(a, b).solution.T
    torch.testing.assert_close(out["classifier.weight"], expected, rtol=1e-9, atol=1e-10)
    assert torch.equal(out["classifier.bias"], torch.zeros(3, dtype=torch.float64))
    assert all(torch.equal(out[k], state[k]) for k in state if not k.startswith("classifier."))


def test_ccvr_from_the_clients_statistics_is_ccvr_on_the_pooled_features() -> None:
    splits = _clients([40, 25, 33])
    torch.manual_seed(1)
    model = MLP(6, [4], 3)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    cal = Calibration("ccvr", virtual_per_class=20, epochs=2, lr=0.1)
    stats = [client_statistics(model, state, split, cal, 8, CPU) for split in splits]
    out = apply_statistics(state, stats, cal, *head_keys(model), torch.Generator().manual_seed(5))
    z = torch.cat([features(model, split, 100, CPU) for split in splits])
    mean, cov, count = class_statistics(z, torch.cat([s.y for s in splits]), 3)
    g = torch.Generator().manual_seed(5)
    x, y = sample_virtual_features(mean, cov, torch.full_like(count, 20), g)
    weight, bias = retrain_classifier(state["classifier.weight"], state["classifier.bias"], x, y, epochs=2, lr=0.1,
                                      batch_size=64, generator=g)
    torch.testing.assert_close(out["classifier.weight"], weight, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["classifier.bias"], bias, rtol=1e-4, atol=1e-5)


def test_a_client_report_is_its_own_model_on_its_own_splits() -> None:
    train, val, test = _clients([20, 10, 12], seed=3)
    client = ClientData(train, val, test)
    model = MLP(6, [4], 3)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    personal = {k: v + 0.5 for k, v in global_state.items()}
    spec = MethodSpec("ditto", personalization=DittoProgram())
    row = client_report(Workspace(model), spec, 2, client, {PERSONAL + k: v for k, v in personal.items()},
                        global_state, num_classes=3, batch_size=4, device=CPU, settings=None,
                        generator=torch.Generator())
    reference = MLP(6, [4], 3)
    reference.load_state_dict(personal)
    on_test = evaluate(reference, test, 3)
    assert row == {"client": 2, "accuracy": on_test["accuracy"], "balanced_accuracy": on_test["balanced_accuracy"],
                   "majority_baseline": majority_rate(train.y, test.y, 3),
                   "val_accuracy": evaluate(reference, val, 3)["accuracy"]}
    assert client_report(Workspace(model), spec, 2, ClientData(train, val), {}, global_state, num_classes=3,
                         batch_size=4, device=CPU, settings=None, generator=torch.Generator()) is None
    reference.load_state_dict(global_state)
    assert client_validation(model, global_state, val, 3, 4, CPU) == evaluate(reference, val, 3)["accuracy"]
    assert client_validation(model, global_state, None, 3, 4, CPU) is None


def test_combined_reports_do_not_depend_on_reply_order() -> None:
    rows = [{"client": c, "accuracy": a, "balanced_accuracy": b, "majority_baseline": m}
            for c, a, b, m in [(0, 0.5, 0.4, 0.2), (1, 0.9, 0.8, 0.3), (2, 0.7, 0.75, 0.1)]]
    combined = combine_reports(rows)
    assert combine_reports(rows[::-1]) == combined
    assert combined["personalized_accuracy"] == pytest.approx(0.7)
    assert combined["personalized_accuracy_std"] == pytest.approx(np.std([0.5, 0.9, 0.7]))
    assert combined["personalized_accuracy_worst"] == 0.5
    assert combined["personalized_balanced_accuracy"] == pytest.approx(0.65)
    assert combined["majority_baseline_accuracy"] == pytest.approx(0.2)
    assert [r["client"] for r in combined["per_client"]] == [0, 1, 2]
    assert combine_reports([]) == {}
