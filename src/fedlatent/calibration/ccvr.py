"""Classifier calibration with virtual representations (CCVR; Luo et al., "No Fear of
Heterogeneity: Classifier Calibration for Federated Learning with Non-IID Data", NeurIPS 2021,
Sec. 4, Eq. 3-4 and Algorithm 1).

Clients send per-class means, unbiased covariances and counts of their features; the server
pools them into global per-class Gaussians, samples virtual features from them and retrains the
classifier on those with cross-entropy.

Pure functions of tensors: no configuration, no state; randomness only from the
``torch.Generator`` passed in.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from fedlatent.calibration.psd import nearest_psd
from fedlatent.losses.amp import in_float32

__all__ = ["class_statistics", "pool_statistics", "class_sums", "pool_sums", "sample_virtual_features",
           "retrain_classifier"]

ClassStatistics = tuple[Tensor, Tensor, Tensor]


@in_float32
def class_statistics(
    z: Tensor, labels: Tensor, num_classes: int, *, dtype: torch.dtype | None = None
) -> ClassStatistics:
    """Per-class mean, unbiased covariance and count of one client's features.

    Args:
        z: features, ``(N, l)``.
        labels: integer labels in ``[0, num_classes)``, ``(N,)``.
        num_classes: ``C``.
        dtype: dtype of the returned mean and covariance (``None``: ``z.dtype``); the
            computation is done in float64.

    Returns:
        ``(mean, cov, count)``: ``mean`` ``(C, l)`` (zeros for an absent class), ``cov``
        ``(C, l, l)`` with the ``1/(N_c - 1)`` normalisation (zeros for a class with fewer than
        two samples), ``count`` ``(C,)`` int64.

    Example:
        >>> mean, cov, count = class_statistics(torch.randn(6, 2), torch.tensor([0, 0, 0, 1, 1, 2]), 4)
        >>> count.tolist()
        [3, 2, 1, 0]
    """
    if z.dim() != 2:
        raise ValueError(f"class_statistics expects z of shape (N, l), got {tuple(z.shape)}")
    if labels.shape != (z.shape[0],):
        raise ValueError(f"labels must have shape ({z.shape[0]},), got {tuple(labels.shape)}")
    out_dtype = z.dtype if dtype is None else dtype
    labels = labels.long()
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    z64 = z.to(torch.float64)
    dim = z.shape[1]
    count = torch.bincount(labels, minlength=num_classes)
    sums = torch.zeros(num_classes, dim, dtype=torch.float64, device=z.device).index_add_(0, labels, z64)
    mean = sums / count.clamp_min(1).to(torch.float64).unsqueeze(1)
    centred = z64 - mean[labels]
    cov = torch.zeros(num_classes, dim, dim, dtype=torch.float64, device=z.device)
    for c in torch.nonzero(count >= 2).flatten().tolist():
        rows = centred[labels == c]
        cov[c] = rows.T @ rows / (rows.shape[0] - 1)
    return mean.to(out_dtype), cov.to(out_dtype), count


def pool_statistics(statistics: Sequence[ClassStatistics]) -> ClassStatistics:
    """Pool the clients' per-class statistics into global ones (CCVR Eq. 3-4).

    With ``N_c = sum_k N_ck``: ``mu_c = sum_k N_ck mu_ck / N_c`` and

    ``Sigma_c = sum_k (N_ck-1)/(N_c-1) Sigma_ck + sum_k N_ck/(N_c-1) mu_ck mu_ck^T
    - N_c/(N_c-1) mu_c mu_c^T``,

    which is exactly the unbiased covariance of the concatenated features of class ``c``.
    ``(N_ck - 1)`` is clipped at 0, so a client without samples of a class contributes nothing
    whatever it sends for it. Classes with ``N_c < 2`` get a zero covariance, and a zero mean
    when ``N_c = 0``. Clients are accumulated one at a time (memory of one client's statistics).

    Args:
        statistics: one ``(mean, cov, count)`` triple per client, as from
            :func:`class_statistics`.

    Returns:
        ``(mean, cov, count)`` of the pooled data, mean and covariance in the first client's
        dtype, count int64.
    """
    triples = list(statistics)
    if not triples:
        raise ValueError("pool_statistics needs at least one client's statistics")
    mean0, cov0, count0 = triples[0]
    num_classes, dim = mean0.shape
    for mean_k, cov_k, count_k in triples:
        if mean_k.shape != mean0.shape or cov_k.shape != (num_classes, dim, dim) or count_k.shape != (num_classes,):
            raise ValueError("all clients' statistics must have shapes (C, l), (C, l, l), (C,)")
    device = mean0.device
    total = torch.zeros(num_classes, dtype=torch.float64, device=device)
    first = torch.zeros(num_classes, dim, dtype=torch.float64, device=device)
    second = torch.zeros(num_classes, dim, dim, dtype=torch.float64, device=device)
    for mean_k, cov_k, count_k in triples:
        n_k = count_k.to(device=device, dtype=torch.float64)
        mu_k = mean_k.to(device=device, dtype=torch.float64)
        total += n_k
        first += n_k.unsqueeze(1) * mu_k
        second += (n_k - 1).clamp_min(0).view(-1, 1, 1) * cov_k.to(device=device, dtype=torch.float64)
        second += n_k.view(-1, 1, 1) * (mu_k.unsqueeze(2) * mu_k.unsqueeze(1))
    mean = first / total.clamp_min(1).unsqueeze(1)
    second -= total.view(-1, 1, 1) * (mean.unsqueeze(2) * mean.unsqueeze(1))
    enough = total >= 2
    cov = torch.where(enough.view(-1, 1, 1), second / (total - 1).clamp_min(1).view(-1, 1, 1), torch.zeros_like(second))
    cov = 0.5 * (cov + cov.transpose(1, 2))
    return mean.to(mean0.dtype), cov.to(mean0.dtype), total.round().to(torch.int64)


@in_float32
def class_sums(z: Tensor, labels: Tensor, num_classes: int) -> ClassStatistics:
    """One client's per-class sums of its features, the form that noise can be added to (CCVR under
    differential privacy): ``(count, first, second)`` = (N_c, Σ z, Σ z zᵀ) over each class, in float64,
    count included (a float, so that clipping may scale it with the rest).

    Args:
        z: features, ``(N, l)``.
        labels: integer labels in ``[0, num_classes)``, ``(N,)``.
        num_classes: ``C``.

    Returns:
        ``count`` ``(C,)``, ``first`` ``(C, l)``, ``second`` ``(C, l, l)``, float64; zeros for an absent class.
    """
    if z.dim() != 2 or labels.shape != (z.shape[0],):
        raise ValueError(f"class_sums expects z (N, l) and labels (N,), got {tuple(z.shape)}, {tuple(labels.shape)}")
    labels = labels.long()
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    z64 = z.to(torch.float64)
    onehot = F.one_hot(labels, num_classes).to(torch.float64)
    first = onehot.T @ z64
    second = torch.einsum("nc,ni,nj->cij", onehot, z64, z64)
    return onehot.sum(0), first, second


def pool_sums(count: Tensor, first: Tensor, second: Tensor, *, dtype: torch.dtype = torch.float32) -> ClassStatistics:
    """The pooled per-class Gaussians from the sums of :func:`class_sums` over the clients, noisy
    ones included: μ_c = Σz / N_c and Σ_c = (Σ zzᵀ − N_c μ_c μ_cᵀ) / (N_c − 1), the unbiased
    covariance of the pooled features when the sums are exact (what :func:`pool_statistics` gives).

    Under noise the covariance is made symmetric and projected onto the positive semidefinite cone
    (the nearest such matrix in Frobenius norm, Higham 1988: negative eigenvalues set to 0), and a
    class whose count falls below 1 counts as absent (count 0, zero mean and covariance), one below 2
    gets a zero covariance (as :func:`pool_statistics` treats them).

    Returns:
        ``(mean, cov, count)``: mean and covariance in ``dtype``, count the rounded N_c (int64, ≥ 0).
    """
    num_classes, dim = first.shape
    if count.shape != (num_classes,) or second.shape != (num_classes, dim, dim):
        raise ValueError("the sums must have shapes (C,), (C, l), (C, l, l)")
    total = count.to(torch.float64)
    present = total >= 1
    mean = torch.where(present.unsqueeze(1), first.to(torch.float64) / total.clamp_min(1).unsqueeze(1),
                       torch.zeros_like(first, dtype=torch.float64))
    centred = second.to(torch.float64) - total.view(-1, 1, 1) * (mean.unsqueeze(2) * mean.unsqueeze(1))
    cov = nearest_psd(centred / (total - 1).clamp_min(1).view(-1, 1, 1))
    cov = torch.where((total >= 2).view(-1, 1, 1), cov, torch.zeros_like(cov))
    counts = torch.where(present, total.round(), torch.zeros_like(total)).to(torch.int64)
    return mean.to(dtype), cov.to(dtype), counts


@in_float32
def sample_virtual_features(
    mean: Tensor,
    cov: Tensor,
    counts_per_class: int | Tensor,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """Draw virtual features from ``N(mu_c, Sigma_c)`` for every class (CCVR Sec. 4).

    ``Sigma_c`` is symmetrised and factorised in float64 as its symmetric square root
    ``Q diag(sqrt(lambda)) Q^T`` (an eigendecomposition, negative eigenvalues clipped to zero), so
    singular covariances (fewer samples than dimensions, collapsed features, a class with a zero
    covariance) are handled: samples then lie in the covariance's support. The symmetric root, not
    ``Q diag(sqrt(lambda))``, because it is a continuous function of ``Sigma_c``: the eigenvectors of
    close eigenvalues turn freely under a perturbation of the last bits, so ``Q``'s samples would
    jump, the root's move with the perturbation (statistics rounded differently, or quantised under
    secure aggregation, give nearby virtual features for one ``generator``).

    Args:
        mean: ``(C, l)``.
        cov: ``(C, l, l)``.
        counts_per_class: ``M_c``, one int for every class or a ``(C,)`` integer tensor (put 0
            for classes that no client holds).
        generator: the source of randomness (its device is where the normals are drawn).

    Returns:
        ``(features, labels)``: ``(sum_c M_c, l)`` in ``mean``'s dtype and device, grouped by
        class in ascending order, and int64 labels.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> x, y = sample_virtual_features(torch.zeros(2, 3), torch.eye(3).expand(2, 3, 3), 5, g)
        >>> tuple(x.shape), y.tolist()
        ((10, 3), [0, 0, 0, 0, 0, 1, 1, 1, 1, 1])
    """
    if mean.dim() != 2 or cov.shape != (mean.shape[0], mean.shape[1], mean.shape[1]):
        raise ValueError(f"mean must be (C, l) and cov (C, l, l); got {tuple(mean.shape)}, {tuple(cov.shape)}")
    num_classes, dim = mean.shape
    if isinstance(counts_per_class, Tensor):
        counts = counts_per_class.to(torch.int64).flatten().tolist()
        if len(counts) != num_classes:
            raise ValueError(f"counts_per_class must have {num_classes} entries, got {len(counts)}")
    else:
        counts = [int(counts_per_class)] * num_classes
    if any(m < 0 for m in counts):
        raise ValueError("counts_per_class must be non-negative")
    cov64 = cov.to(torch.float64)
    eigenvalues, eigenvectors = torch.linalg.eigh(0.5 * (cov64 + cov64.transpose(1, 2)))
    factors = (eigenvectors * eigenvalues.clamp_min(0).sqrt().unsqueeze(1)) @ eigenvectors.transpose(1, 2)
    features, labels = [], []
    for c, m in enumerate(counts):
        if m == 0:
            continue
        noise = torch.randn(m, dim, generator=generator, dtype=torch.float64, device=generator.device)
        noise = noise.to(mean.device)
        features.append(mean[c].to(torch.float64) + noise @ factors[c].T)
        labels.append(torch.full((m,), c, dtype=torch.int64, device=mean.device))
    if not features:
        return mean.new_zeros(0, dim), torch.zeros(0, dtype=torch.int64, device=mean.device)
    return torch.cat(features).to(mean.dtype), torch.cat(labels)


@in_float32
def retrain_classifier(
    weight: Tensor,
    bias: Tensor | None,
    features: Tensor,
    labels: Tensor,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    generator: torch.Generator,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    loss: str = "ce",
) -> tuple[Tensor, Tensor | None]:
    """Retrain a linear classifier on (virtual) features with cross-entropy (CCVR, Luo et al. 2021) or
    SphereFed's MSE (1/C)‖Wz + b − onehot(y)‖² averaged over the batch (``loss = "mse"``: one of the two
    losses SphereFed's Table 4 sanity check tries), and mini-batch SGD.

    The inputs are not modified: the function trains copies and returns them detached.

    Args:
        weight: ``(C, l)`` (``nn.Linear.weight`` layout).
        bias: ``(C,)`` or ``None`` for a bias-free head.
        features: ``(M, l)``; labels: ``(M,)`` integer.
        epochs: passes over the features, each in an order drawn from ``generator``.
        lr, batch_size, momentum, weight_decay: plain SGD settings.
        loss: ``"ce"`` or ``"mse"``.
        generator: the source of the shuffling.

    Returns:
        ``(weight, bias)`` retrained, same dtypes and devices as given (``bias`` stays ``None``).
    """
    if features.dim() != 2 or features.shape[1] != weight.shape[1] or labels.shape != (features.shape[0],):
        raise ValueError("features must be (M, l) with l = weight.shape[1] and labels (M,)")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if loss not in ("ce", "mse"):
        raise ValueError(f"loss must be 'ce' or 'mse', got {loss!r}")
    w = weight.detach().clone().requires_grad_(True)
    b = None if bias is None else bias.detach().clone().requires_grad_(True)
    params = [w] if b is None else [w, b]
    optimiser = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    x = features.detach().to(device=w.device, dtype=w.dtype)
    y = labels.to(device=w.device, dtype=torch.int64)
    n = x.shape[0]
    with torch.enable_grad():
        for _ in range(epochs):
            order = torch.randperm(n, generator=generator, device=generator.device).to(w.device)
            for start in range(0, n, batch_size):
                index = order[start : start + batch_size]
                value = _head_loss(loss, F.linear(x[index], w, b), y[index])
                optimiser.zero_grad(set_to_none=True)
                value.backward()
                optimiser.step()
    return w.detach(), None if b is None else b.detach()


def _head_loss(kind: str, logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy, or the mean over the batch of (1/C)‖logits − onehot(y)‖² (SphereFed Eq. 5's MSE)."""
    if kind == "mse":
        return F.mse_loss(logits, F.one_hot(labels, logits.shape[1]).to(logits.dtype))
    return F.cross_entropy(logits, labels)
