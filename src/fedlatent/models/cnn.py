"""The FedUV small CNN, plus the input-shape and option checks the image models share.

Architecture from FedUV (Son et al., "FedUV: Uniformity and Variance for Heterogeneous Federated
Learning", CVPR 2024), appendix table and released code: eight convolutions without padding and
without bias, each followed by BatchNorm and ReLU, a global average pool and two FC-BN-ReLU layers
whose 256-d output is the representation z fed to the linear classifier::

    3→16 k3 · 16→16 k1 · 16→32 k3 s2 · 32→32 k3 · 32→32 k1 · 32→64 k3 s2 · 64→64 k3 · 64→64 k1
    · global avg pool · FC 64→256 BN ReLU · FC 256→256 BN ReLU (= z) · FC 256→C

The released code uses channel widths 16/32/64 (``width="release"``, the default); the paper's
appendix table lists 64/128/256 (``width="paper"``). The FC layers keep their bias (only the convs
are bias-free) and are 256 wide in both variants.

Example:
    >>> model = build((3, 32, 32), num_classes=10)
    >>> out = model(torch.randn(4, 3, 32, 32), taps=("fc1",))
    >>> out.logits.shape, out.z.shape, out.features["fc1"].shape
    (torch.Size([4, 10]), torch.Size([4, 256]), torch.Size([4, 256]))
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fedlatent.errors import ConfigError
from fedlatent.models.base import FedModel
from fedlatent.models.registry import register_model
from fedlatent.registry import Key

__all__ = ["FIRST_STRIDE", "SmallCNN", "WIDTHS", "build", "check_first_stride", "check_input_shape",
           "check_projector", "min_spatial_size", "parse_options"]

ConvSpec = tuple[int, int, int]
"""(kernel, stride, padding) of one convolution along the network's path."""

WIDTHS: dict[str, tuple[int, int, int]] = {"release": (16, 32, 64), "paper": (64, 128, 256)}

# (in stage, out stage, kernel, stride) of the eight convs; stages index the width triple, -1 = input.
_CONVS: tuple[tuple[int, int, int, int], ...] = (
    (-1, 0, 3, 1), (0, 0, 1, 1), (0, 1, 3, 2), (1, 1, 3, 1),
    (1, 1, 1, 1), (1, 2, 3, 2), (2, 2, 3, 1), (2, 2, 1, 1),
)
FC_DIM = 256


def min_spatial_size(path: Sequence[ConvSpec]) -> int:
    """Smallest side length for which every convolution in ``path`` still outputs ≥ 1 pixel.

    A convolution gives ``floor((n + 2p - k) / s) + 1`` pixels, which is at least ``m`` exactly
    when ``n ≥ (m - 1)·s + k - 2p``; walking the path backwards from ``m = 1`` gives the minimum.
    """
    size = 1
    for kernel, stride, padding in reversed(path):
        size = max(1, (size - 1) * stride + kernel - 2 * padding)
    return size


def check_input_shape(input_shape: Sequence[int], *, arch: str, min_size: int,
                      data_name: str | None = None) -> tuple[int, int, int]:
    """Return ``(C, H, W)`` or raise :class:`ConfigError` naming ``model.arch`` and the data."""
    data = f"data '{data_name}'" if data_name else "the data"
    shape = tuple(input_shape)
    if len(shape) != 3 or not all(isinstance(n, int) and n > 0 for n in shape):
        raise ConfigError(f"model.arch = '{arch}' needs image inputs shaped (channels, height, width); "
                          f"{data} gives shape {shape} (use model.arch = 'mlp')")
    channels, height, width = shape
    if height < min_size or width < min_size:
        raise ConfigError(f"model.arch = '{arch}' needs inputs of at least {min_size}×{min_size} pixels; "
                          f"{data} gives {height}×{width} (use model.arch = 'mlp' or 'resnet18')")
    return channels, height, width


FIRST_STRIDE = Key(1, "stride of the first block of the first stage that keeps the stem's size (ResNet-18, "
                   "SENet-18: layer1; MobileNetV2: stage2): 2 is SphereFed's TIN_S for 64×64 TinyImageNet "
                   "inputs (architecture Tables 13-15)", (1, 2))


def check_first_stride(stride: int) -> None:
    if stride not in FIRST_STRIDE.choices:
        raise ConfigError(f"model.first_stride = {stride!r}: allowed values are 1, 2")


