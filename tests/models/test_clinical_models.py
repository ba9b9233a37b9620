"""EfficientNet-B0 (efficientnet-pytorch's keys) and ImageNet-form ResNet-18 (torchvision's keys):
shapes, the published parameter counts, TF "same" padding, one training step."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from fedlatent.models.efficientnet import SameConv2d, build_efficientnet_b0
from fedlatent.models.registry import MODELS
from fedlatent.models.resnet_imagenet import build_resnet18_imagenet
from tests.models.model_checks import assert_one_step_learns

torch.set_num_threads(1)


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_efficientnet_b0_parameters_shapes_and_taps() -> None:
    model = build_efficientnet_b0((3, 64, 48), num_classes=8).eval()
    assert _count(model) == 4_017_796  # efficientnet-pytorch's efficientnet-b0 with an 8-way _fc
    # the 1000-way ImageNet model: 5,288,548 (the published count), i.e. 1281 per class on top of the encoder
    assert _count(model) - 8 * 1281 + 1000 * 1281 == 5_288_548
    out = model(torch.randn(2, 3, 64, 48), taps=("pool", "head", "stage5", "stage3"))
    assert out.logits.shape == (2, 8) and out.z.shape == (2, 1280)
    assert torch.equal(out.features["pool"], out.z)
    assert out.features["head"].shape == (2, 1280, 2, 2)
    assert out.features["stage5"].shape == (2, 112, 4, 3)
    assert out.features["stage3"].shape == (2, 40, 8, 6)
    keys = model.state_dict().keys()
    assert len({k.split(".")[1] for k in keys if k.startswith("_blocks.")}) == 16
    assert "_blocks.0._expand_conv.weight" not in keys and "_blocks.1._expand_conv.weight" in keys
    for key in ("_conv_stem.weight", "_bn0.running_var", "_blocks.15._se_reduce.bias", "_blocks.15._project_conv.weight",
                "_blocks.15._bn2.weight", "_conv_head.weight", "_bn1.bias"):
        assert key in keys


@pytest.mark.parametrize("side, kernel, stride, pads", [(8, 3, 2, (0, 1)), (9, 3, 2, (1, 1)), (8, 5, 2, (1, 2)),
                                                       (7, 5, 1, (2, 2))])
def test_same_padding_is_tensorflows(side: int, kernel: int, stride: int, pads: tuple[int, int]) -> None:
    conv = SameConv2d(2, 3, kernel, stride=stride)
    x = torch.randn(1, 2, side, side)
    expect = F.conv2d(F.pad(x, (*pads, *pads)), conv.weight, conv.bias, stride=stride)
    torch.testing.assert_close(conv(x), expect)
    assert conv(x).shape[-1] == -(-side // stride)  # ceil(n / s), TF's "same" output size


def test_resnet18_imagenet_parameters_shapes_and_keys() -> None:
    model = build_resnet18_imagenet((3, 64, 64), num_classes=50).eval()
    assert _count(model) == 11_202_162
    assert _count(model) - 50 * 513 + 1000 * 513 == 11_689_512  # torchvision's resnet18 with its 1000-way fc
    out = model(torch.randn(2, 3, 64, 64), taps=("stem", "layer1", "layer4", "pool"))
    assert out.logits.shape == (2, 50) and out.z.shape == (2, 512)
    assert out.features["stem"].shape == (2, 64, 16, 16) and out.features["layer4"].shape == (2, 512, 2, 2)
    keys = set(model.state_dict())
    for key in ("conv1.weight", "bn1.running_mean", "layer1.0.conv1.weight", "layer2.0.downsample.0.weight",
                "layer2.0.downsample.1.running_var", "layer4.1.bn2.bias"):
        assert key in keys
    assert "layer1.0.downsample.0.weight" not in keys


@pytest.mark.parametrize("arch", ["efficientnet_b0", "resnet18_imagenet"])
def test_one_training_step_learns(arch: str) -> None:
    torch.manual_seed(0)
    model = MODELS.get(arch).build((3, 32, 32), 10, data_name="test")
    assert_one_step_learns(model)
    assert MODELS.get(arch).traits["head_keys"][0].endswith("weight")
