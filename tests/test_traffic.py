"""Communication bytes in the metrics, against hand counts (SphereFed Table 1 counts the classifier's
traffic: a learned head every round, a fixed one never, FFC's statistics once)."""
from __future__ import annotations

import fedlatent
from fedlatent.backends import simulation
from fedlatent.data.federation import build_federation
from fedlatent.methods import resolve

ENCODER = 64 * 128 + 128  # MLP 64-128-10: the hidden layer's weight and bias
HEAD = 128 * 10 + 10      # the classifier's weight and bias
FLOAT = 4


def one_round(method: dict, clients: int = 3) -> tuple[dict, simulation.Setup]:
    config = fedlatent.load_config(None, [f"data.num_clients={clients}", "train.rounds=1"])
    config.backend = "simulation"
    federation = build_federation(config.data, config.data_seed)
    s = simulation.setup(config, federation, resolve(method, config.terms))
    return simulation.run_round(s, 0), s


def test_fedavg_sends_and_receives_the_whole_model_every_round() -> None:
    line, _ = one_round({"name": "fedavg"})
    assert line["bytes_down"] == line["bytes_up"] == 3 * (ENCODER + HEAD) * FLOAT
    assert line["bytes_head_down"] == line["bytes_head_up"] == 3 * HEAD * FLOAT


def test_a_fixed_head_never_travels_and_ffc_statistics_are_counted_once() -> None:
    line, s = one_round({"name": "spherefed"})
    assert line["bytes_down"] == line["bytes_up"] == 3 * ENCODER * FLOAT
    assert line["bytes_head_down"] == line["bytes_head_up"] == 0
    final = simulation.finish(s)
    assert final["bytes_calibration_up"] == 3 * (128 * 128 + 128 * 10) * 8  # V = ZᵀZ and U = Zᵀ Y in float64


def test_scaffold_payload_and_extras_count_their_control_variates() -> None:
    line, _ = one_round({"name": "scaffold"})
    model = ENCODER + HEAD
    # round 1: the server's c is empty (zero at init, nothing to send); each client uploads Δc_i
    assert line["bytes_down"] == 3 * model * FLOAT
    assert line["bytes_up"] == 3 * 2 * model * FLOAT
