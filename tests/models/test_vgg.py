"""VGG-13 (SphereFed): shapes, parameter count from the layer list, norm variants, training, vmap."""
from __future__ import annotations

import pytest
import torch

from fedlatent.errors import ConfigError
from fedlatent.models import vgg
from tests.models.model_checks import assert_one_step_learns, assert_vmap_matches_single, batch, norm_layers

torch.set_num_threads(1)


def _params(classes: int, in_ch: int = 3) -> int:
    """Ten 3×3 convs with bias, a norm (γ, β) after each, the 512→classes classifier."""
    widths = [64, 64, 128, 128, 256, 256, 512, 512, 512, 512]
    total, cin = 0, in_ch
    for cout in widths:
        total += cin * cout * 3 * 3 + cout + 2 * cout
        cin = cout
    return total + 512 * classes + classes


def test_vgg13_parameter_count_matches_the_layer_list() -> None:
    assert _params(10) == 9_416_010  # the 9.42 M usually quoted for the CIFAR-10 VGG-13 of kuangliu/pytorch-cifar
    for norm in ("batch", "group"):  # GroupNorm has the same affine parameters as BatchNorm
        model = vgg.build((3, 32, 32), 100, norm=norm)
        assert sum(p.numel() for p in model.parameters()) == _params(100)


def test_vgg13_shapes_and_taps_on_cifar_input() -> None:
    model = vgg.build((3, 32, 32), 10)
    out = model(batch(4)[0], taps=model.tap_names)
    assert out.logits.shape == (4, 10) and out.z.shape == (4, 512) and model.z_dim == 512
    shapes = {k: tuple(v.shape[1:]) for k, v in out.features.items()}
    assert shapes == {"pool": (512,), "block5": (512, 1, 1), "block4": (512, 2, 2), "block3": (256, 4, 4),
                      "block2": (128, 8, 8), "block1": (64, 16, 16)}
    assert torch.equal(out.features["pool"], out.z)
    assert model(batch(2)[0]).features == {}


def test_vgg13_larger_inputs_are_max_pooled_to_512_and_small_ones_refused() -> None:
    model = vgg.build((3, 64, 64), 10).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 64), taps=("block5",))
    assert out.features["block5"].shape == (1, 512, 2, 2)
    assert torch.equal(out.z, out.features["block5"].amax(dim=(2, 3)))
    with pytest.raises(ConfigError, match="vgg13.*32×32.*'digits' gives 8×8"):
        vgg.build((1, 8, 8), 10, data_name="digits")


def test_vgg13_norm_variants_and_projector() -> None:
    assert norm_layers(vgg.build((3, 32, 32), 10)) == (10, 0)
    group = vgg.build((3, 32, 32), 10, norm="group")
    assert norm_layers(group) == (0, 10)
    assert all(m.num_groups == 2 for m in group.modules() if isinstance(m, torch.nn.GroupNorm))
    assert not any("running" in k for k in group.state_dict())
    projected = vgg.build((3, 32, 32), 10, projector_width=64)
    assert projected.z_dim == 64 and projected(batch(2)[0]).z.shape == (2, 64)


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_vgg13_one_step_learns_and_vmaps(norm: str) -> None:
    torch.manual_seed(0)
    assert_one_step_learns(vgg.build((3, 32, 32), 10, norm=norm))
    assert_vmap_matches_single(lambda: vgg.build((3, 32, 32), 10, norm=norm), ("block3",))
