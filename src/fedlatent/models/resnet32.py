"""ResNet-32 in the CIFAR form of He et al., "Deep Residual Learning for Image Recognition"
(CVPR 2016, Sec. 4.2), which FedDecorr's appendix trains beside ResNet-18.

A 3×3 conv with 16 filters + BN + ReLU, then three stages of n = 5 basic blocks with 16, 32, 64
filters (strides 1, 2, 2; 6n + 2 = 32 weighted layers), global average pooling and the linear
classifier: 0.46 M parameters on CIFAR-10, as the paper's Table 6 says. The shortcuts are the
paper's option A — identity, subsampled and zero-padded in the channels where a stage halves
the size — so they add no parameters. ``norm = "group"`` puts GroupNorm where BatchNorm is.

Example:
    >>> build((3, 32, 32), 10).z_dim
    64
"""
from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn
from torch.nn import functional as F

from fedlatent.models.base import FedModel, mlp_projector
from fedlatent.models.cnn import check_input_shape, check_projector
from fedlatent.models.norm import NORM, norm2d
from fedlatent.models.registry import register_model
from fedlatent.models.resnet import staged_encode

__all__ = ["ResNet32", "build"]

_PLANES = (16, 32, 64)
_STRIDES = (1, 2, 2)
BLOCKS = 5


class PadShortcut(nn.Module):
    """Option A: take every ``stride``-th pixel and pad the new channels with zeros."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride, self.extra = stride, cout - cin

    def forward(self, x: Tensor) -> Tensor:
        x = x[:, :, ::self.stride, ::self.stride]
        return F.pad(x, (0, 0, 0, 0, self.extra // 2, self.extra - self.extra // 2))


class Block(nn.Module):
    """3×3 conv-BN-ReLU, 3×3 conv-BN, add the shortcut, ReLU."""

    def __init__(self, cin: int, cout: int, stride: int, norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm2d(norm, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = norm2d(norm, cout)
        self.shortcut = PadShortcut(cin, cout, stride) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet32(FedModel):
    """CIFAR ResNet-32 (see the module docstring).

    Taps (deepest first) for an N×C×H×W input: ``"pool"`` N×64 (z when there is no projector),
    ``"layer3"`` N×64×H/4×W/4, ``"layer2"`` N×32×H/2×W/2, ``"layer1"`` N×16×H×W, ``"stem"``
    N×16×H×W (a stride-2 stage gives ceil(n/2)).
    """

    tap_names = ("pool", "layer3", "layer2", "layer1", "stem")

    def __init__(self, num_classes: int, in_channels: int = 3, projector_width: int = 0,
                 norm: str = "batch") -> None:
        check_projector(projector_width, 2)
        projector = mlp_projector(_PLANES[-1], projector_width) if projector_width else None
        super().__init__(_PLANES[-1], num_classes, projector=projector, z_dim=projector_width or None)
        self.stem = nn.Sequential(nn.Conv2d(in_channels, _PLANES[0], 3, padding=1, bias=False),
                                  norm2d(norm, _PLANES[0]), nn.ReLU())
        stages, cin = [], _PLANES[0]
        for planes, stride in zip(_PLANES, _STRIDES):
            stages.append(nn.Sequential(*(Block(cin if i == 0 else planes, planes, stride if i == 0 else 1, norm)
                                          for i in range(BLOCKS))))
            cin = planes
        self.layer1, self.layer2, self.layer3 = stages

    def encode(self, x: Tensor, taps: frozenset[str]) -> tuple[Tensor, dict[str, Tensor]]:
        return staged_encode(self, x, taps, stages=("layer1", "layer2", "layer3"))


def build(input_shape: Sequence[int], num_classes: int, *, data_name: str | None = None,
          projector_width: int = 0, norm: str = "batch") -> ResNet32:
    """Build a :class:`ResNet32` for ``input_shape`` = (C, H, W); every conv is padded, so any size works."""
    channels, _, _ = check_input_shape(input_shape, arch="resnet32", min_size=1, data_name=data_name)
    return ResNet32(num_classes, channels, projector_width, norm)


@register_model("resnet32", reads=("projector",), keys={"norm": NORM})
def _resnet32(input_shape: Sequence[int], num_classes: int, *, data_name: str, projector: int,
              norm: str) -> ResNet32:
    """CIFAR ResNet-32 (He et al. 2016; 64-d, 0.46 M parameters; FedDecorr's appendix)."""
    return build(input_shape, num_classes, data_name=data_name, projector_width=projector, norm=norm)
