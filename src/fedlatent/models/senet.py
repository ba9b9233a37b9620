"""SENet-18 for 32×32 images: pre-activation residual blocks with squeeze-and-excitation.

Squeeze-and-excitation from Hu et al., "Squeeze-and-Excitation Networks" (CVPR 2018), in the
CIFAR SENet-18 of kuangliu/pytorch-cifar ``senet.py`` that SphereFed trains (Dong et al., ECCV
2022, appendix Table 13): a 3×3 stride-1 stem conv + norm + ReLU, then four stages (64, 128, 256,
512 planes; strides 1, 2, 2, 2) of two pre-activation blocks, global average pooling; z is the
512-d pooled vector (or the projector's output). A block is norm-ReLU, 3×3 conv (stride s),
norm-ReLU, 3×3 conv, then SE — global average pool, 1×1 conv to planes/16 with ReLU, 1×1 conv back
with a sigmoid, channel-wise rescaling — and the shortcut is added: the block's input, or a bias-free
1×1 conv (stride s) of its pre-activated input when the stride or width changes. Convolutions are
bias-free except the SE pair. Table 13 draws post-activation blocks (conv-norm-ReLU twice, then SE);
the released form it cites is the pre-activation one used here.

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
from fedlatent.models.cnn import (
    FIRST_STRIDE,
    check_first_stride,
    check_input_shape,
    check_projector,
)
from fedlatent.models.norm import NORM, norm2d
from fedlatent.models.registry import register_model
from fedlatent.models.resnet import staged_encode

__all__ = ["PreActSEBlock", "SENet18", "REDUCTION", "build"]

_PLANES = (64, 128, 256, 512)
_STRIDES = (1, 2, 2, 2)
REDUCTION = 16
"""SE bottleneck: planes → planes / 16 → planes."""


class PreActSEBlock(nn.Module):
    """norm-ReLU → conv3×3 (stride) → norm-ReLU → conv3×3 → SE rescaling → + shortcut."""

    def __init__(self, cin: int, planes: int, stride: int = 1, norm: str = "batch") -> None:
        super().__init__()
        self.bn1 = norm2d(norm, cin)
        self.conv1 = nn.Conv2d(cin, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = norm2d(norm, planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.shortcut: nn.Module | None = (nn.Conv2d(cin, planes, 1, stride=stride, bias=False)
                                           if stride != 1 or cin != planes else None)
        self.se_reduce = nn.Conv2d(planes, planes // REDUCTION, 1)
        self.se_expand = nn.Conv2d(planes // REDUCTION, planes, 1)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(x))
        shortcut = x if self.shortcut is None else self.shortcut(out)
        out = self.conv2(F.relu(self.bn2(self.conv1(out))))
        w = torch.sigmoid(self.se_expand(F.relu(self.se_reduce(F.adaptive_avg_pool2d(out, 1)))))
        return out * w + shortcut


class SENet18(FedModel):
    """SENet-18 (see the module docstring).

    Taps (deepest first), for an N×C×H×W input: ``"pool"`` N×512 (the encoder output);
    ``"layer4"`` N×512×H/8×W/8, ``"layer3"`` N×256×H/4×W/4, ``"layer2"`` N×128×H/2×W/2,
    ``"layer1"`` N×64×H×W; ``"stem"`` N×64×H×W (sides round up at each stride 2).
    """

    tap_names = ("pool", "layer4", "layer3", "layer2", "layer1", "stem")

    def __init__(self, num_classes: int, in_channels: int = 3, norm: str = "batch", projector_width: int = 0,
                 projector_layers: int = 2, first_stride: int = 1) -> None:
        check_projector(projector_width, projector_layers)
        check_first_stride(first_stride)
        projector = mlp_projector(_PLANES[-1], projector_width, projector_layers) if projector_width else None
        super().__init__(_PLANES[-1], num_classes, projector=projector, z_dim=projector_width or None)
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, padding=1, bias=False), norm2d(norm, 64), nn.ReLU())
        stages = []
        cin = 64
        for planes, stride in zip(_PLANES, (first_stride, *_STRIDES[1:])):
            stages.append(nn.Sequential(PreActSEBlock(cin, planes, stride, norm), PreActSEBlock(planes, planes, 1, norm)))
            cin = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages

    def encode(self, x: Tensor, taps: frozenset[str]) -> tuple[Tensor, dict[str, Tensor]]:
        return staged_encode(self, x, taps)


def build(input_shape: Sequence[int], num_classes: int, *, data_name: str | None = None, norm: str = "batch",
          projector_width: int = 0, projector_layers: int = 2, first_stride: int = 1) -> SENet18:
    """A :class:`SENet18` for ``input_shape`` = (C, H, W) (any size: every conv is padded)."""
    channels, _, _ = check_input_shape(input_shape, arch="senet18", min_size=1, data_name=data_name)
    return SENet18(num_classes, channels, norm=norm, projector_width=projector_width,
                   projector_layers=projector_layers, first_stride=first_stride)


@register_model("senet18", reads=("projector",), keys={"norm": NORM, "first_stride": FIRST_STRIDE})
def _senet18(input_shape: Sequence[int], num_classes: int, *, data_name: str, projector: int, norm: str,
             first_stride: int) -> SENet18:
    """SENet-18 for 32×32 (pre-activation SE blocks, reduction 16; 512-d z; SphereFed)."""
    return build(input_shape, num_classes, data_name=data_name, norm=norm, projector_width=projector,
                 first_stride=first_stride)
