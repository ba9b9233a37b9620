"""The papers' diagnostics as pure computations on models and tensors (nothing here trains).

- Dimensional collapse (Shi et al., FedDecorr, ICLR 2023, Sec. 3.1, Figs. 2-3): the singular
  values σ_1 ≥ … ≥ σ_d of the covariance of z over a split, C = (1/N) Σ (z_i − z̄)(z_i − z̄)ᵀ.
  FedDecorr plots them on a log scale and calls σ_k *significant* when it exceeds a small
  threshold. fedlatent makes the threshold relative, so that it does not depend on the scale of
  z (which differs between methods and heterogeneity levels): σ_k is significant when
  σ_k / σ_1 > τ. The normalised spectrum is σ_k / σ_1. Beside the count, the threshold-free
  effective rank exp(H(p)), p_k = σ_k / Σ σ (Roy & Vetterli 2007), is reported.
- Classifier singular values (Son et al., FedUV, CVPR 2024, Fig. 1) and cross-client alignment of
  the classifier rows: for every pair of clients and every class, the cosine and the absolute
  norm difference of the two clients' weight vectors of that class, averaged.
- Alignment of consecutive layers (FedDecorr, Appendix A.3, Assumption 2 and Fig. 6; Ji & Telgarsky
  2018): for consecutive weight matrices W_i, W_{i+1} (the output of W_i feeds W_{i+1}), the
  absolute inner product |⟨u_{i,k}, v_{i+1,k}⟩| of W_i's k-th left and W_{i+1}'s k-th right
  singular vector; 1 when aligned, E|⟨u, v⟩| = Γ(d/2) / (√π Γ((d+1)/2)) for independent uniform
  unit vectors in R^d (about √(2/(πd))). A convolution's weight (out, in, kh, kw) is read as the
  matrix of its channels — W_i as (out, in·kh·kw), its left singular vectors in the output-channel
  space; W_{i+1} as (out·kh·kw, in), its right ones in the input-channel space, the same space —
  (fedlatent's reading: the paper states the assumption for linear layers); grouped (depthwise)
  convolutions are skipped, a pair whose dimensions do not meet (a flatten between them) too.
- Hyperspherical uniformity (Wang & Isola 2020, the quantity behind FedUV's L_U):
  log mean_{i<j} exp(−t‖ẑ_i − ẑ_j‖²) of the unit-normalised z (in [−4t, 0]; lower = more uniform).
- Per-class accuracy; a seeded t-SNE (scikit-learn) of one class's features from several clients.
- The FedUV supplement's data figures: the client × class label counts and, per client, the
  histogram of each sample's mean input value.

Where a split is held in parts (clients), the sums-based forms combine the parts exactly:
feature moments (:func:`feature_moments`, :func:`pool_moments`) for the spectrum, per-class hits
(:func:`class_hits`) for the accuracies, value ranges and counts (:func:`histogram_edges`) for
the histograms.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from fedlatent.models.base import FedModel
from fedlatent.losses.amp import in_float32


@torch.no_grad()
def representations(model: FedModel, x: Tensor, batch_size: int = 500,
                    device: torch.device = torch.device("cpu")) -> tuple[Tensor, Tensor]:
    """z and the predicted classes of ``model`` (in eval mode) on ``x``, on the CPU."""
    model.eval()
    zs, preds = [], []
    for start in range(0, len(x), batch_size):
        out = model(x[start:start + batch_size].to(device))
        zs.append(out.z.detach().cpu())
        preds.append(out.logits.argmax(1).cpu())
    if not zs:
        return torch.zeros(0, getattr(model, "z_dim", 0)), torch.zeros(0, dtype=torch.long)
    return torch.cat(zs), torch.cat(preds)


@in_float32
def feature_moments(z: Tensor) -> tuple[int, Tensor, Tensor]:
    """(N, z̄, S) of the rows of ``z`` (N×d) in float64: the count, the mean and the centred scatter
    S = Σ(z_i − z̄)(z_i − z̄)ᵀ; what a holder of part of a split sends for the collapse spectrum."""
    if z.dim() != 2 or z.shape[0] < 1:
        raise ValueError(f"feature_moments expects z of shape (N, d) with N >= 1, got {tuple(z.shape)}")
    z64 = z.detach().to(torch.float64)
    mean = z64.mean(0)
    centred = z64 - mean
    return z64.shape[0], mean, centred.T @ centred


def pool_moments(parts: list[tuple[int, Tensor, Tensor]]) -> tuple[int, Tensor, Tensor]:
    """The moments of the union of disjoint row sets from theirs, merged in list order (Chan,
    Golub & LeVeque 1979): with δ = z̄_b − z̄_a, z̄ = z̄_a + δ·n_b/n and S = S_a + S_b + δδᵀ·n_a·n_b/n.
    Sums of centred terms, so no cancellation as in ΣzzT − N·z̄z̄ᵀ; one part is returned as it is."""
    if not parts:
        raise ValueError("pool_moments needs at least one part")
    n, mean, scatter = parts[0]
    for n_b, mean_b, scatter_b in parts[1:]:
        total = n + n_b
        delta = mean_b - mean
        mean = mean + delta * (n_b / total)
        scatter = scatter + scatter_b + torch.outer(delta, delta) * (n * n_b / total)
        n = total
    return n, mean, scatter


def moments_spectrum(count: int, scatter: Tensor) -> np.ndarray:
    """Singular values (descending, float64) of the covariance S/N; FedDecorr Sec. 3.1."""
    return torch.linalg.svdvals(scatter.to(torch.float64) / count).numpy()


@in_float32
def covariance_spectrum(z: Tensor) -> np.ndarray:
    """Singular values (descending, float64) of the covariance (1/N)·Σ(z_i − z̄)(z_i − z̄)ᵀ of
    the rows of ``z`` (N×d); FedDecorr Sec. 3.1."""
    count, _, scatter = feature_moments(z)
    return moments_spectrum(count, scatter)


@in_float32
def collapse(z: Tensor, threshold: float) -> dict[str, Any]:
    """Dimensional-collapse summary of ``z``: the covariance spectrum, its normalisation by the
    largest singular value, the count of σ_k/σ_1 > ``threshold`` and the effective rank."""
    return spectrum_collapse(covariance_spectrum(z), threshold)


def spectrum_collapse(sv: np.ndarray, threshold: float) -> dict[str, Any]:
    """The collapse summary of a covariance spectrum ``sv`` (descending). A spectrum of zeros
    (constant z) has no significant value and effective rank 0."""
    top = float(sv[0]) if sv.size else 0.0
    normalized = sv / top if top > 0 else np.zeros_like(sv)
    return {"singular_values": sv.tolist(), "normalized_spectrum": normalized.tolist(),
            "significant": int((normalized > threshold).sum()), "effective_rank": effective_rank(sv)}


def effective_rank(singular_values: np.ndarray) -> float:
    """exp of the Shannon entropy of σ/Σσ (Roy & Vetterli 2007); 0 for an all-zero spectrum."""
    sv = np.asarray(singular_values, dtype=np.float64)
    total = sv.sum()
    if total <= 0:
        return 0.0
    p = sv[sv > 0] / total
    return float(math.exp(-(p * np.log(p)).sum()))


def classifier_spectrum(weight: Tensor) -> np.ndarray:
    """Singular values (descending, float64) of a classifier weight matrix (C×d); FedUV Fig. 1."""
    return torch.linalg.svdvals(weight.detach().to(torch.float64)).numpy()


def classifier_alignment(weights: list[Tensor]) -> dict[str, float]:
    """Alignment of the same class's classifier rows between clients: over every pair of clients
    a < b and every class c, the mean of cos(W_a[c], W_b[c]) and of |‖W_a[c]‖ − ‖W_b[c]‖|.
    A zero row has cosine 0 with anything. Needs at least two clients (else NaN)."""
    if len(weights) < 2:
        return {"cosine": float("nan"), "norm_difference": float("nan"), "pairs": 0}
    w = torch.stack([x.detach().to(torch.float64) for x in weights])  # K×C×d
    a, b = torch.triu_indices(len(weights), len(weights), offset=1)
    cos = F.cosine_similarity(w[a], w[b], dim=-1, eps=1e-300)
    norms = w.norm(dim=-1)
    diff = (norms[a] - norms[b]).abs()
    return {"cosine": float(cos.mean()), "norm_difference": float(diff.mean()), "pairs": int(len(a))}


@in_float32
def layer_matrices(model: torch.nn.Module) -> list[tuple[str, Tensor]]:
    """The model's linear and (ungrouped) convolutional weights in module order, a FedModel's
    ``classifier`` (registered before its encoder in some models) last: its place in the forward
    pass. Convolutions keep their kernel axes; :func:`singular_alignment` reads them as matrices."""
    layers = [(name, module.weight.detach()) for name, module in model.named_modules()
              if isinstance(module, torch.nn.Linear) or (isinstance(module, torch.nn.Conv2d) and module.groups == 1)]
    return sorted(layers, key=lambda layer: layer[0].split(".")[0] == "classifier")  # stable: the rest in order


def _left(weight: Tensor) -> Tensor:
    return weight.flatten(1)  # (out, in·kh·kw): the output channels' space on the left


def _right(weight: Tensor) -> Tensor:
    return weight.movedim(1, -1).reshape(-1, weight.shape[1])  # (out·kh·kw, in): the input channels' on the right


@in_float32
def singular_alignment(previous: Tensor, following: Tensor, k: int) -> list[float]:
    """|⟨u_j, v_j⟩| for j < k: ``previous``'s j-th left and ``following``'s j-th right singular
    vector (FedDecorr Assumption 2), both weights as :func:`layer_matrices` holds them; float64."""
    u = torch.linalg.svd(_left(previous).double(), full_matrices=False)[0]
    v = torch.linalg.svd(_right(following).double(), full_matrices=False)[2].T
    k = min(k, u.shape[1], v.shape[1])
    return (u[:, :k] * v[:, :k]).sum(0).abs().tolist()


def consecutive_alignment(model: torch.nn.Module, k: int = 5) -> list[dict[str, Any]]:
    """:func:`singular_alignment` of the first ``k`` singular-vector pairs of every two consecutive
    layers of :func:`layer_matrices` whose dimensions meet (the second's input channels are the
    first's outputs)."""
    layers = layer_matrices(model)
    return [{"layers": [a, b], "alignment": singular_alignment(wa, wb, k)}
            for (a, wa), (b, wb) in zip(layers, layers[1:]) if wb.shape[1] == wa.shape[0]]


def random_alignment(dim: int) -> float:
    """E|⟨u, v⟩| of independent uniform unit vectors in R^dim: Γ(d/2) / (√π Γ((d+1)/2)), the
    alignment of unrelated layers."""
    return math.exp(math.lgamma(dim / 2) - math.lgamma((dim + 1) / 2)) / math.sqrt(math.pi)


def hyperspherical_uniformity(z: Tensor, t: float = 2.0) -> float:
    """log mean_{i<j} exp(−t‖ẑ_i − ẑ_j‖²) of the unit-normalised rows ẑ of ``z`` (Wang & Isola
    2020, Eq. 4 with all pairs i < j); NaN for fewer than two rows. Computed in float64."""
    if z.shape[0] < 2:
        return float("nan")
    unit = F.normalize(z.detach().to(torch.float64), dim=1)
    sq = torch.pdist(unit).square()
    return float(torch.logsumexp(-t * sq, 0) - math.log(sq.numel()))


def class_hits(pred: Tensor, y: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """Per class, the number of correct predictions and of samples (float64, integer-valued, so
    they sum exactly over the holders of a split)."""
    correct = torch.zeros(num_classes, dtype=torch.float64).index_add_(0, y, (pred == y).double())
    return correct, torch.bincount(y, minlength=num_classes).double()


def hits_accuracy(correct: Tensor, counts: Tensor) -> list[float]:
    """Accuracy on each class from its hit and sample counts (NaN for a class without samples)."""
    return [float(c / n) if n > 0 else float("nan") for c, n in zip(correct.tolist(), counts.tolist())]


def per_class_accuracy(pred: Tensor, y: Tensor, num_classes: int) -> list[float]:
    """Accuracy on each class's samples (NaN for a class absent from ``y``)."""
    return hits_accuracy(*class_hits(pred, y, num_classes))


def tsne_embedding(features: list[Tensor], groups: list[int], seed: int,
                   perplexity: float = 30.0) -> dict[str, list]:
    """A 2-D t-SNE (scikit-learn, PCA init, ``random_state`` = ``seed``) of the rows of all
    ``features`` together; ``group`` gives each point's entry of ``groups`` (e.g. its client id).
    The perplexity is capped below the number of points; fewer than 3 points give empty lists."""
    from sklearn.manifold import TSNE
    x = torch.cat([f.detach().to(torch.float64) for f in features]).numpy() if features else np.zeros((0, 1))
    labels = [g for f, g in zip(features, groups) for _ in range(len(f))]
    if len(x) < 3:
        return {"xy": [], "group": []}
    tsne = TSNE(n_components=2, perplexity=min(perplexity, (len(x) - 1) / 3), init="pca",
                random_state=seed % 2**32)
    xy = tsne.fit_transform(x)
    return {"xy": xy.tolist(), "group": labels}


def sample_means(x: Tensor) -> np.ndarray:
    """Each sample's mean input value (float64), the quantity of the FedUV supplement's histograms."""
    return x.detach().flatten(1).to(torch.float64).mean(1).numpy() if len(x) else np.zeros(0)


def histogram_edges(ranges: list[tuple[float, float] | None], bins: int) -> np.ndarray:
    """``bins`` + 1 edges over the union of the value ranges (None for a set without values),
    [0, 1] when there is none, a unit width when all values are equal."""
    known = [r for r in ranges if r is not None]
    low, high = (min(r[0] for r in known), max(r[1] for r in known)) if known else (0.0, 1.0)
    return np.linspace(low, high if high > low else low + 1.0, bins + 1)


def mean_value_histograms(xs: Iterable[Tensor], bins: int) -> dict[str, list]:
    """Per set in ``xs`` (e.g. each client's training inputs), the histogram of each sample's mean
    value over the common range (FedUV supplement, feature-distribution figures); ``xs`` is read
    once, so a generator holds one set at a time."""
    means = [sample_means(x) for x in xs]
    edges = histogram_edges([(float(m.min()), float(m.max())) if m.size else None for m in means], bins)
    return {"edges": edges.tolist(), "counts": [np.histogram(m, edges)[0].tolist() for m in means]}
