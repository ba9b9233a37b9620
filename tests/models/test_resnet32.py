"""ResNet-32 (CIFAR form, FedDecorr's appendix): parameter count by hand, shapes, shortcut, training, vmap."""
from __future__ import annotations

import pytest
import torch

import fedlatent
from fedlatent.models import resnet32
from fedlatent.models.registry import MODELS
from tests.models.model_checks import assert_one_step_learns, assert_vmap_matches_single, batch, norm_layers

torch.set_num_threads(1)


def test_parameter_count_by_hand() -> None:
    # stem 3·16·9 + BN 2·16 = 464
    # stage 1: 5 blocks × (2 convs 16·16·9 + 2 BN 2·16) = 5 × 4672 = 23 360
    # stage 2: (16·32·9 + 32·32·9 + 2·64) + 4 × (2·32·32·9 + 2·64) = 13 952 + 74 240 = 88 192
    # stage 3: (32·64·9 + 64·64·9 + 2·128) + 4 × (2·64·64·9 + 2·128) = 55 552 + 295 936 = 351 488
    # classifier 64·10 + 10 = 650; option-A shortcuts add nothing
    model = resnet32.build((3, 32, 32), 10)
    assert sum(p.numel() for p in model.parameters()) == 464 + 23_360 + 88_192 + 351_488 + 650 == 464_154
    assert sum(isinstance(m, torch.nn.Conv2d) for m in model.modules()) + 1 == 32   # 31 convs + the classifier
    wide = resnet32.build((3, 32, 32), 100)
    assert sum(p.numel() for p in wide.parameters()) == 464_154 - 650 + 64 * 100 + 100


def test_shapes_and_taps() -> None:
    model = resnet32.build((3, 32, 32), 10)
    out = model(batch(4)[0], taps=model.tap_names)
    assert out.logits.shape == (4, 10) and out.z.shape == (4, 64) and model.z_dim == 64
    shapes = {k: tuple(v.shape[1:]) for k, v in out.features.items()}
    assert shapes == {"pool": (64,), "layer3": (64, 8, 8), "layer2": (32, 16, 16), "layer1": (16, 32, 32),
                      "stem": (16, 32, 32)}
    assert torch.equal(out.features["pool"], out.z)
    small = resnet32.build((1, 8, 8), 10)                 # digits size works: every conv is padded
    assert small(torch.randn(2, 1, 8, 8)).logits.shape == (2, 10)


def test_option_a_shortcut_subsamples_and_pads_zeros() -> None:
    x = torch.arange(2 * 16 * 4 * 4, dtype=torch.float32).reshape(2, 16, 4, 4)
    out = resnet32.PadShortcut(16, 32, 2)(x)
    assert out.shape == (2, 32, 2, 2)
    assert torch.equal(out[:, 8:24], x[:, :, ::2, ::2])
    assert not out[:, :8].any() and not out[:, 24:].any()


def test_registered_with_norm_and_projector() -> None:
    cfg = fedlatent.load_config(None, ["model.arch=resnet32", "model.norm=group", "model.projector=32"])
    assert MODELS.get(cfg.model.arch) is MODELS.get("resnet32")
    group = resnet32.build((3, 32, 32), 10, norm="group", projector_width=32)
    assert norm_layers(group) == (0, 31) and group.z_dim == 32
    assert norm_layers(resnet32.build((3, 32, 32), 10)) == (31, 0)


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_one_step_learns_and_vmaps(norm: str) -> None:
    torch.manual_seed(0)
    assert_one_step_learns(resnet32.build((3, 32, 32), 10, norm=norm), lr=1e-3)
    assert_vmap_matches_single(lambda: resnet32.build((3, 32, 32), 10, norm=norm), ("layer2",))
