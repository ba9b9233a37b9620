"""The diagnostics' computations against float64 references computed by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedlatent.analysis import diagnostics as dg
from fedlatent.models.mlp import MLP


def _rank_r(n: int, d: int, r: int, seed: int = 0) -> torch.Tensor:
    """n points in R^d lying in a random r-dimensional affine subspace."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, r, generator=g, dtype=torch.float64) @ torch.randn(r, d, generator=g, dtype=torch.float64) \
        + torch.randn(1, d, generator=g, dtype=torch.float64)


def test_spectrum_is_the_covariance_eigenvalues_by_hand():
    z = _rank_r(50, 6, 6)
    centred = z.numpy() - z.numpy().mean(0)
    cov = centred.T @ centred / len(z)  # 1/N, FedDecorr Sec. 3.1
    expected = np.sort(np.linalg.eigvalsh(cov))[::-1]
    np.testing.assert_allclose(dg.covariance_spectrum(z.float()), expected, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("rank", [1, 3, 7])
def test_significant_count_equals_the_rank_of_the_representations(rank):
    out = dg.collapse(_rank_r(200, 12, rank), threshold=1e-6)
    assert out["significant"] == rank
    assert out["normalized_spectrum"][0] == 1.0
    assert all(a >= b for a, b in zip(out["normalized_spectrum"], out["normalized_spectrum"][1:]))
    assert len(out["singular_values"]) == 12


def test_threshold_is_relative_to_the_largest_singular_value():
    # axis-aligned variances 1, 0.1, 0.001 (exactly, with ±s patterns): sigma_k / sigma_1 = 1, .1, .001
    signs = torch.tensor([[a, b, c] for a in (-1, 1) for b in (-1, 1) for c in (-1, 1)], dtype=torch.float64)
    z = signs * torch.tensor([1.0, 0.1 ** 0.5, 0.001 ** 0.5], dtype=torch.float64)
    np.testing.assert_allclose(dg.collapse(z, 0.5)["normalized_spectrum"], [1.0, 0.1, 0.001], rtol=1e-12)
    assert [dg.collapse(z, t)["significant"] for t in (0.5, 0.05, 0.0005)] == [1, 2, 3]
    assert dg.collapse(z * 1000.0, 0.05)["significant"] == 2  # scale-free


def test_effective_rank_of_flat_and_constant_spectra():
    assert dg.effective_rank(np.ones(5)) == pytest.approx(5.0)
    p = np.array([0.5, 0.25, 0.25])
    assert dg.effective_rank(p * 8) == pytest.approx(math.exp(-(p * np.log(p)).sum()))
    constant = dg.collapse(torch.ones(10, 4), 1e-3)
    assert constant["significant"] == 0 and constant["effective_rank"] == 0.0


def test_classifier_spectrum_by_hand():
    w = torch.tensor([[3.0, 0.0, 0.0], [0.0, -2.0, 0.0]])
    np.testing.assert_allclose(dg.classifier_spectrum(w), [3.0, 2.0])


def test_alignment_of_identical_orthogonal_and_scaled_classifiers():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4, 8, generator=g)
    same = dg.classifier_alignment([w, w.clone(), w.clone()])
    assert same["cosine"] == pytest.approx(1.0) and same["norm_difference"] == pytest.approx(0.0, abs=1e-12)
    assert same["pairs"] == 3
    eye = torch.eye(4)
    orth = dg.classifier_alignment([eye[:2], eye[2:]])   # class c of client a ⟂ class c of client b
    assert orth["cosine"] == pytest.approx(0.0) and orth["norm_difference"] == pytest.approx(0.0)
    scaled = dg.classifier_alignment([w, 3.0 * w])
    assert scaled["cosine"] == pytest.approx(1.0)
    assert scaled["norm_difference"] == pytest.approx(float(2.0 * w.double().norm(dim=1).mean()))
    flipped = dg.classifier_alignment([w, -w])
    assert flipped["cosine"] == pytest.approx(-1.0)
    assert math.isnan(dg.classifier_alignment([w])["cosine"])


