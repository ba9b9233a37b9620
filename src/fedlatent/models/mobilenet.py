"""MobileNetV2 for CIFAR, as trained by FedDecorr and MOON, with an optional projector.

Architecture from Sandler et al., "MobileNetV2: Inverted Residuals and Linear Bottlenecks"
(CVPR 2018), in the CIFAR form used by the FedDecorr (Shi et al., ICLR 2023) and MOON (Li et al.,
CVPR 2021) experiments: a 3×3 stride-1 stem conv to 32 channels + BN + ReLU, inverted-residual
blocks with (t, c, n, s) = (1,16,1,1), (6,24,2,1), (6,32,3,2), (6,64,4,2), (6,96,3,1),
(6,160,3,2), (6,320,1,1), a 1×1 conv to 1280 + BN + ReLU and global average pooling; z is the
1280-d pooled vector (or the projector's output when ``projector_width > 0``).

Each block is 1×1 expand conv (t·c_in channels) + BN + ReLU, 3×3 depthwise conv (stride s) + BN +
ReLU, 1×1 linear projection + BN. Plain ReLU everywhere (not ReLU6). Unlike the ImageNet
original, the block adds a residual *whenever its stride is 1*: the identity when the channel
count is unchanged, otherwise a 1×1 conv + BN shortcut; stride-2 blocks have none. As in the
CIFAR code these papers build on, the 1×1 expand conv is kept for t = 1 as well (a c_in→c_in conv).
All convs are bias-free. ``norm = "group"`` puts GroupNorm where BatchNorm is (see :mod:`.norm`).
``projection_relu = True`` adds a ReLU after the projection's norm layer, inside the block before
the residual sum, as SphereFed's architecture table lists every block (Dong et al. 2022, Table 14:
"Conv(…, k=1), NormLayer, ReLU" for the projection); it adds no parameter. ``first_stride = 2``
strides stage2's first block (Table 14's TIN_S on TinyImageNet; that block then has no shortcut),
so that a 64×64 input reaches every later stage at the sides of a 32×32 input with stride 1.
``projector_form = "feddecorr_moon"`` builds the projector as the FedDecorr release's MOON head,
Linear(1280, 640) → ReLU → Linear(640, ``projector_width``) without BatchNorm, instead of the
default FC-BN-ReLU ×2 (:func:`fedlatent.models.base.projector`).

Example:
    >>> model = build((3, 32, 32), num_classes=100)
    >>> model.z_dim
    1280
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fedlatent.models.base import PROJECTOR_FORMS, FedModel, projector
from fedlatent.models.cnn import (
    FIRST_STRIDE,
    check_first_stride,
    check_input_shape,
    check_projector,
    ConvSpec,
    min_spatial_size,
    parse_options,
)
from fedlatent.models.norm import NORM, norm2d
from fedlatent.models.registry import register_model
from fedlatent.registry import Key

__all__ = ["CONFIG", "InvertedResidual", "MobileNetV2", "build"]

CONFIG: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
)
"""(expansion t, output channels c, blocks n, stride of the first block s) per stage."""
STEM_CHANNELS = 32
LAST_CHANNELS = 1280


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
             norm: str = "batch") -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False),
            norm2d(norm, cout)]


class InvertedResidual(nn.Module):
    """Expand (1×1) → depthwise (3×3, stride) → linear project (1×1); residual when stride is 1.

    ``shortcut`` is ``None`` for stride 2, ``nn.Identity`` for stride 1 with equal channels and a
    1×1 conv + BN for stride 1 with a channel change.
    """

    def __init__(self, cin: int, cout: int, expansion: int, stride: int, norm: str = "batch",
                 projection_relu: bool = False) -> None:
        super().__init__()
        hidden = cin * expansion
        self.body = nn.Sequential(
            *_conv_bn(cin, hidden, 1, norm=norm), nn.ReLU(),
            *_conv_bn(hidden, hidden, 3, stride=stride, groups=hidden, norm=norm), nn.ReLU(),
            *_conv_bn(hidden, cout, 1, norm=norm), *([nn.ReLU()] if projection_relu else []),
        )
        self.shortcut: nn.Module | None
        if stride != 1:
            self.shortcut = None
        elif cin == cout:
            self.shortcut = nn.Identity()
        else:
            self.shortcut = nn.Sequential(*_conv_bn(cin, cout, 1, norm=norm))

    def forward(self, x: Tensor) -> Tensor:
        out = self.body(x)
        return out if self.shortcut is None else out + self.shortcut(x)


class MobileNetV2(FedModel):
    """CIFAR MobileNetV2 (see the module docstring).

    Taps (deepest first), for an N×C×H×W input (sides round up at each stride-2 stage):

    - ``"pool"``: N×1280, the encoder output (z when there is no projector);
    - ``"conv_last"``: N×1280×H/8×W/8, after the final 1×1 conv + BN + ReLU;
    - ``"stage7"`` … ``"stage1"``: the output of each (t, c, n, s) group: 320, 160, 96, 64, 32, 24,
      16 channels at sides H/8, H/8, H/4, H/4, H/2, H, H;
    - ``"stem"``: N×32×H×W.
    """

    tap_names = ("pool", "conv_last", "stage7", "stage6", "stage5", "stage4", "stage3", "stage2", "stage1",
                 "stem")

    def __init__(self, num_classes: int, in_channels: int = 3, projector_width: int = 0,
                 projector_layers: int = 2, norm: str = "batch", projection_relu: bool = False,
                 first_stride: int = 1, projector_form: str = "fc_bn_relu") -> None:
        check_projector(projector_width, projector_layers)
        check_first_stride(first_stride)
        head = projector(projector_form, LAST_CHANNELS, projector_width, projector_layers) if projector_width else None
        super().__init__(LAST_CHANNELS, num_classes, projector=head, z_dim=projector_width or None)
        self.stem = nn.Sequential(*_conv_bn(in_channels, STEM_CHANNELS, 3, norm=norm), nn.ReLU())
        stages: list[nn.Sequential] = []
        cin = STEM_CHANNELS
        for i, (t, c, n, s) in enumerate(CONFIG):
            s = first_stride if i == 1 else s  # stage2: SphereFed's TIN_S
            blocks = []
            for stride in [s] + [1] * (n - 1):
                blocks.append(InvertedResidual(cin, c, t, stride, norm, projection_relu))
                cin = c
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.ModuleList(stages)
        self.conv_last = nn.Sequential(*_conv_bn(cin, LAST_CHANNELS, 1, norm=norm), nn.ReLU())

    @classmethod
    def min_input_size(cls) -> int:
        """Smallest input side: every 3×3 conv is padded, so any side ≥ 1 works."""
        path: list[ConvSpec] = [(3, 1, 1)] + [(3, s, 1) for _, _, _, s in CONFIG] + [(1, 1, 0)]
        return min_spatial_size(path)

    def encode(self, x: Tensor, taps: frozenset[str]) -> tuple[Tensor, dict[str, Tensor]]:
        features: dict[str, Tensor] = {}
        x = self.stem(x)
        if "stem" in taps:
            features["stem"] = x
        for i, stage in enumerate(self.stages, start=1):
            x = stage(x)
            if f"stage{i}" in taps:
                features[f"stage{i}"] = x
        x = self.conv_last(x)
        if "conv_last" in taps:
            features["conv_last"] = x
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        if "pool" in taps:
            features["pool"] = x
        return x, features


def build(input_shape: Sequence[int], num_classes: int, *, data_name: str | None = None,
          **options: Any) -> MobileNetV2:
    """Build a :class:`MobileNetV2` for ``input_shape`` = (C, H, W).

    Options: ``projector_width`` (0 = none, default), ``projector_layers`` (default 2), ``norm``,
    ``projection_relu`` (default False), ``first_stride`` (1 | 2, default 1), ``projector_form``
    ("fc_bn_relu" | "feddecorr_moon", default "fc_bn_relu"). ``data_name`` only names the data in
    error messages.
    """
    opts = parse_options(options, {"projector_width": 0, "projector_layers": 2, "norm": "batch",
                                   "projection_relu": False, "first_stride": 1, "projector_form": "fc_bn_relu"},
                         arch="mobilenetv2")
    channels, _, _ = check_input_shape(input_shape, arch="mobilenetv2", min_size=MobileNetV2.min_input_size(),
                                       data_name=data_name)
    return MobileNetV2(num_classes, in_channels=channels, projector_width=opts["projector_width"],
                       projector_layers=opts["projector_layers"], norm=opts["norm"],
                       projection_relu=opts["projection_relu"], first_stride=opts["first_stride"],
                       projector_form=opts["projector_form"])


PROJECTION_RELU = Key(False, "a ReLU after each block's linear projection (SphereFed's Table 14 lists one)")


PROJECTOR_FORM = Key("fc_bn_relu", "the projector (model.projector > 0): 'fc_bn_relu' (FC-BN-ReLU ×2, FedUV's) or "
                     "'feddecorr_moon' (Linear(1280, 640)-ReLU-Linear(640, projector), the FedDecorr release's "
                     "MOON head)", PROJECTOR_FORMS)


@register_model("mobilenetv2", reads=("projector",),
                keys={"norm": NORM, "projection_relu": PROJECTION_RELU, "first_stride": FIRST_STRIDE,
                      "projector_form": PROJECTOR_FORM})
def _mobilenetv2(input_shape: Sequence[int], num_classes: int, *, data_name: str, projector: int,
                 norm: str, projection_relu: bool, first_stride: int, projector_form: str) -> MobileNetV2:
    """CIFAR MobileNetV2 (1280-d; FedDecorr, MOON, SphereFed; model.projector as resnet18, its form
    model.projector_form)."""
    return build(input_shape, num_classes, data_name=data_name, projector_width=projector, norm=norm,
                 projection_relu=projection_relu, first_stride=first_stride, projector_form=projector_form)
