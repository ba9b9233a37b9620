"""SphereFed's 7-layer ConvNet: shapes, parameter count from Table 11, norm variants, training, vmap."""
from __future__ import annotations

import pytest
import torch

from fedlatent.models import convnet7
from tests.models.model_checks import assert_one_step_learns, assert_vmap_matches_single, batch, norm_layers

torch.set_num_threads(1)


def _params(classes: int) -> int:
    """Table 11: seven 3×3 convs with bias and a norm (γ, β) each; FC(1024, classes)."""
    chans = [3, 32, 64, 64, 64, 128, 128, 256]
    convs = sum(cin * cout * 9 + cout + 2 * cout for cin, cout in zip(chans, chans[1:]))
    return convs + 1024 * classes + classes


def test_convnet7_parameter_count_matches_table_11() -> None:
    for norm in ("batch", "group"):
        model = convnet7.build((3, 32, 32), 100, norm=norm)
        assert sum(p.numel() for p in model.parameters()) == _params(100)
    assert model.classifier.in_features == 1024  # the table's FC(1024, 100)


def test_convnet7_shapes_and_taps_on_cifar_input() -> None:
    model = convnet7.build((3, 32, 32), 10)
    out = model(batch(4)[0], taps=model.tap_names)
    assert out.logits.shape == (4, 10) and out.z.shape == (4, 1024)
    shapes = {k: tuple(v.shape[1:]) for k, v in out.features.items()}
    assert shapes == {"flat": (1024,), "conv7": (256, 2, 2), "conv6": (128, 4, 4), "conv5": (128, 4, 4),
                      "conv4": (64, 8, 8), "conv3": (64, 8, 8), "conv2": (64, 16, 16), "conv1": (32, 32, 32)}
    assert torch.equal(out.features["flat"], out.features["conv7"].flatten(1))
    strides = [layer[0].stride[0] for layer in model.layers]
    assert strides == [1, 2, 2, 1, 2, 1, 2]


def test_convnet7_z_follows_the_input_size() -> None:
    model = convnet7.build((3, 64, 64), 10)  # Tiny-ImageNet: 256 × 4 × 4
    assert model.z_dim == 4096 and model(torch.randn(2, 3, 64, 64)).z.shape == (2, 4096)
    assert convnet7.build((1, 8, 8), 10).z_dim == 256  # 8 → 8, 4, 2, 2, 1, 1, 1


def test_convnet7_norm_variants() -> None:
    assert norm_layers(convnet7.build((3, 32, 32), 10)) == (7, 0)
    assert norm_layers(convnet7.build((3, 32, 32), 10, norm="group")) == (0, 7)


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_convnet7_one_step_learns_and_vmaps(norm: str) -> None:
    torch.manual_seed(0)
    assert_one_step_learns(convnet7.build((3, 32, 32), 10, norm=norm))
    assert_vmap_matches_single(lambda: convnet7.build((3, 32, 32), 10, norm=norm), ("conv7", "conv2"))
