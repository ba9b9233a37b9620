"""CCVR statistics, pooling, sampling and retraining against float64 numpy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlatent.calibration.ccvr import class_statistics, pool_statistics, retrain_classifier, sample_virtual_features


def numpy_class_statistics(z: np.ndarray, y: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    l = z.shape[1]
    mean, cov, count = np.zeros((c, l)), np.zeros((c, l, l)), np.zeros(c, dtype=np.int64)
    for k in range(c):
        rows = z[y == k]
        count[k] = len(rows)
        if len(rows):
            mean[k] = rows.mean(axis=0)
        if len(rows) >= 2:
            cov[k] = np.cov(rows, rowvar=False, ddof=1).reshape(l, l)
    return mean, cov, count


def test_class_statistics_match_numpy() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(size=(40, 3))
    y = rng.integers(0, 4, size=40)
    y[y == 3] = 0
    y[5] = 3  # class 3 has one sample, class 4 none
    mean, cov, count = class_statistics(torch.from_numpy(z), torch.from_numpy(y), 5)
    m_ref, c_ref, n_ref = numpy_class_statistics(z, y, 5)
    assert mean.shape == (5, 3) and cov.shape == (5, 3, 3) and count.dtype == torch.int64
    np.testing.assert_allclose(mean.numpy(), m_ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(cov.numpy(), c_ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(count.numpy(), n_ref)
    assert torch.all(cov[3] == 0) and torch.all(cov[4] == 0) and torch.all(mean[4] == 0)


def literal_pool(stats: list[tuple[np.ndarray, np.ndarray, np.ndarray]], c: int) -> tuple[np.ndarray, np.ndarray]:
    """METHODS.md's formula, written out class by class and client by client."""
    l = stats[0][0].shape[1]
    mean, cov = np.zeros((c, l)), np.zeros((c, l, l))
    for k in range(c):
        n_c = sum(int(s[2][k]) for s in stats)
        if n_c == 0:
            continue
        mean[k] = sum(s[2][k] * s[0][k] for s in stats) / n_c
        if n_c < 2:
            continue
        total = np.zeros((l, l))
        for mu_ck, sigma_ck, n_ck in ((s[0][k], s[1][k], int(s[2][k])) for s in stats):
            if n_ck >= 1:
                total += (n_ck - 1) / (n_c - 1) * sigma_ck + n_ck / (n_c - 1) * np.outer(mu_ck, mu_ck)
        cov[k] = total - n_c / (n_c - 1) * np.outer(mean[k], mean[k])
    return mean, cov


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pooled_equals_concatenated(seed: int) -> None:
    rng = np.random.default_rng(seed)
    c, l = 6, 4
    z = rng.normal(loc=3.0, size=(150, l))
    y = rng.integers(0, c - 1, size=150)  # class c-1 held by nobody
    y[0] = c - 1
    clients = np.array_split(rng.permutation(150), 3)
    # make the split non-IID: client 0 holds no sample of class 0
    moved = [i for i in clients[0] if y[i] == 0]
    clients[0] = np.array([i for i in clients[0] if y[i] != 0])
    clients[1] = np.concatenate([clients[1], moved]).astype(int)
    per_client = [class_statistics(torch.from_numpy(z[p]), torch.from_numpy(y[p]), c) for p in clients]
    mean, cov, count = pool_statistics(per_client)
    m_ref, c_ref, n_ref = numpy_class_statistics(z, y, c)
    np.testing.assert_allclose(mean.numpy(), m_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(cov.numpy(), c_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(count.numpy(), n_ref)
    lit_mean, lit_cov = literal_pool([tuple(t.numpy() for t in s) for s in per_client], c)
    np.testing.assert_allclose(mean.numpy(), lit_mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(cov.numpy(), lit_cov, rtol=1e-10, atol=1e-12)


def test_pool_single_sample_classes_and_dtype() -> None:
    z = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    a = class_statistics(z[:1], torch.tensor([0]), 2)
    b = class_statistics(z[1:], torch.tensor([0]), 2)
    mean, cov, count = pool_statistics([a, b])
    assert mean.dtype == torch.float32 and count.tolist() == [2, 0]
    np.testing.assert_allclose(mean[0].numpy(), [2.0, 3.5])
    np.testing.assert_allclose(cov[0].numpy(), np.cov(z.numpy(), rowvar=False), rtol=1e-6)
    assert torch.all(cov[1] == 0) and torch.all(mean[1] == 0)
    only_one = pool_statistics([a])
    assert torch.all(only_one[1] == 0) and torch.isfinite(only_one[0]).all()


def test_virtual_features_moments() -> None:
    rng = np.random.default_rng(3)
    l = 3
    a = rng.normal(size=(l, l))
    cov0 = a @ a.T + 0.1 * np.eye(l)
    cov1 = np.outer([1.0, -1.0, 0.5], [1.0, -1.0, 0.5])  # rank one, singular
    mean = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]], dtype=torch.float64)
    cov = torch.from_numpy(np.stack([cov0, cov1]))
    g = torch.Generator().manual_seed(0)
    x, y = sample_virtual_features(mean, cov, 200_000, g)
    assert x.shape == (400_000, l) and x.dtype == torch.float64 and torch.isfinite(x).all()
    for k, target in enumerate((cov0, cov1)):
        xs = x[y == k].numpy()
        np.testing.assert_allclose(xs.mean(axis=0), mean[k].numpy(), atol=0.02)
        np.testing.assert_allclose(np.cov(xs, rowvar=False), target, atol=0.03 * np.abs(target).max())
    # the singular class's samples stay in the covariance's support
    centred = x[y == 1].numpy() - mean[1].numpy()
    orthogonal = np.linalg.svd(cov1)[0][:, 1:]
    assert np.abs(centred @ orthogonal).max() < 1e-6


