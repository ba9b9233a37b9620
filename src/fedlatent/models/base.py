"""The contract every fedlatent model keeps: logits, the representation z, named features on demand.

A model is an encoder (``encode``), an optional projector and a linear classifier. Methods read
``z`` (the classifier's input) and, only when they ask for them by name, intermediate features
(``taps``), so FedUV/FedDecorr cost no extra forward pass and MMD constraints can reach deeper
layers. Models know nothing of federation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

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
        z = self.projector(h)
        if self.normalize_z:
            z = unit_rows(z)
        logits = self.classifier(z)
        if self.softmax_output:  # the Ditto+MMD release's quirk: softmax output fed to cross-entropy
            logits = torch.softmax(logits, dim=1)
        return ModelOutput(logits=logits, z=z, features=features)


def mlp_projector(in_dim: int, width: int, layers: int = 2) -> nn.Sequential:
    """The papers' projector: (Linear → BatchNorm1d → ReLU) × ``layers``."""
    blocks: list[nn.Module] = []
    dim = in_dim
    for _ in range(layers):
        blocks += [nn.Linear(dim, width), nn.BatchNorm1d(width), nn.ReLU(inplace=True)]
        dim = width
    return nn.Sequential(*blocks)
