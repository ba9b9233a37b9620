"""Head policy applied to a freshly built model: fixed or learned, orthonormal or Tammes init,
normalised z."""
from __future__ import annotations

import functools
import math

import torch
from torch.nn import functional as F

from fedlatent.errors import ConfigError
from fedlatent.methods.parts import HeadPolicy
from fedlatent.models.base import FedModel


def orthonormal_rows(num_classes: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """C×l matrix with orthonormal rows: Q of the QR decomposition of an l×C Gaussian, transposed
    (SphereFed, Dong et al. 2022, Sec. 3.1). Needs C ≤ l."""
    _check_orthogonal(num_classes, dim)
    q, r = torch.linalg.qr(torch.randn(dim, num_classes, generator=generator, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))  # a unique Q for the Gaussian draw
    return q.T.contiguous().float()


def _check_orthogonal(num_classes: int, dim: int) -> None:
    """Orthonormal rows exist only for C ≤ l."""
    if num_classes > dim:
        raise ConfigError(f"algorithm.head_init = 'orthogonal': {num_classes} classes need a representation "
                          f"of at least {num_classes} dimensions, the model's z has {dim}")


def check_head(policy: HeadPolicy, model: FedModel) -> None:
    """Refuse a head policy ``model`` cannot take (orthonormal rows wider than its z), from the
    model's shape alone: what :func:`apply_head` would raise, without drawing the rows."""
    if policy.init == "orthogonal":
        _check_orthogonal(model.classifier.out_features, model.classifier.in_features)


def tammes_rows(num_classes: int, dim: int, generator: torch.Generator, steps: int = 10_000) -> torch.Tensor:
    """C×l unit rows spread on the sphere by maximising their minimum pairwise angle (the Tammes
    problem): SphereFed's alternative initialisation (Dong et al. 2022, Appendix D, Table 10),
    following Mettes et al. 2019 (Hyperspherical Prototype Networks, Eq. 5): minimise
    (1/C) Σ_i max_{j≠i} cos(w_i, w_j) with SGD (lr 0.1, momentum 0.9), the rows renormalised after
    each of ``steps`` steps (10^4 in the paper), from Gaussian rows; the iterate with the largest
    minimum angle is returned (with few rows in few dimensions these steps oscillate, and the
    last iterate can be worse than an earlier one). Works for any C and l (C > l too, where
    orthonormal rows do not exist). The result is cached per (C, l, draw, steps): a run builds
    its initial model more than once."""
    seed = int(torch.randint(2**62, (1,), generator=generator))
    return _tammes(num_classes, dim, seed, steps).clone()


@functools.lru_cache(maxsize=4)
def _tammes(num_classes: int, dim: int, seed: int, steps: int) -> torch.Tensor:
    with torch.enable_grad():
        rows = F.normalize(torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(seed)), dim=1)
        rows.requires_grad_(True)
        optimizer = torch.optim.SGD([rows], lr=0.1, momentum=0.9)
        self_similarity = 2 * torch.eye(num_classes)  # pushes the diagonal below every cosine
        best, best_cos = rows.detach().clone(), math.inf
        for _ in range(steps + 1):
            nearest = (rows @ rows.T - self_similarity).max(dim=1).values
            if nearest.max().item() < best_cos:  # the rows as they are now, before this step
                best, best_cos = rows.detach().clone(), nearest.max().item()
            optimizer.zero_grad()
            nearest.mean().backward()
            optimizer.step()
            with torch.no_grad():
                rows.copy_(F.normalize(rows, dim=1))
    return best


_INITS = {"orthogonal": lambda c, d, generator, steps: orthonormal_rows(c, d, generator),
          "tammes": tammes_rows}  # (C, l, generator, steps) → C×l rows


def apply_head(model: FedModel, policy: HeadPolicy, generator: torch.Generator) -> None:
    """Set the classifier as the policy says; a fixed head gets ``requires_grad = False`` so it is
    neither trained nor aggregated."""
    model.normalize_z = policy.normalize_z
    head = model.classifier
    with torch.no_grad():
        if policy.init in _INITS:
            head.weight.copy_(_INITS[policy.init](head.out_features, head.in_features, generator, policy.init_steps))
        if not policy.bias and head.bias is not None:
            head.bias.zero_()
            head.bias.requires_grad_(False)
    if policy.fixed:
        head.weight.requires_grad_(False)
        if head.bias is not None:
            head.bias.requires_grad_(False)
