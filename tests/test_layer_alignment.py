"""FedDecorr's Assumption 2 (Fig. 6): consecutive layers built with shared singular vectors give
alignment 1, linear and convolutional; independent random layers give the closed-form expectation
E|⟨u, v⟩| (itself checked at d = 2, 3 and against a float64 Monte Carlo); the diagnostic in a run."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent import load_config
from fedlatent.analysis import diagnostics as dg

DIGITS_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"


def _orthonormal(rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(rows, cols, generator=g, dtype=torch.float64))[0]


def test_shared_singular_vectors_align() -> None:
    g = torch.Generator().manual_seed(0)
    d = 6
    u1 = _orthonormal(d, d, g)  # W1's left singular vectors ...
    w1 = u1 @ torch.diag(torch.tensor([6.0, 5, 4, 3, 2, 1], dtype=torch.float64)) @ _orthonormal(9, d, g).T
    w2 = _orthonormal(4, 4, g) @ torch.diag(torch.tensor([4.0, 3, 2, 1], dtype=torch.float64)) @ u1[:, :4].T  # ... W2's right ones
    assert dg.singular_alignment(w1, w2, 4) == pytest.approx([1.0] * 4, abs=1e-9)


def test_shared_singular_vectors_align_through_convolutions() -> None:
    g = torch.Generator().manual_seed(1)
    out1, in1, out2 = 4, 3, 5
    u1 = _orthonormal(out1, out1, g)
    s = torch.diag(torch.tensor([4.0, 3, 2, 1], dtype=torch.float64))
    w1 = (u1 @ s @ _orthonormal(in1 * 9, out1, g).T).reshape(out1, in1, 3, 3)  # (out, in·kh·kw) = U S Vᵀ
    right = _orthonormal(out2 * 9, out1, g) @ s @ u1.T  # (out·kh·kw, in) with right singular vectors u1
    w2 = right.reshape(out2, 3, 3, out1).movedim(-1, 1)
    assert dg.singular_alignment(w1, w2, 4) == pytest.approx([1.0] * 4, abs=1e-9)
    model = torch.nn.Sequential(torch.nn.Conv2d(in1, out1, 3), torch.nn.ReLU(), torch.nn.Conv2d(out1, out2, 3))
    with torch.no_grad():
        model[0].weight.copy_(w1)
        model[2].weight.copy_(w2)
    (pair,) = dg.consecutive_alignment(model, k=4)
    assert pair["layers"] == ["0", "2"] and pair["alignment"] == pytest.approx([1.0] * 4, abs=1e-6)


def test_random_alignment_closed_form() -> None:
    assert dg.random_alignment(2) == pytest.approx(2 / math.pi)  # E|cos θ|, θ uniform
    assert dg.random_alignment(3) == pytest.approx(0.5)  # |u_z| is uniform on [0, 1] (Archimedes)
    g = torch.Generator().manual_seed(2)
    for d in (5, 64):
        u = torch.nn.functional.normalize(torch.randn(200_000, d, generator=g, dtype=torch.float64), dim=1)
        v = torch.nn.functional.normalize(torch.randn(200_000, d, generator=g, dtype=torch.float64), dim=1)
        monte_carlo = (u * v).sum(1).abs()
        assert dg.random_alignment(d) == pytest.approx(monte_carlo.mean().item(), abs=4 * monte_carlo.std().item() / 450)


def test_independent_random_layers_give_the_expectation() -> None:
    g = torch.Generator().manual_seed(3)
    d, draws = 16, 3000
    values = torch.tensor([dg.singular_alignment(torch.randn(d, 24, generator=g), torch.randn(10, d, generator=g), 2)
                           for _ in range(draws)], dtype=torch.float64)
    spread = values.std(0) / math.sqrt(draws)
    for j in range(2):  # the top and second pair alike: Haar-distributed, independent
        assert values[:, j].mean().item() == pytest.approx(dg.random_alignment(d), abs=4 * spread[j].item())


def test_pairs_follow_the_model_and_skip_mismatched_layers() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4), torch.nn.Linear(5, 3))
    pairs = dg.consecutive_alignment(model, k=10)
    assert [p["layers"] for p in pairs] == [["0", "2"]]  # 4 outputs do not feed 5 inputs
    assert len(pairs[0]["alignment"]) == 4  # min(rank of each)


@pytest.mark.usefixtures("no_figures")
def test_layer_alignment_in_a_run(tmp_path) -> None:
    config = load_config(DIGITS_CONFIG, ["train.rounds=1", "data.num_clients=3", "model.hidden=[32, 16]",
                                         'diagnostics.which=["layer_alignment"]'])
    fedlatent.run(config, tmp_path / "run")
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "diagnostics.jsonl").read_text().splitlines()]
    pairs = record["layer_alignment"]
    assert len(pairs) == 2 and all(0 <= a <= 1 + 1e-9 for p in pairs for a in p["alignment"])
    assert record["layer_alignment_top"] == pytest.approx(sum(p["alignment"][0] for p in pairs) / 2)
