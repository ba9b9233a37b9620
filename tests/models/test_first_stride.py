"""``model.first_stride = 2`` (SphereFed's TIN_S on TinyImageNet, architecture Tables 13-15): the
first stride-1 stage of ResNet-18, SENet-18 and MobileNetV2 halves the sides, so a 64×64 input
reaches every later stage at the sides of a 32×32 input; parameter counts by hand; config checks."""
from __future__ import annotations

import pytest
import torch

from fedlatent.config import ConfigError, load_config
from fedlatent.models import mobilenet, resnet, senet

torch.set_num_threads(1)

BUILD = {"resnet18": lambda side, **k: resnet.build((3, side, side), 200, **k),
         "senet18": lambda side, **k: senet.build((3, side, side), 200, **k),
         "mobilenetv2": lambda side, **k: mobilenet.build((3, side, side), 200, **k)}
# the stage whose first block takes the stride, and the parameters the stride adds (by hand):
# ResNet-18 layer1.0 gains a 1×1 conv 64→64 shortcut + norm (64·64 + 2·64); SENet-18's pre-activated
# shortcut has no norm (64·64); MobileNetV2's stage2.0 (16→24) loses its 1×1 conv + norm shortcut,
# kept only at stride 1 (−(16·24 + 2·24)).
STRIDED = {"resnet18": ("layer1", 64 * 64 + 2 * 64), "senet18": ("layer1", 64 * 64),
           "mobilenetv2": ("stage2", -(16 * 24 + 2 * 24))}


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("arch", sorted(BUILD))
@pytest.mark.parametrize("norm", ["batch", "group"])
def test_stride_2_first_block_on_64px_matches_stride_1_on_32px(arch: str, norm: str) -> None:
    cifar, tiny = BUILD[arch](32, norm=norm), BUILD[arch](64, norm=norm, first_stride=2)
    cifar.eval(), tiny.eval()
    _, a = cifar.encode(torch.zeros(2, 3, 32, 32), frozenset(cifar.tap_names))
    _, b = tiny.encode(torch.zeros(2, 3, 64, 64), frozenset(tiny.tap_names))
    stage, extra = STRIDED[arch]
    names = list(reversed(cifar.tap_names))  # shallowest first
    for name in names:
        if names.index(name) < names.index(stage):
            assert b[name].shape[-1] == 2 * a[name].shape[-1] == 64, name  # before the stride: twice the side
        else:
            assert b[name].shape == a[name].shape, name
    assert tiny(torch.zeros(2, 3, 64, 64)).logits.shape == (2, 200)
    assert _count(tiny) - _count(cifar) == extra


def test_first_stride_is_a_config_key_of_the_three_models_only() -> None:
    for arch in BUILD:
        config = load_config(None, [f'model.arch="{arch}"', "model.first_stride=2", 'data.dataset="synthetic"'])
        assert config.model.options["first_stride"] == 2
    with pytest.raises(ConfigError, match="first_stride"):
        load_config(None, ['model.arch="resnet18"', "model.first_stride=3"])
    with pytest.raises(ConfigError, match="first_stride"):
        load_config(None, ['model.arch="vgg13"', "model.first_stride=2"])
    with pytest.raises(ConfigError, match="first_stride = 4"):
        resnet.build((3, 32, 32), 10, first_stride=4)
