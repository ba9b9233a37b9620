"""VGG-13 for 32×32 images (SphereFed), with BatchNorm or GroupNorm and an optional projector.

Architecture from Simonyan & Zisserman, "Very Deep Convolutional Networks for Large-Scale Image
Recognition" (ICLR 2015), configuration B, in the CIFAR form SphereFed (Dong et al., ECCV 2022,
appendix Table 12) takes from kuangliu/pytorch-cifar ``vgg.py``: ten 3×3 convolutions (padding 1,
with bias), each followed by a normalisation layer and ReLU, in five groups of two
(64, 128, 256, 512, 512 channels), each group closed by a 2×2 max-pool; z is the flattened
512-d output (32 → 1 pixel after five pools). Table 12 lists the fifth pool as
``MaxPool2d(TIN_S)`` with TIN_S = 1 on CIFAR-100, which would leave a 2×2 map against its own
``FC(512, …)``; the kuangliu form (a 2×2 pool) is used, and whatever map remains on larger inputs
(Tiny-ImageNet: 2×2, the table's TIN_S = 2 pool) is max-pooled to 1×1.

Example:
    >>> model = build((3, 32, 32), num_classes=100, norm="group")
    >>> model.z_dim
    512
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fedlatent.models.base import FedModel, mlp_projector
from fedlatent.models.cnn import check_input_shape, check_projector
from fedlatent.models.norm import NORM, norm2d
from fedlatent.models.registry import register_model

__all__ = ["VGG13", "GROUPS", "build"]

GROUPS: tuple[int, ...] = (64, 128, 256, 512, 512)
"""Output channels of the five groups of two 3×3 convolutions."""


class VGG13(FedModel):
    """VGG-13 (see the module docstring).

    Taps (deepest first), for an N×C×32×32 input: ``"pool"`` N×512 (the encoder output);
    ``"block5"`` … ``"block1"``: each group's output after its max-pool, 512×1×1, 512×2×2,
    256×4×4, 128×8×8, 64×16×16 (sides halve from the input's, rounding down).
    """

    tap_names = ("pool", "block5", "block4", "block3", "block2", "block1")

    def __init__(self, num_classes: int, in_channels: int = 3, norm: str = "batch",
                 projector_width: int = 0, projector_layers: int = 2) -> None:
        check_projector(projector_width, projector_layers)
        projector = mlp_projector(GROUPS[-1], projector_width, projector_layers) if projector_width else None
        super().__init__(GROUPS[-1], num_classes, projector=projector, z_dim=projector_width or None)
        blocks = []
        cin = in_channels
        for cout in GROUPS:
            blocks.append(nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1), norm2d(norm, cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, padding=1), norm2d(norm, cout), nn.ReLU(),
                nn.MaxPool2d(2)))
            cin = cout
        self.blocks = nn.ModuleList(blocks)

    def encode(self, x: Tensor, taps: frozenset[str]) -> tuple[Tensor, dict[str, Tensor]]:
        features: dict[str, Tensor] = {}
        for i, block in enumerate(self.blocks, start=1):
            x = block(x)
            if f"block{i}" in taps:
                features[f"block{i}"] = x
        x = torch.flatten(F.adaptive_max_pool2d(x, 1), 1)
        if "pool" in taps:
            features["pool"] = x
        return x, features


def build(input_shape: Sequence[int], num_classes: int, *, data_name: str | None = None, norm: str = "batch",
          projector_width: int = 0, projector_layers: int = 2) -> VGG13:
    """A :class:`VGG13` for ``input_shape`` = (C, H, W) with H, W ≥ 32 (five 2×2 pools)."""
    channels, _, _ = check_input_shape(input_shape, arch="vgg13", min_size=32, data_name=data_name)
    return VGG13(num_classes, channels, norm=norm, projector_width=projector_width,
                 projector_layers=projector_layers)


@register_model("vgg13", reads=("projector",), keys={"norm": NORM})
def _vgg13(input_shape: Sequence[int], num_classes: int, *, data_name: str, projector: int, norm: str) -> VGG13:
    """VGG-13 for 32×32 (SphereFed; 512-d z; inputs of at least 32×32)."""
    return build(input_shape, num_classes, data_name=data_name, norm=norm, projector_width=projector)