def parse_options(options: Mapping[str, Any], defaults: Mapping[str, Any], *, arch: str) -> dict[str, Any]:
    """Fill ``defaults`` from ``options``; an unknown key raises :class:`ConfigError`."""
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        allowed = ", ".join(defaults) or "none"
        raise ConfigError(f"model.{unknown[0]} is not an option of model.arch = '{arch}' (options: {allowed})")
    return {**defaults, **options}


def check_projector(width: Any, layers: Any) -> None:
    """Validate the ``projector_width`` (0 = none) and ``projector_layers`` model options."""
    if not isinstance(width, int) or isinstance(width, bool) or width < 0:
        raise ConfigError(f"model.projector_width = {width!r} must be an integer ≥ 0 (0 = no projector)")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise ConfigError(f"model.projector_layers = {layers!r} must be an integer ≥ 1")


def _conv_bn_relu(cin: int, cout: int, kernel: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride=stride, padding=0, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


def _fc_bn_relu(din: int, dout: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(din, dout), nn.BatchNorm1d(dout), nn.ReLU())


class SmallCNN(FedModel):
    """FedUV's small CNN (see the module docstring); z is the 256-d output of ``fc2``.

    Taps (deepest first), for an N×C×H×W input and channel widths (w1, w2, w3):

    - ``"fc2"``: N×256, the encoder output (equal to z: this model has no projector);
    - ``"fc1"``: N×256, after the first FC-BN-ReLU;
    - ``"pool"``: N×w3, the globally average-pooled conv features;
    - ``"conv8"`` … ``"conv1"``: N×c×h×w after each conv's BN+ReLU (conv1–2: w1, conv3–5: w2,
      conv6–8: w3 channels); for a 32×32 input the sides are 30, 30, 14, 12, 12, 5, 3, 3.
    """

    tap_names = ("fc2", "fc1", "pool", "conv8", "conv7", "conv6", "conv5", "conv4", "conv3", "conv2", "conv1")

    def __init__(self, num_classes: int, in_channels: int = 3, width: str = "release") -> None:
        if width not in WIDTHS:
            raise ConfigError(f"model.width = {width!r} is not one of {', '.join(map(repr, WIDTHS))}")
        super().__init__(encoder_dim=FC_DIM, num_classes=num_classes)
        widths = WIDTHS[width]
        self.width = width
        self.convs = nn.ModuleList(
            _conv_bn_relu(in_channels if cin < 0 else widths[cin], widths[cout], kernel, stride)
            for cin, cout, kernel, stride in _CONVS
        )
        self.fc1 = _fc_bn_relu(widths[-1], FC_DIM)
        self.fc2 = _fc_bn_relu(FC_DIM, FC_DIM)

    @classmethod
    def min_input_size(cls) -> int:
        """Smallest input side the unpadded convs accept (21: 21→19→19→9→7→7→3→1→1)."""
        return min_spatial_size([(kernel, stride, 0) for _, _, kernel, stride in _CONVS])

    def encode(self, x: Tensor, taps: frozenset[str]) -> tuple[Tensor, dict[str, Tensor]]:
        features: dict[str, Tensor] = {}
        for i, conv in enumerate(self.convs, start=1):
            x = conv(x)
            if f"conv{i}" in taps:
                features[f"conv{i}"] = x
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        if "pool" in taps:
            features["pool"] = x
        x = self.fc1(x)
        if "fc1" in taps:
            features["fc1"] = x
        x = self.fc2(x)
        if "fc2" in taps:
            features["fc2"] = x
        return x, features


def build(input_shape: Sequence[int], num_classes: int, *, data_name: str | None = None,
          **options: Any) -> SmallCNN:
    """Build a :class:`SmallCNN` for ``input_shape`` = (C, H, W). Options: ``width`` ("release" | "paper").

    ``data_name`` only names the data set in error messages.
    """
    opts = parse_options(options, {"width": "release"}, arch="cnn")
    channels, _, _ = check_input_shape(input_shape, arch="cnn", min_size=SmallCNN.min_input_size(),
                                       data_name=data_name)
    return SmallCNN(num_classes, in_channels=channels, width=opts["width"])


@register_model("cnn", reads=("width",))
def _cnn(input_shape: Sequence[int], num_classes: int, *, data_name: str, width: str) -> SmallCNN:
    """FedUV's small CNN (z = its 256-d fc2 output; model.width release 16/32/64 or paper 64/128/256)."""
    return build(input_shape, num_classes, data_name=data_name, width=width)
