"""ResNet-18 and ResNet-50 for small (32×32) images, with an optional projector.

Architecture from He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016), in the
CIFAR form the FedUV, FedDecorr and SphereFed papers train: a 3×3 stride-1 stem conv + BN + ReLU
and no max-pool, then four stages (64, 128, 256, 512 planes; strides 1, 2, 2, 2) of BasicBlocks
[2, 2, 2, 2] (ResNet-18, 512-d) or Bottlenecks [3, 4, 6, 3] (ResNet-50, 2048-d, stride on the 3×3
conv), global average pooling. A shortcut is a 1×1 conv + BN whenever the stride or channel count
changes. FedUV puts a 2-layer FC-BN-ReLU projector (``projector_width`` 256/512/2048) before the
classifier; ``projector_width = 0`` (the default) means none, and z is then the pooled features.
``norm = "group"`` puts GroupNorm where BatchNorm is (SphereFed's ResNet-18; see :mod:`.norm`).
``stem = "imagenet_nopool"`` replaces the 3×3 stride-1 stem with torchvision's ImageNet stem (7×7
stride-2 conv, padding 3, + norm + ReLU) *without* its 3×3 stride-2 max-pool: FedUV's ResNet-18 and
ResNet-50 (Son et al. 2024, Sec. 4.1 'Models': "removing the initial max-pooling layer"), which
downsample 16× (layer4 at 2×2 for a 32×32 input) where the CIFAR form downsamples 8×. The FedUV
release keeps that stem for ResNet-50 and builds its ResNet-18 as the 3×3 stem with a stride-2
layer1 (``stem = "cifar"``, ``first_stride = 2``: also 16×, a different network).
``first_stride = 2`` strides layer1's first block (its shortcut then becomes a 1×1 conv + norm):
SphereFed's TIN_S on TinyImageNet (Dong et al. 2022, Tables 13-15), so that 64×64 inputs reach
layer4 at the 4×4 of a 32×32 input with stride 1.

Example:
    >>> model = build((3, 32, 32), num_classes=10, depth=18, projector_width=256)
    >>> model.z_dim
    256
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fedlatent.errors import ConfigError
from fedlatent.models.base import FedModel, mlp_projector
from fedlatent.models.cnn import (
    FIRST_STRIDE,
    ConvSpec,
    check_first_stride,
    check_input_shape,
    check_projector,
    min_spatial_size,
    parse_options,
)
from fedlatent.models.norm import NORM, norm2d
from fedlatent.models.registry import register_model
from fedlatent.registry import Key

__all__ = ["STEM", "BasicBlock", "Bottleneck", "ResNet", "build", "build_resnet18", "build_resnet50", "make_stem"]

_PLANES = (64, 128, 256, 512)
_STRIDES = (1, 2, 2, 2)
STEMS = ("cifar", "imagenet_nopool")
STEM = Key("cifar", "the stem: 'cifar' (3×3 stride-1 conv, no max-pool: SphereFed, FedDecorr) or "
           "'imagenet_nopool' (torchvision's 7×7 stride-2 conv without its max-pool: FedUV Sec. 4.1)", STEMS)


def staged_encode(model: nn.Module, x: Tensor, taps: frozenset[str], *, stem: Callable[[Tensor], Tensor] | None = None,
                  stages: tuple[str, ...] = ("layer1", "layer2", "layer3", "layer4")) -> tuple[Tensor, dict[str, Tensor]]:
    """stem (``model.stem`` unless given) → ``stages`` → global average pool, returning the requested
    taps by those names (the encoder of every ResNet-shaped model: ResNet-18/32/50, the ImageNet
    ResNet-18, SENet-18)."""
    features: dict[str, Tensor] = {}
    x = (stem or cast(Callable[[Tensor], Tensor], model.stem))(x)
    if "stem" in taps:
        features["stem"] = x
    for name in stages:
        x = getattr(model, name)(x)
        if name in taps:
            features[name] = x
    x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
    if "pool" in taps:
        features["pool"] = x
    return x, features


def _shortcut(cin: int, cout: int, stride: int, norm: str) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), norm2d(norm, cout))


class BasicBlock(nn.Module):
    """3×3 conv-BN-ReLU, 3×3 conv-BN, add the shortcut, ReLU."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1, norm: str = "batch") -> None:
        super().__init__()
        cout = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm2d(norm, planes)
        self.conv2 = nn.Conv2d(planes, cout, 3, padding=1, bias=False)
        self.bn2 = norm2d(norm, cout)
        self.shortcut = _shortcut(cin, cout, stride, norm)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """1×1 conv-BN-ReLU, 3×3 (strided) conv-BN-ReLU, 1×1 conv-BN to 4× planes, add, ReLU."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1, norm: str = "batch") -> None:
        super().__init__()
        cout = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = norm2d(norm, planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = norm2d(norm, planes)
        self.conv3 = nn.Conv2d(planes, cout, 1, bias=False)
        self.bn3 = norm2d(norm, cout)
        self.shortcut = _shortcut(cin, cout, stride, norm)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x))


def make_stem(kind: str, in_channels: int, norm: str) -> nn.Sequential:
    """The stem conv + norm + ReLU: 3×3 stride 1 (``"cifar"``) or 7×7 stride 2, padding 3, no max-pool
    (``"imagenet_nopool"``: He et al.'s ImageNet stem minus the pool, FedUV Sec. 4.1)."""
    if kind not in STEMS:
        raise ConfigError(f"model.stem = {kind!r}: allowed values are {', '.join(STEMS)}")
    kernel, stride, padding = (3, 1, 1) if kind == "cifar" else (7, 2, 3)
    return nn.Sequential(nn.Conv2d(in_channels, 64, kernel, stride=stride, padding=padding, bias=False),
                         norm2d(norm, 64), nn.ReLU())


_DEPTHS: dict[int, tuple[type[BasicBlock] | type[Bottleneck], tuple[int, int, int, int]]] = {
    18: (BasicBlock, (2, 2, 2, 2)),
    50: (Bottleneck, (3, 4, 6, 3)),
}


class ResNet(FedModel):
    """CIFAR-style ResNet (see the module docstring).

    Taps (deepest first), for an N×C×H×W input and e = 1 (ResNet-18) or 4 (ResNet-50):

    - ``"pool"``: N×512e, the encoder output (z when there is no projector);
    - ``"layer4"``: N×512e×H/8×W/8; ``"layer3"``: N×256e×H/4×W/4; ``"layer2"``: N×128e×H/2×W/2;
      ``"layer1"``: N×64e×H×W (the stem keeps the input size); ``"stem"``: N×64×H×W
      (sides round up: a stride-2 stage gives ceil(n/2)); with ``first_stride = 2`` every side
      from layer1 on is halved once more, with ``stem = "imagenet_nopool"`` every side from the stem on.
    """

    tap_names = ("pool", "layer4", "layer3", "layer2", "layer1", "stem")

    def __init__(self, depth: int, num_classes: int, in_channels: int = 3, projector_width: int = 0,
                 projector_layers: int = 2, norm: str = "batch", first_stride: int = 1,
                 stem: str = "cifar") -> None:
        if depth not in _DEPTHS:
            raise ConfigError(f"model.depth = {depth!r} is not one of {', '.join(map(str, _DEPTHS))}")
        check_projector(projector_width, projector_layers)
        check_first_stride(first_stride)
        block, counts = _DEPTHS[depth]
        encoder_dim = 512 * block.expansion
        projector = mlp_projector(encoder_dim, projector_width, projector_layers) if projector_width else None
        super().__init__(encoder_dim, num_classes, projector=projector, z_dim=projector_width or None)
        self.depth = depth
        self.stem = make_stem(stem, in_channels, norm)
        stages: list[nn.Sequential] = []
        cin = 64
        for planes, stride, count in zip(_PLANES, (first_stride, *_STRIDES[1:]), counts):
            blocks: list[nn.Module] = []
            for s in [stride] + [1] * (count - 1):
                blocks.append(block(cin, planes, s, norm))
                cin = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages

    @classmethod
    def min_input_size(cls) -> int:
        """Smallest input side: every conv is padded (3×3, pad 1; the ImageNet stem's 7×7, pad 3), so
        any side ≥ 1 works."""
        path: list[ConvSpec] = [(3, 1, 1)]
        for stride in _STRIDES:
            path += [(1, 1, 0), (3, stride, 1), (3, 1, 1), (1, 1, 0)]  # covers both block kinds
        return min_spatial_size(path)

    def encode(self, x: Tensor, taps: frozenset[str]) -> tuple[Tensor, dict[str, Tensor]]:
        return staged_encode(self, x, taps)


def build(input_shape: Sequence[int], num_classes: int, *, data_name: str | None = None,
          **options: Any) -> ResNet:
    """Build a :class:`ResNet` for ``input_shape`` = (C, H, W).

    Options: ``depth`` (18 | 50, default 18), ``projector_width`` (0 = none, default; FedUV uses
    256/512/2048), ``projector_layers`` (default 2), ``norm`` ("batch" | "group"), ``first_stride``
    (1 | 2, default 1), ``stem`` ("cifar" | "imagenet_nopool", default "cifar"). ``data_name`` only
    names the data in errors.
    """
    opts = parse_options(options, {"depth": 18, "projector_width": 0, "projector_layers": 2, "norm": "batch",
                                   "first_stride": 1, "stem": "cifar"}, arch=f"resnet{options.get('depth', 18)}")
    channels, _, _ = check_input_shape(input_shape, arch=f"resnet{opts['depth']}",
                                       min_size=ResNet.min_input_size(), data_name=data_name)
    return ResNet(opts["depth"], num_classes, in_channels=channels,
                  projector_width=opts["projector_width"], projector_layers=opts["projector_layers"],
                  norm=opts["norm"], first_stride=opts["first_stride"], stem=opts["stem"])


def build_resnet18(input_shape: Sequence[int], num_classes: int, *, data_name: str | None = None,
                   **options: Any) -> ResNet:
    """:func:`build` with ``depth = 18`` (``model.arch = 'resnet18'``)."""
    _no_depth(options, "resnet18")
    return build(input_shape, num_classes, data_name=data_name, depth=18, **options)


def build_resnet50(input_shape: Sequence[int], num_classes: int, *, data_name: str | None = None,
                   **options: Any) -> ResNet:
    """:func:`build` with ``depth = 50`` (``model.arch = 'resnet50'``)."""
    _no_depth(options, "resnet50")
    return build(input_shape, num_classes, data_name=data_name, depth=50, **options)


def _no_depth(options: dict[str, Any], arch: str) -> None:
    if "depth" in options:
        raise ConfigError(f"model.depth is not an option of model.arch = '{arch}' "
                          "(options: projector_width, projector_layers, norm, first_stride, stem)")


@register_model("resnet18", reads=("projector",), keys={"norm": NORM, "first_stride": FIRST_STRIDE, "stem": STEM})
def _resnet18(input_shape: Sequence[int], num_classes: int, *, data_name: str, projector: int,
              norm: str, first_stride: int, stem: str) -> ResNet:
    """CIFAR ResNet-18 (512-d; model.projector: FC-BN-ReLU ×2 before the classifier; model.stem)."""
    return build_resnet18(input_shape, num_classes, data_name=data_name, projector_width=projector, norm=norm,
                          first_stride=first_stride, stem=stem)


@register_model("resnet50", reads=("projector",), keys={"norm": NORM, "stem": STEM})
def _resnet50(input_shape: Sequence[int], num_classes: int, *, data_name: str, projector: int,
              norm: str, stem: str) -> ResNet:
    """CIFAR ResNet-50 (2048-d; model.projector and model.stem as resnet18)."""
    return build_resnet50(input_shape, num_classes, data_name=data_name, projector_width=projector, norm=norm,
                          stem=stem)
