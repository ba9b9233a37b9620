"""Fully connected network: flatten → (Linear → ReLU) per hidden width → classifier.

With ``hidden=[20]`` on 60-d inputs this is the Ditto+MMD paper's Synthetic model
(60 → 20 → 10; the MMD constraints act on the 20-d hidden output, which is z).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from fedlatent.errors import ConfigError
from fedlatent.models.base import FedModel, stacked_linear
from fedlatent.models.registry import register_model


class MLP(FedModel):
    """Taps: ``hidden{i}`` for every hidden layer but the last (whose output is z), deepest first."""

    def __init__(self, in_features: int, hidden: list[int], num_classes: int) -> None:
        super().__init__(encoder_dim=hidden[-1], num_classes=num_classes)
        layers: list[nn.Module] = []
        dim = in_features
        for width in hidden:
            layers.append(nn.Sequential(nn.Linear(dim, width), nn.ReLU()))
            dim = width
        self.layers = nn.ModuleList(layers)
        self.tap_names = tuple(f"hidden{i}" for i in range(len(hidden) - 1, 0, -1))

    def encode(self, x: Tensor, taps: frozenset[str]) -> tuple[Tensor, dict[str, Tensor]]:
        h = x.flatten(1)
        features: dict[str, Tensor] = {}
        for i, layer in enumerate(self.layers, start=1):
            h = layer(h)
            if f"hidden{i}" in taps:
                features[f"hidden{i}"] = h
        return h, features

    def stacked_encode(self, params: dict[str, Tensor], x: Tensor,
                       taps: frozenset[str]) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`encode` of C clients' weights on a (clients, batch, …) input, one ``baddbmm`` a layer."""
        h = x.flatten(2)
        features: dict[str, Tensor] = {}
        for i in range(1, len(self.layers) + 1):
            h = torch.relu(stacked_linear(h, params[f"layers.{i - 1}.0.weight"], params[f"layers.{i - 1}.0.bias"]))
            if f"hidden{i}" in taps:
                features[f"hidden{i}"] = h
        return h, features


def build(input_shape: tuple[int, ...], num_classes: int, *, hidden: list[int]) -> MLP:
    if not hidden or any(w < 1 for w in hidden):
        raise ConfigError(f"model.hidden = {hidden!r}: expected a non-empty list of positive widths")
    return MLP(math.prod(input_shape), list(hidden), num_classes)


@register_model("mlp", reads=("hidden",))
def _mlp(input_shape: tuple[int, ...], num_classes: int, *, data_name: str, hidden: list[int]) -> MLP:
    """Fully connected: flatten, Linear+ReLU per model.hidden width (the last is z), classifier."""
    return build(input_shape, num_classes, hidden=list(hidden))
