"""The contract every fedlatent model keeps: logits, the representation z, named features on demand.

A model is an encoder (``encode``), an optional projector and a linear classifier. Methods read
``z`` (the classifier's input) and, only when they ask for them by name, intermediate features
(``taps``), so FedUV/FedDecorr cost no extra forward pass and MMD constraints can reach deeper
layers. Models know nothing of federation.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from fedlatent.errors import ConfigError
from fedlatent.models.sphere import unit_rows


@dataclass
class ModelOutput:
    """What one forward pass yields: ``logits`` (N×C), ``z`` (N×d, the classifier input) and the
    intermediate ``features`` that were asked for by name."""

    logits: Tensor
    z: Tensor
    features: dict[str, Tensor] = field(default_factory=dict)


class FedModel(nn.Module):
    """Base class: subclasses build the encoder and implement :meth:`encode`.

    ``tap_names`` lists the named intermediate features a subclass can return, ordered from the
    deepest (closest to the classifier) to the shallowest; ``"z"`` is always available.
    """

    tap_names: tuple[str, ...] = ()

    def __init__(self, encoder_dim: int, num_classes: int, projector: nn.Module | None = None,
                 z_dim: int | None = None) -> None:
        super().__init__()
        self.projector = projector if projector is not None else nn.Identity()
        self.z_dim = z_dim if z_dim is not None else encoder_dim
        self.num_classes = num_classes
        self.classifier = nn.Linear(self.z_dim, num_classes)
        self.normalize_z = False
        self.softmax_output = False

    def encode(self, x: Tensor, taps: frozenset[str]) -> tuple[Tensor, dict[str, Tensor]]:
        """Return the encoder output (before the projector) and the requested taps."""
        raise NotImplementedError

    def forward(self, x: Tensor, taps: frozenset[str] | tuple[str, ...] = frozenset()) -> ModelOutput:
        h, features = self.encode(x, frozenset(taps))
        return self._head(self.projector(h), features, self.classifier)

    def _head(self, z: Tensor, features: dict[str, Tensor], classify: Callable[[Tensor], Tensor]) -> ModelOutput:
        """The output of features ``z`` (one model's, or stacked clients'): normalised when the
        method asks, classified by ``classify``, softmaxed for the Ditto+MMD release's quirk (its
        softmax output fed to cross-entropy)."""
        if self.normalize_z:
            z = unit_rows(z)
        logits = classify(z)
        if self.softmax_output:
            logits = torch.softmax(logits, dim=-1)
        return ModelOutput(logits=logits, z=z, features=features)

    def stacked_encode(self, params: dict[str, Tensor], x: Tensor,
                       taps: frozenset[str]) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`encode` of C models at once: ``params`` is this model's state with a leading
        client axis, ``x`` a (clients, batch, …) input, and client c's rows are computed with its
        weights. Optional: a subclass built of layers with a batched form (Linear: ``bmm``)
        implements it, and the lockstep trainer then runs :meth:`stacked_forward` instead of
        ``forward`` under ``vmap`` (whose dispatch costs more than the small layers themselves)."""
        raise NotImplementedError

    @property
    def has_stacked_forward(self) -> bool:
        """Whether :meth:`stacked_forward` computes what ``forward`` under ``vmap`` does: the subclass
        has a :meth:`stacked_encode`, the projector is the identity and nothing draws random
        numbers (dropout: vmap's per-client masks are its own draws)."""
        return (type(self).stacked_encode is not FedModel.stacked_encode and isinstance(self.projector, nn.Identity)
                and not has_dropout(self))

    def stacked_forward(self, params: dict[str, Tensor], x: Tensor, taps: frozenset[str] = frozenset()) -> ModelOutput:
        """:meth:`forward` of C models at once (see :meth:`stacked_encode`): outputs with a leading
        client axis, (clients, batch, …)."""
        z, features = self.stacked_encode(params, x, taps)
        return self._head(z, features, lambda z: stacked_linear(z, params["classifier.weight"],
                                                                params.get("classifier.bias")))


def has_dropout(model: nn.Module) -> bool:
    """Whether ``model`` holds a dropout layer (which draws random numbers in training mode)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())


def mixes_batch_rows(model: nn.Module) -> bool:
    """Whether ``model`` in training mode computes a row's output from other rows of its batch
    (BatchNorm's batch statistics), so that padding a batch would change the real rows' outputs."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def stacked_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear`` of C clients at once: x (C, B, in), weight (C, out, in), bias (C, out) or None;
    the output (C, B, out) is a view of feature-major (C, out, B) values, computed as W·xᵀ.

    Feature-major because the backward's products then have the shapes the CPU's batched matrix
    products run fast: a narrow layer's weight gradient as (out × B)·(B × in), ~3× faster than
    (in × B)·(B × out), and a step of the digits MLP (64-128-10, 10 clients × 32 samples) takes
    ~30 % less time than with x·Wᵀ. A stack of such layers keeps the layout (the next layer's
    xᵀ is contiguous), and the stacked cross-entropy reads the logits' classes along the middle
    axis (:func:`~fedlatent.methods.parts.task_loss`), where the feature-major logits lie contiguous."""
    xt = x.transpose(1, 2)
    out = torch.bmm(weight, xt) if bias is None else torch.baddbmm(bias.unsqueeze(2), weight, xt)
    return out.transpose(1, 2)


PROJECTOR_FORMS = ("fc_bn_relu", "feddecorr_moon")


def projector(form: str, in_dim: int, width: int, layers: int = 2) -> nn.Sequential:
    """The projector before the classifier, by ``form``: ``"fc_bn_relu"``, :func:`mlp_projector`
    (FedUV Sec. 4.1, MOON's paper); ``"feddecorr_moon"``, :func:`halving_projector` (the FedDecorr
    release's MOON head)."""
    if form == "fc_bn_relu":
        return mlp_projector(in_dim, width, layers)
    if form == "feddecorr_moon":
        if layers != 2:
            raise ConfigError(f"model.projector_form = 'feddecorr_moon' has 2 layers, not projector_layers = {layers}")
        return halving_projector(in_dim, width)
    raise ConfigError(f"model.projector_form = {form!r}: allowed values are {', '.join(PROJECTOR_FORMS)}")


def halving_projector(in_dim: int, width: int) -> nn.Sequential:
    """Linear(d, d/2) → ReLU → Linear(d/2, ``width``), no BatchNorm and no ReLU on the output: the MOON
    projection head of the FedDecorr release (approach/moon.py, ``ContrastiveModelWrapper`` with
    ``--use_proj_head``: ``l1 = Linear(d, d // 2)``, ``l2 = Linear(d // 2, proj_dim = 256)``), which
    produced FedDecorr Tables 1-2's MOON rows; 1280 → 640 → 256 on MobileNetV2."""
    return nn.Sequential(nn.Linear(in_dim, in_dim // 2), nn.ReLU(inplace=True), nn.Linear(in_dim // 2, width))


def mlp_projector(in_dim: int, width: int, layers: int = 2) -> nn.Sequential:
    """The papers' projector: (Linear → BatchNorm1d → ReLU) × ``layers``."""
    blocks: list[nn.Module] = []
    dim = in_dim
    for _ in range(layers):
        blocks += [nn.Linear(dim, width), nn.BatchNorm1d(width), nn.ReLU(inplace=True)]
        dim = width
    return nn.Sequential(*blocks)
