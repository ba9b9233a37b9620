"""SphereFed's seven-layer ConvNet: 32-64-64-64-128-128-256 channels, BatchNorm or GroupNorm.

From Dong et al., "SphereFed: Hyperspherical Federated Learning" (ECCV 2022), appendix Table 11:
seven 3×3 convolutions, each followed by a normalisation layer and ReLU, with strides
1, 2, 2, 1, 2, 1, 2 and no pooling; the flattened output is z, fed to ``FC(1024, classes)``.
The table omits the padding; only padding 1 gives its 1024 = 256 × 2 × 2 inputs on 32×32
images (32 → 32 → 16 → 8 → 8 → 4 → 4 → 2), so every convolution has padding 1. The convolutions
keep their bias (the table says nothing; torch's default). z has 256·⌈H/16⌉·⌈W/16⌉ dimensions.

Example:
    >>> model = build((3, 32, 32), num_classes=100, norm="group")
    >>> model.z_dim
    1024
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fedlatent.models.base import FedModel
from fedlatent.models.cnn import check_input_shape
from fedlatent.models.norm import NORM, norm2d
from fedlatent.models.registry import register_model

__all__ = ["ConvNet7", "LAYERS", "build"]

LAYERS: tuple[tuple[int, int], ...] = ((32, 1), (64, 2), (64, 2), (64, 1), (128, 2), (128, 1), (256, 2))
"""(output channels, stride) of the seven 3×3 convolutions (padding 1)."""


class ConvNet7(FedModel):
    """The SphereFed ConvNet (see the module docstring).

    Taps (deepest first), for an N×C×32×32 input: ``"flat"`` N×1024 (the encoder output, = z);
    ``"conv7"`` … ``"conv1"``: each layer's output after its norm and ReLU, with 256, 128, 128,
    64, 64, 64, 32 channels at sides 2, 4, 4, 8, 8, 16, 32.
    """

    tap_names = ("flat", "conv7", "conv6", "conv5", "conv4", "conv3", "conv2", "conv1")

    def __init__(self, num_classes: int, input_shape: tuple[int, int, int] = (3, 32, 32), norm: str = "batch") -> None:
        channels, height, width = input_shape
        for _, stride in LAYERS:
            height, width = math.ceil(height / stride), math.ceil(width / stride)
        super().__init__(LAYERS[-1][0] * height * width, num_classes)
        layers = []
        cin = channels
        for cout, stride in LAYERS:
            layers.append(nn.Sequential(nn.Conv2d(cin, cout, 3, stride=stride, padding=1), norm2d(norm, cout),
                                        nn.ReLU()))
            cin = cout
        self.layers = nn.ModuleList(layers)

    def encode(self, x: Tensor, taps: frozenset[str]) -> tuple[Tensor, dict[str, Tensor]]:
        features: dict[str, Tensor] = {}
        for i, layer in enumerate(self.layers, start=1):
            x = layer(x)
            if f"conv{i}" in taps:
                features[f"conv{i}"] = x
        x = torch.flatten(x, 1)
        if "flat" in taps:
            features["flat"] = x
        return x, features


def build(input_shape: Sequence[int], num_classes: int, *, data_name: str | None = None,
          norm: str = "batch") -> ConvNet7:
    """A :class:`ConvNet7` for ``input_shape`` = (C, H, W) (any size: every conv is padded)."""
    shape = check_input_shape(input_shape, arch="convnet7", min_size=1, data_name=data_name)
    return ConvNet7(num_classes, shape, norm=norm)


@register_model("convnet7", keys={"norm": NORM})
def _convnet7(input_shape: Sequence[int], num_classes: int, *, data_name: str, norm: str) -> ConvNet7:
    """SphereFed's 7-layer ConvNet 32-64-64-64-128-128-256 (z = the flattened 256×2×2 map on 32×32)."""
    return build(input_shape, num_classes, data_name=data_name, norm=norm)
