"""The classifier's own cost (SphereFed Table 1): each term against a hand count for a small head,
the paper's published rows reproduced to their printed digits, the samples a step budget trains on,
and the summary columns of a run on either embedded backend."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import fedlatent
from fedlatent import load_config
from fedlatent.analysis import classifier_cost as cc
from fedlatent.data.federation import build_federation
from fedlatent.federated.trainer.schedule import batch_count, trained_samples

DIGITS_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"
L, C, K, N = 4, 3, 2, 10  # features, classes, clients, training samples


def test_learned_head_by_hand() -> None:
    # W has 4·3 = 12 values: down and up at 4 bytes; backward 2·12 (input gradient) + 12 (outer product) per sample
    assert cc.head_traffic(L, C) == 2 * 12 * 4 == 96
    assert cc.head_training(L, C, sample_passes=20, clients=K) == 3 * 12 * 20 + 2 * 12 == 744


def test_ffc_by_hand() -> None:
    cost = cc.ffc(L, C, N, K)
    assert cost.bytes_per_client == (16 + 12) * 4  # V (4×4) and U (4×3) once
    eq9 = 2 * 4 * 10 * (4 + 3)  # 2l|D|(l + C), the paper's count, summed over the clients
    eq10 = (2 - 1) * 28 + 64 // 3 + 2 * 16 * 3  # the K statistics summed, Cholesky, two triangular solves
    assert cost.flops == eq9 + eq10 == 560 + 28 + 21 + 96


def test_ccvr_by_hand() -> None:
    cost = cc.ccvr(L, C, N, K, virtual_per_class=5, epochs=2)
    assert cost.bytes_per_client == (12 + 48) * 4  # μ (4×3), Σ (4×4×3) once
    fitting = 10 * (2 * 16 + 4)
    pooling = 2 * 3 * (16 + 4)
    factorising = 3 * (64 // 3)
    sampling = 15 * (2 * 16 + 2 * 4)
    fine_tuning = 3 * 12 * 15 * 2
    assert cost.flops == fitting + pooling + factorising + sampling + fine_tuning == 360 + 120 + 63 + 600 + 1080


def test_calibration_kinds() -> None:
    assert cc.calibration("ffc", L, C, N, K) == cc.ffc(L, C, N, K)
    assert cc.calibration("ccvr", L, C, N, K, virtual_per_class=5, epochs=2) == cc.ccvr(L, C, N, K, 5, 2)
    assert cc.calibration("none", L, C, N, K) == cc.calibration("centralized", L, C, N, K) == cc.Cost(0, 0)


def test_table1_rows_compose_the_terms() -> None:
    kw = dict(features=L, classes=C, clients=K, rounds=3, samples=N, local_epochs=2, virtual_per_class=5, ccvr_epochs=2)
    fedavg = cc.Cost(3 * 96, 3 * 744)  # 3 rounds of 10 samples × 2 epochs over both clients
    assert cc.table1("fedavg", **kw) == fedavg
    assert cc.table1("ccvr", **kw) == fedavg + cc.ccvr(L, C, N, K, 5, 2)
    assert cc.table1("spherefed", **kw) == cc.ffc(L, C, N, K)
    with pytest.raises(ValueError, match="fedavg, ccvr, spherefed"):
        cc.table1("babu")


def _cut(value: float, digits: int) -> float:
    """``value`` cut (not rounded) to ``digits`` significant digits."""
    scale = 10 ** (math.floor(math.log10(value)) - digits + 1)
    return math.floor(value / scale) * scale


@pytest.mark.parametrize("method, megabytes, gflops", [
    ("fedavg", 102, 1.9e4), ("ccvr", 758, 2.1e4), ("spherefed", 7, 1.7e2),  # spherefed.txt:138-180
])
def test_table1_reproduces_the_published_row(method: str, megabytes: float, gflops: float) -> None:
    """MobileNetV2 (l = 1280), CIFAR-100, 10 clients, 100 rounds: the counts, cut to the printed
    digits, are the paper's (its 1.7×10² for FFC is Eq. 9 alone, 1.77×10², cut, not rounded)."""
    cost = cc.table1(method)
    assert math.floor(cost.megabytes) == megabytes
    assert _cut(cost.gflops, 2) == pytest.approx(gflops)


@pytest.mark.parametrize("n, steps, batch, drop_last, expected", [
    (10, 6, 4, False, 20),  # 3 batches an epoch (4, 4, 2): two whole epochs
    (10, 4, 4, False, 14),  # one epoch and the first (full) batch of the next
    (10, 4, 4, True, 16),  # 2 batches an epoch (the short one dropped): two epochs of 8
    (9, 3, 4, False, 12),  # (4, 4, 1): the batch of one dropped; an epoch of 8, then a batch of 4
    (3, 5, 4, False, 15),  # fewer samples than a batch: one batch of 3 a step
    (3, 5, 4, True, 0),  # ... dropped
    (0, 0, 4, False, 0),
])
def test_trained_samples(n: int, steps: int, batch: int, drop_last: bool, expected: int) -> None:
    assert trained_samples(n, steps, batch, drop_last) == expected


@pytest.mark.usefixtures("no_figures")
@pytest.mark.parametrize("backend, method", [("simulation", "fedavg"), ("vectorized", "spherefed")])
def test_summary_columns_of_a_run(tmp_path, backend: str, method: str) -> None:
    config = load_config(DIGITS_CONFIG, ["train.rounds=2", "data.num_clients=4", "model.hidden=[32]",
                                         "train.local_epochs=2", 'diagnostics.which=["flops"]', f"backend={backend}"])
    config.algorithm = {"name": method}
    sizes = [len(c.train) for c in build_federation(config.data, config.data_seed).clients]
    batch = config.train.batch_size
    epoch = [trained_samples(n, batch_count(n, batch, False), batch, False) for n in sizes]
    summary = fedlatent.run(config, tmp_path / "run")
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    head = 32 * 10
    if method == "fedavg":  # W down and up for each client, 3lC per sample of 2 epochs, the server's average
        for line in metrics:
            k = len(line["clients"])
            assert line["classifier_bytes"] == k * 2 * head * 4
            assert line["classifier_flops"] == 3 * head * 2 * sum(epoch[c] for c in line["clients"]) + k * head
        assert summary["final"]["classifier_calibration_flops"] == summary["final"]["classifier_calibration_bytes"] == 0
        sent = sum(line["classifier_bytes"] for line in metrics)
    else:  # a fixed head never travels nor trains; FFC once over every client's training samples
        assert all(line["classifier_bytes"] == line["classifier_flops"] == 0 for line in metrics)
        assert summary["final"]["classifier_calibration_flops"] == cc.ffc(32, 10, sum(sizes), 4).flops
        sent = summary["final"]["classifier_calibration_bytes"]
        assert sent == 4 * 32 * (32 + 10) * 4
    assert summary["classifier_megabytes_per_client"] == pytest.approx(sent / 4 / 1e6)
    assert summary["classifier_gflops"] == pytest.approx(
        (summary["final"]["classifier_calibration_flops"] + sum(line["classifier_flops"] for line in metrics)) / 1e9)