def test_virtual_features_move_continuously_with_the_covariance() -> None:
    """Two nearly equal eigenvalues (1 and 1 + 1e-12) whose eigenvectors a perturbation of 1e-9
    turns freely: the samples of one generator move by about the perturbation (the symmetric square
    root is Lipschitz with constant 1 / (2 sqrt(lambda_min)) here), not by the samples' size; and
    they are mean + Sigma^(1/2) eps, Sigma^(1/2) the root numpy computes from the same eigenpairs."""
    rng = np.random.default_rng(4)
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    cov = q @ np.diag([1.0, 1.0 + 1e-12, 0.5]) @ q.T
    bump = rng.normal(size=(3, 3)) * 1e-9
    moved = cov + 0.5 * (bump + bump.T)
    mean = torch.zeros(1, 3, dtype=torch.float64)
    x, _ = sample_virtual_features(mean, torch.from_numpy(cov[None]), 50, torch.Generator().manual_seed(2))
    y, _ = sample_virtual_features(mean, torch.from_numpy(moved[None]), 50, torch.Generator().manual_seed(2))
    eps = torch.randn(50, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64).numpy()
    assert float((x - y).abs().max()) < 1e-7 * max(1.0, float(np.abs(eps).max()))
    lam, vec = np.linalg.eigh(cov)
    np.testing.assert_allclose(x.numpy(), eps @ (vec @ np.diag(np.sqrt(lam)) @ vec.T).T, atol=1e-12)


def test_virtual_features_counts_determinism_and_indefinite_input() -> None:
    mean = torch.randn(3, 2)
    cov = torch.eye(2).repeat(3, 1, 1)
    cov[2] = torch.tensor([[1.0, 2.0], [2.0, 1.0]])  # indefinite: negative eigenvalue clipped
    counts = torch.tensor([4, 0, 2])
    x1, y1 = sample_virtual_features(mean, cov, counts, torch.Generator().manual_seed(7))
    x2, y2 = sample_virtual_features(mean, cov, counts, torch.Generator().manual_seed(7))
    assert torch.equal(x1, x2) and y1.tolist() == [0, 0, 0, 0, 2, 2]
    assert x1.dtype == torch.float32 and torch.isfinite(x1).all()
    x0, y0 = sample_virtual_features(mean, cov, 0, torch.Generator())
    assert x0.shape == (0, 2) and y0.shape == (0,)
    with pytest.raises(ValueError):
        sample_virtual_features(mean, cov, torch.tensor([1, 2]), torch.Generator())


def test_retrain_classifier_learns_and_is_pure() -> None:
    torch.manual_seed(0)
    c, l = 4, 6
    centres = 4.0 * torch.randn(c, l)
    mean = centres
    cov = 0.25 * torch.eye(l).repeat(c, 1, 1)
    x, y = sample_virtual_features(mean, cov, 200, torch.Generator().manual_seed(1))
    weight, bias = torch.zeros(c, l), torch.zeros(c)
    w1, b1 = retrain_classifier(weight, bias, x, y, epochs=5, lr=0.1, batch_size=32, generator=torch.Generator().manual_seed(2))
    w2, b2 = retrain_classifier(weight, bias, x, y, epochs=5, lr=0.1, batch_size=32, generator=torch.Generator().manual_seed(2))
    assert torch.all(weight == 0) and torch.all(bias == 0)  # inputs untouched
    assert torch.equal(w1, w2) and torch.equal(b1, b2)  # deterministic for a generator
    assert not w1.requires_grad and w1.dtype == torch.float32 and b1 is not None
    accuracy = ((x @ w1.T + b1).argmax(dim=1) == y).double().mean()
    assert float(accuracy) > 0.95
    w3, b3 = retrain_classifier(weight, None, x, y, epochs=2, lr=0.1, batch_size=64, generator=torch.Generator(), momentum=0.9)
    assert b3 is None and torch.isfinite(w3).all()
    with torch.no_grad():  # works inside a no-grad context as well
        w4, _ = retrain_classifier(weight, bias, x, y, epochs=1, lr=0.1, batch_size=32, generator=torch.Generator())
    assert not torch.all(w4 == 0)


def test_retrain_matches_manual_sgd() -> None:
    """One full-batch epoch = one gradient step of cross-entropy, computed by hand."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(10, 3))
    y = rng.integers(0, 2, size=10)
    w0 = rng.normal(size=(2, 3))
    b0 = rng.normal(size=2)
    logits = x @ w0.T + b0
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(10), y] -= 1.0
    grad_w, grad_b = p.T @ x / 10, p.sum(axis=0) / 10
    w, b = retrain_classifier(
        torch.from_numpy(w0), torch.from_numpy(b0), torch.from_numpy(x), torch.from_numpy(y),
        epochs=1, lr=0.5, batch_size=10, generator=torch.Generator(),
    )
    np.testing.assert_allclose(w.numpy(), w0 - 0.5 * grad_w, rtol=1e-12)
    np.testing.assert_allclose(b.numpy(), b0 - 0.5 * grad_b, rtol=1e-12)
