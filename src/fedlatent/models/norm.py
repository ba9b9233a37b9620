"""The ``model.norm`` key: BatchNorm or GroupNorm after each convolution.

SphereFed (Dong et al., ECCV 2022, appendix F.1) trains ResNet-18, VGG-13, SENet-18 and its
ConvNet with GroupNorm "following prior arts" and MobileNetV2 on CIFAR-100 with BatchNorm.
GroupNorm uses :data:`GROUPS` = 2 groups, the choice of those prior arts: Hsieh et al., "The
Non-IID Data Quagmire of Decentralized Machine Learning" (ICML 2020) and Reddi et al., "Adaptive
Federated Optimization" (ICLR 2021), whose CIFAR ResNet-18 has GroupNorm with two groups.
GroupNorm keeps no running statistics, so a federated model carries no BatchNorm buffers.
"""
from __future__ import annotations

from torch import nn

from fedlatent.registry import Key

GROUPS = 2
NORM = Key("batch", "normalisation after each convolution: 'batch' (BatchNorm) or 'group' "
           f"(GroupNorm, {GROUPS} groups)", ("batch", "group"))


def norm2d(kind: str, channels: int) -> nn.Module:
    """``nn.BatchNorm2d(channels)`` for ``"batch"``, ``nn.GroupNorm(GROUPS, channels)`` for ``"group"``."""
    if kind == "group":
        return nn.GroupNorm(GROUPS, channels)
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    raise ValueError(f"model.norm = {kind!r}: allowed values are {', '.join(NORM.choices)}")
