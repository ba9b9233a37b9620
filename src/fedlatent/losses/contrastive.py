"""Terms that tie a client's model to a reference: MOON's model-contrastive loss, FedProx's
proximal term and FedProto's prototype distance.

* MOON: Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021, Eq. 3.
* FedProx: Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, Eq. 2.
* FedProto: Tan et al., "FedProto: Federated Prototype Learning across Heterogeneous Clients",
  AAAI 2022, Eq. 6 (the regulariser on local representations).

Pure functions of tensors: no configuration, no state. References (global model outputs,
global weights, prototypes) are used as given: callers compute them without gradient, as the
papers do; nothing is detached here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from fedlatent.losses.amp import in_float32

__all__ = ["moon_contrastive", "proximal", "prototype_distance"]


@in_float32
def moon_contrastive(
    z: Tensor,
    z_global: Tensor,
    z_prev: Tensor | Sequence[Tensor] | None,
    tau: float,
) -> Tensor:
    """MOON's model-contrastive loss, averaged over the batch.

    ``l = -log( exp(cos(z, z_glob)/tau) / (exp(cos(z, z_glob)/tau) + sum_prev exp(cos(z, z_prev)/tau)) )``

    computed stably as ``logsumexp([s_glob, s_prev...]) - s_glob`` with ``s = cos/tau``
    (exactly cross-entropy with the global model's representation as the positive, as in the
    release). The caller multiplies by MOON's ``mu``. ``tau = 1`` reproduces the FedDecorr
    release's MOON, which ignores the temperature.

    Args:
        z: the local model's projected representations, ``(N, d)``, or ``(B, N, d)`` for ``B``
            independent batches (the vectorized backend's clients).
        z_global: the global model's, ``z``'s shape (the positive pair).
        z_prev: the previous local model(s)' representations: one tensor of ``z``'s shape, a
            sequence of them (MOON's buffer of past models), or ``None``.
        tau: temperature, ``> 0``.

    Returns:
        A 0-d tensor in ``z``'s dtype (``(B,)`` for batched ``z``).

    Round 0 convention: with no previous model (``z_prev`` is ``None`` or an empty sequence)
    there is no negative pair, the ratio is identically 1 and the term is 0 (returned with a
    zero gradient, still connected to ``z``).

    Example:
        >>> z = torch.randn(4, 8)
        >>> float(moon_contrastive(z, z, None, 0.5))
        0.0
    """
    if not tau > 0:
        raise ValueError(f"tau must be positive, got {tau}")
    if z.dim() not in (2, 3) or z_global.shape != z.shape:
        raise ValueError(f"z and z_global must both be (N, d) or (B, N, d); got {tuple(z.shape)} and "
                         f"{tuple(z_global.shape)}")
    if z_prev is None:
        negatives: list[Tensor] = []
    elif isinstance(z_prev, Tensor):
        negatives = [z_prev]
    else:
        negatives = list(z_prev)
    for prev in negatives:
        if prev.shape != z.shape:
            raise ValueError(f"every z_prev must have z's shape {tuple(z.shape)}, got {tuple(prev.shape)}")
    if not negatives or z.shape[-2] == 0:
        return z.sum((-2, -1)) * 0.0
    scores = [F.cosine_similarity(z, z_global, dim=-1)]
    scores += [F.cosine_similarity(z, prev, dim=-1) for prev in negatives]
    logits = torch.stack(scores, dim=-1) / tau  # (…, N, 1 + number of previous models)
    return (torch.logsumexp(logits, dim=-1) - logits[..., 0]).mean(-1)


def proximal(params: Sequence[Tensor], reference: Sequence[Tensor], mu: float) -> Tensor:
    """FedProx's proximal term ``(mu/2) * sum_w ||w - w_ref||^2``.

    Args:
        params: the local model's trainable tensors.
        reference: the global model's tensors, in the same order and shapes.
        mu: the proximal coefficient.

    Returns:
        A 0-d tensor (the dtype of the first parameter; ``0`` in float32 for empty sequences).

    Note: the FedDecorr release's FedProx compares the local model with itself, so its term is
    always 0; pass the *received global* weights here.

    Example:
        >>> w = [torch.ones(3)]
        >>> float(proximal(w, [torch.zeros(3)], mu=0.5))
        0.75
    """
    params = list(params)
    reference = list(reference)
    if len(params) != len(reference):
        raise ValueError(f"params and reference differ in length: {len(params)} != {len(reference)}")
    if not params:
        return torch.zeros(())
    for w, w_ref in zip(params, reference, strict=True):
        if w.shape != w_ref.shape:
            raise ValueError(f"parameter shapes differ: {tuple(w.shape)} != {tuple(w_ref.shape)}")
    # one fused kernel per step over all tensors instead of a Python loop of small ops
    total = torch.stack(torch._foreach_norm(torch._foreach_sub(params, reference))).square().sum()
    return 0.5 * mu * total


@in_float32
def prototype_distance(
    z: Tensor,
    labels: Tensor,
    prototypes: Tensor,
    present_mask: Tensor,
    *,
    semantics: str = "paper",
) -> Tensor:
    """FedProto's regulariser: squared distance of each representation to its class prototype.

    ``"paper"`` (default): the mean over the samples whose class has a global prototype of
    ``||z_i - proto[y_i]||^2``; samples of classes without a prototype contribute nothing; if no
    sample has a prototype (e.g. round 0) the term is 0.

    ``"official"`` (the FedProto/FedUV releases): ``nn.MSELoss`` between the batch and a copy in
    which rows with a global prototype are replaced by it, i.e. the sum of the same squared
    distances divided by ``N * d`` -- samples without a prototype count in the denominator,
    and the mean is also over the ``d`` feature dimensions.

    Args:
        z: representations, ``(N, d)``.
        labels: integer class labels, ``(N,)``.
        prototypes: global prototypes, ``(C, d)`` (rows of absent classes are ignored).
        present_mask: boolean ``(C,)``, true where a global prototype exists.
        semantics: ``"paper"`` or ``"official"``.

    Returns:
        A 0-d tensor in ``z``'s dtype (always finite).

    Example:
        >>> protos = torch.zeros(3, 2)
        >>> mask = torch.tensor([True, False, True])
        >>> float(prototype_distance(torch.ones(2, 2), torch.tensor([0, 1]), protos, mask))
        2.0
    """
    if semantics not in ("paper", "official"):
        raise ValueError(f"semantics must be 'paper' or 'official', got {semantics!r}")
    if z.dim() != 2 or prototypes.dim() != 2 or prototypes.shape[1] != z.shape[1]:
        raise ValueError(f"z (N, d) and prototypes (C, d) disagree: {tuple(z.shape)}, {tuple(prototypes.shape)}")
    labels = labels.long()
    present = present_mask.to(torch.bool)[labels].to(z.dtype)  # (N,)
    # rows without a prototype are compared with themselves (detached), so they add nothing
    target = torch.where(present.bool().unsqueeze(1), prototypes[labels].to(z.dtype), z.detach())
    squared = (z - target).square().sum(dim=1) * present
    if semantics == "official":
        return squared.sum() / max(z.numel(), 1)
    return squared.sum() / present.sum().clamp_min(1.0)