def test_alignment_against_a_float64_loop_over_pairs_and_classes():
    g = torch.Generator().manual_seed(2)
    ws = [torch.randn(3, 5, generator=g) for _ in range(4)]
    cos, diff = [], []
    for a in range(4):
        for b in range(a + 1, 4):
            for c in range(3):
                u, v = ws[a][c].double().numpy(), ws[b][c].double().numpy()
                cos.append(u @ v / np.linalg.norm(u) / np.linalg.norm(v))
                diff.append(abs(np.linalg.norm(u) - np.linalg.norm(v)))
    out = dg.classifier_alignment(ws)
    assert out["cosine"] == pytest.approx(np.mean(cos), rel=1e-12)
    assert out["norm_difference"] == pytest.approx(np.mean(diff), rel=1e-12)


def test_uniformity_against_a_direct_float64_loop():
    z = torch.randn(15, 4, generator=torch.Generator().manual_seed(3))
    unit = z.double().numpy() / np.linalg.norm(z.double().numpy(), axis=1, keepdims=True)
    terms = [math.exp(-2.0 * float(((unit[i] - unit[j]) ** 2).sum())) for i in range(15) for j in range(i + 1, 15)]
    assert dg.hyperspherical_uniformity(z, t=2.0) == pytest.approx(math.log(np.mean(terms)), rel=1e-12)
    # collapsed onto one direction: every distance is 0, the least uniform value
    assert dg.hyperspherical_uniformity(torch.ones(6, 3) * torch.arange(1, 7.0)[:, None]) == pytest.approx(0.0)
    # two antipodal points: log exp(-t·4)
    assert dg.hyperspherical_uniformity(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]), t=0.5) == pytest.approx(-2.0)
    assert math.isnan(dg.hyperspherical_uniformity(torch.ones(1, 3)))


def test_per_class_accuracy_by_hand_counts():
    y = torch.tensor([0, 0, 0, 1, 1, 3])
    pred = torch.tensor([0, 1, 0, 1, 1, 0])
    acc = dg.per_class_accuracy(pred, y, 4)
    assert acc[0] == pytest.approx(2 / 3) and acc[1] == 1.0 and acc[3] == 0.0
    assert math.isnan(acc[2])


def test_representations_are_the_models_z_and_argmax_in_batches():
    torch.manual_seed(0)
    model = MLP(6, [5], 3)
    model.train()
    x = torch.randn(11, 6)
    z, pred = dg.representations(model, x, batch_size=4)
    out = model(x)
    torch.testing.assert_close(z, out.z)
    assert torch.equal(pred, out.logits.argmax(1))
    assert not model.training  # evaluated in eval mode


def test_tsne_shape_groups_and_determinism():
    g = torch.Generator().manual_seed(4)
    feats = [torch.randn(12, 6, generator=g), torch.randn(8, 6, generator=g) + 5.0]
    a = dg.tsne_embedding(feats, [3, 7], seed=11)
    b = dg.tsne_embedding(feats, [3, 7], seed=11)
    assert np.asarray(a["xy"]).shape == (20, 2)
    assert a["group"] == [3] * 12 + [7] * 8
    assert a == b
    assert dg.tsne_embedding([torch.randn(2, 3)], [0], seed=0) == {"xy": [], "group": []}


def test_mean_value_histograms_count_each_samples_mean():
    xs = [torch.tensor([[0.0, 0.0], [1.0, 1.0]]), torch.tensor([[0.0, 2.0], [4.0, 4.0], [4.0, 4.0]])]
    out = dg.mean_value_histograms(xs, bins=4)   # sample means: [0, 1] and [1, 4, 4]; range 0..4
    np.testing.assert_allclose(out["edges"], [0, 1, 2, 3, 4])
    assert out["counts"] == [[1, 1, 0, 0], [0, 1, 0, 2]]
