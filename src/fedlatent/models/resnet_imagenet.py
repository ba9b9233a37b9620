"""ResNet-18 in torchvision's ImageNet form (He et al., CVPR 2016): a 7×7 stride-2 stem conv + BN +
ReLU + 3×3 stride-2 max-pool, four stages of two BasicBlocks (64, 128, 256, 512 planes; strides 1,
2, 2, 2), global average pooling — the network the Ditto + MMD paper trains on RxRx1.

State-dict keys are torchvision's (``conv1``, ``bn1``, ``layer1.0.conv1`` …, ``layerN.0.downsample.0/1``),
so its ImageNet checkpoint loads unchanged; the file's ``fc`` is the head that ``classifier``
replaces. Parameters: 11,176,512 + 513·C (11,202,162 for 50 classes).

Taps: ``"pool"`` (N×512, = z), ``"layer4"`` … ``"layer1"``, ``"stem"`` (after the max-pool, N×64×H/4×W/4).

>>> model = build_resnet18_imagenet((3, 64, 64), num_classes=50)
"""
from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn
from torch.nn import functional as F

from fedlatent.models.base import FedModel
from fedlatent.models.cnn import check_input_shape
from fedlatent.models.registry import register_model
from fedlatent.models.resnet import staged_encode


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: 3×3 conv-BN-ReLU, 3×3 conv-BN, + (downsampled) input, ReLU."""

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes))
                           if stride != 1 or cin != planes else None)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet18ImageNet(FedModel):
    """ResNet-18, torchvision form (see the module docstring)."""

    tap_names = ("pool", "layer4", "layer3", "layer2", "layer1", "stem")

    def __init__(self, num_classes: int, in_channels: int = 3) -> None:
        super().__init__(512, num_classes)
        self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        cin = 64
        for index, (planes, stride) in enumerate(zip((64, 128, 256, 512), (1, 2, 2, 2)), start=1):
            setattr(self, f"layer{index}", nn.Sequential(BasicBlock(cin, planes, stride), BasicBlock(planes, planes, 1)))
            cin = planes

    def encode(self, x: Tensor, taps: frozenset[str]) -> tuple[Tensor, dict[str, Tensor]]:
        return staged_encode(self, x, taps, stem=self._stem)

    def _stem(self, x: Tensor) -> Tensor:
        """7×7 stride-2 convolution, BN, ReLU, 3×3 stride-2 max-pool (torchvision's form)."""
        return F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, stride=2, padding=1)


def build_resnet18_imagenet(input_shape: Sequence[int], num_classes: int, *,
                            data_name: str | None = None) -> ResNet18ImageNet:
    """:class:`ResNet18ImageNet` for ``input_shape`` = (C, H, W); every conv is padded, any side ≥ 1 works."""
    channels, _, _ = check_input_shape(input_shape, arch="resnet18_imagenet", min_size=1, data_name=data_name)
    return ResNet18ImageNet(num_classes, in_channels=channels)


@register_model("resnet18_imagenet", head_keys=("fc.weight", "fc.bias"))
def _resnet18_imagenet(input_shape: Sequence[int], num_classes: int, *, data_name: str) -> ResNet18ImageNet:
    """ImageNet-form ResNet-18 (7×7 stem + max-pool; torchvision's keys), the RxRx1 network."""
    return build_resnet18_imagenet(input_shape, num_classes, data_name=data_name)
