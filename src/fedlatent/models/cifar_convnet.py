"""The CIFAR-10 ConvNet of the Ditto + MMD paper (two conv-BN-pool stages, two FC layers).

Paper (Adaptive Latent-Space Constraints in Personalized FL, section 4): "a CNN with two
convolutional layers, each of which are followed by batch normalization (BN) and max pooling. The
final two stages are fully connected (FC) layers"; the MMD constraint depths are the first FC
layer's output (1), then the second BN's (2), then the first BN's (3). The sizes are the authors'
release (FL4Health ``research/cifar10/model.py``, ``ConvNet(in_channels=3)``, from pFL-Bench)::

    conv 5×5 3→32 (pad 2) · BN · ReLU · max-pool 2 · conv 5×5 32→64 (pad 2) · BN · ReLU · max-pool 2
    · flatten (64·H/4·W/4 = 4096 on 32×32) · FC → 2048 · ReLU (= z) · FC 2048 → classes

All layers keep their bias. The release reads the features with forward hooks on ``bn1``, ``bn2``
and ``fc1``; its ReLUs act in place, so the hooked tensors hold the values *after* the ReLU, and
so do the taps here (before the max-pool).

Example:
    >>> model = build((3, 32, 32), num_classes=10)
    >>> model.z_dim
    2048
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fedlatent.models.base import FedModel
from fedlatent.models.cnn import check_input_shape
from fedlatent.models.registry import register_model

__all__ = ["CifarConvNet", "HIDDEN", "build"]

HIDDEN = 2048


class CifarConvNet(FedModel):
    """The Ditto + MMD CIFAR-10 ConvNet (see the module docstring).

    Taps (deepest first, the paper's constraint depths 1, 2, 3), for an N×C×H×W input:
    ``"fc1"`` N×2048 (= z), ``"bn2"`` N×64×H/2×W/2, ``"bn1"`` N×32×H×W (after ReLU, before pooling).
    """

    tap_names = ("fc1", "bn2", "bn1")

    def __init__(self, num_classes: int, input_shape: tuple[int, int, int] = (3, 32, 32)) -> None:
        channels, height, width = input_shape
        super().__init__(HIDDEN, num_classes)
        self.conv1 = nn.Conv2d(channels, 32, 5, padding=2)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * (height // 4) * (width // 4), HIDDEN)

    def encode(self, x: Tensor, taps: frozenset[str]) -> tuple[Tensor, dict[str, Tensor]]:
        features: dict[str, Tensor] = {}
        x = F.relu(self.bn1(self.conv1(x)))
        if "bn1" in taps:
            features["bn1"] = x
        x = F.relu(self.bn2(self.conv2(F.max_pool2d(x, 2))))
        if "bn2" in taps:
            features["bn2"] = x
        x = F.relu(self.fc1(torch.flatten(F.max_pool2d(x, 2), 1)))
        if "fc1" in taps:
            features["fc1"] = x
        return x, features


def build(input_shape: Sequence[int], num_classes: int, *, data_name: str | None = None) -> CifarConvNet:
    """A :class:`CifarConvNet` for ``input_shape`` = (C, H, W) with H, W ≥ 4 (two 2×2 pools)."""
    shape = check_input_shape(input_shape, arch="cifar_convnet", min_size=4, data_name=data_name)
    return CifarConvNet(num_classes, shape)


@register_model("cifar_convnet")
def _cifar_convnet(input_shape: Sequence[int], num_classes: int, *, data_name: str) -> CifarConvNet:
    """Ditto+MMD's CIFAR-10 CNN: 2 × (conv5×5-BN-ReLU-pool), FC 2048 (= z; taps fc1, bn2, bn1)."""
    return build(input_shape, num_classes, data_name=data_name)
