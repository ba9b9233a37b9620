"""Head policy applied to a freshly built model: fixed or learned, orthonormal init, normalised z."""
from __future__ import annotations

import torch

from fedlatent.errors import ConfigError
from fedlatent.methods.parts import HeadPolicy
from fedlatent.models.base import FedModel


def orthonormal_rows(num_classes: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """C×l matrix with orthonormal rows: Q of the QR decomposition of an l×C Gaussian, transposed
    (SphereFed, Dong et al. 2022, Sec. 3.1). Needs C ≤ l."""
    if num_classes > dim:
        raise ConfigError(f"algorithm.head_init = 'orthogonal': {num_classes} classes need a representation "
                          f"of at least {num_classes} dimensions, the model's z has {dim}")
    q, r = torch.linalg.qr(torch.randn(dim, num_classes, generator=generator, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))  # a unique Q for the Gaussian draw
    return q.T.contiguous().float()


def apply_head(model: FedModel, policy: HeadPolicy, generator: torch.Generator) -> None:
    """Set the classifier as the policy says; a fixed head gets ``requires_grad = False`` so it is
    neither trained nor aggregated."""
    model.normalize_z = policy.normalize_z
    head = model.classifier
    with torch.no_grad():
        if policy.init == "orthogonal":
            head.weight.copy_(orthonormal_rows(head.out_features, head.in_features, generator))
        if not policy.bias and head.bias is not None:
            head.bias.zero_()
            head.bias.requires_grad_(False)
    if policy.fixed:
        head.weight.requires_grad_(False)
        if head.bias is not None:
            head.bias.requires_grad_(False)
