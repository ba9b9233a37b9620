"""EfficientNet-B0 (Tan & Le, ICML 2019), FLamby's Fed-ISIC2019 baseline, written in plain torch
with the state-dict keys of efficientnet-pytorch's ``efficientnet-b0`` checkpoint.

Native rather than the ``efficientnet-pytorch`` package: no extra dependency, and the model keeps
fedlatent's contract (``encode`` with named taps). Every encoder key equals the published file's
(``_conv_stem``, ``_bn0``, ``_blocks.N._expand_conv`` / ``_bn0`` / ``_depthwise_conv`` / ``_bn1`` /
``_se_reduce`` / ``_se_expand`` / ``_project_conv`` / ``_bn2``, ``_conv_head``, ``_bn1``), so
ImageNet weights load unchanged; the file's ``_fc`` is the head that ``classifier`` replaces.

Padding is TensorFlow's "same" (computed per input size, as the package's dynamic-padding
convolution), the padding the checkpoint was trained with: for stride 2 on an even side it pads one
more pixel at the bottom/right. BatchNorm as the package: momentum 0.01, eps 1e-3; Swish = SiLU.
Not included: the package's dropout (0.2) before ``_fc`` and drop-connect (0.2) of the residual
blocks — random masks from torch's global generator would break the resume-equals-uninterrupted rule.

Taps: ``"pool"`` (N×1280, = z), ``"head"`` (N×1280×H/32×W/32), ``"stage5"`` (N×112×H/16×W/16,
the output of block 10), ``"stage3"`` (N×40×H/8×W/8, block 4).

Parameters: 4,007,548 + 1281·C (4,017,796 for 8 classes).

>>> model = build_efficientnet_b0((3, 200, 200), num_classes=8)
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fedlatent.models.base import FedModel
from fedlatent.models.cnn import check_input_shape
from fedlatent.models.registry import register_model

# (repeats, kernel, stride, expand ratio, in, out) per stage: efficientnet-pytorch's B0 block strings
_STAGES = ((1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
           (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320))
_SE_RATIO = 0.25
_TAP_BLOCKS = {4: "stage3", 10: "stage5"}  # the last block of stages 3 and 5 (0-based block index)


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, momentum=0.01, eps=1e-3)


class SameConv2d(nn.Conv2d):
    """Conv2d with TensorFlow's "same" padding: total padding ``max((⌈n/s⌉-1)s + k - n, 0)`` per
    side length n, the smaller half before (a plain ``nn.Conv2d``'s keys and parameters)."""

    def forward(self, x: Tensor) -> Tensor:
        pads = []
        for n, k, s in zip(reversed(x.shape[-2:]), reversed(self.kernel_size), reversed(self.stride)):
            total = max((math.ceil(n / s) - 1) * s + k - n, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(x, pads) if any(pads) else x)


class MBConvBlock(nn.Module):
    """Inverted residual: [1×1 expand-BN-Swish], k×k depthwise-BN-Swish, squeeze-excitation,
    1×1 project-BN, identity skip when the shape is kept."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = cin * expand
        if expand != 1:
            self._expand_conv = SameConv2d(cin, mid, 1, bias=False)
            self._bn0 = _bn(mid)
        self._depthwise_conv = SameConv2d(mid, mid, kernel, stride=stride, groups=mid, bias=False)
        self._bn1 = _bn(mid)
        squeezed = max(1, int(cin * _SE_RATIO))
        self._se_reduce = SameConv2d(mid, squeezed, 1)
        self._se_expand = SameConv2d(squeezed, mid, 1)
        self._project_conv = SameConv2d(mid, cout, 1, bias=False)
        self._bn2 = _bn(cout)
        self.skip = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        out = F.silu(self._bn0(self._expand_conv(x))) if hasattr(self, "_expand_conv") else x
        out = F.silu(self._bn1(self._depthwise_conv(out)))
        scale = self._se_expand(F.silu(self._se_reduce(F.adaptive_avg_pool2d(out, 1))))
        out = self._bn2(self._project_conv(torch.sigmoid(scale) * out))
        return out + x if self.skip else out


class EfficientNetB0(FedModel):
    """EfficientNet-B0 encoder (1280-d pooled features) + linear classifier (see the module docstring)."""

    tap_names = ("pool", "head", "stage5", "stage3")

    def __init__(self, num_classes: int, in_channels: int = 3) -> None:
        super().__init__(1280, num_classes)
        self._conv_stem = SameConv2d(in_channels, 32, 3, stride=2, bias=False)
        self._bn0 = _bn(32)
        blocks: list[nn.Module] = []
        for repeats, kernel, stride, expand, cin, cout in _STAGES:
            for i in range(repeats):
                blocks.append(MBConvBlock(cin if i == 0 else cout, cout, kernel, stride if i == 0 else 1, expand))
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = SameConv2d(320, 1280, 1, bias=False)
        self._bn1 = _bn(1280)

    def encode(self, x: Tensor, taps: frozenset[str]) -> tuple[Tensor, dict[str, Tensor]]:
        features: dict[str, Tensor] = {}
        x = F.silu(self._bn0(self._conv_stem(x)))
        for i, block in enumerate(self._blocks):
            x = block(x)
            if _TAP_BLOCKS.get(i) in taps:
                features[_TAP_BLOCKS[i]] = x
        x = F.silu(self._bn1(self._conv_head(x)))
        if "head" in taps:
            features["head"] = x
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        if "pool" in taps:
            features["pool"] = x
        return x, features


def build_efficientnet_b0(input_shape: Sequence[int], num_classes: int, *,
                          data_name: str | None = None) -> EfficientNetB0:
    """:class:`EfficientNetB0` for ``input_shape`` = (C, H, W); "same" padding accepts any side ≥ 1."""
    channels, _, _ = check_input_shape(input_shape, arch="efficientnet_b0", min_size=1, data_name=data_name)
    return EfficientNetB0(num_classes, in_channels=channels)


@register_model("efficientnet_b0", head_keys=("_fc.weight", "_fc.bias"))
def _efficientnet_b0(input_shape: Sequence[int], num_classes: int, *, data_name: str) -> EfficientNetB0:
    """EfficientNet-B0 (FLamby's Fed-ISIC2019 baseline; keys of efficientnet-pytorch's checkpoint)."""
    return build_efficientnet_b0(input_shape, num_classes, data_name=data_name)
