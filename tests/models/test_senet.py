"""SENet-18: shapes, parameter count from the layer list, SE and shortcut rules, norm variants,
training, vmap."""
from __future__ import annotations

import pytest
import torch

from fedlatent.models import senet
from fedlatent.models.senet import PreActSEBlock
from tests.models.model_checks import assert_one_step_learns, assert_vmap_matches_single, batch, norm_layers

torch.set_num_threads(1)


def _params(classes: int) -> int:
    """Stem conv (no bias) + norm; per block: norm(cin), conv3×3 cin→p, norm(p), conv3×3 p→p
    (no bias), SE convs p→p/16→p with bias, a bias-free 1×1 shortcut when stride or width change."""
    total = 3 * 64 * 9 + 2 * 64
    cin = 64
    for planes in (64, 128, 256, 512):
        for _block in range(2):
            r = planes // 16
            total += 2 * cin + cin * planes * 9 + 2 * planes + planes * planes * 9
            total += planes * r + r + r * planes + planes
            if cin != planes:
                total += cin * planes
            cin = planes
    return total + 512 * classes + classes


def test_senet18_parameter_count_matches_the_layer_list() -> None:
    assert _params(10) == 11_260_354  # the 11.26 M usually quoted for kuangliu/pytorch-cifar's SENet18
    for norm in ("batch", "group"):
        assert sum(p.numel() for p in senet.build((3, 32, 32), 100, norm=norm).parameters()) == _params(100)


def test_senet18_shapes_and_taps_on_cifar_input() -> None:
    model = senet.build((3, 32, 32), 10)
    out = model(batch(4)[0], taps=model.tap_names)
    assert out.logits.shape == (4, 10) and out.z.shape == (4, 512)
    shapes = {k: tuple(v.shape[1:]) for k, v in out.features.items()}
    assert shapes == {"pool": (512,), "layer4": (512, 4, 4), "layer3": (256, 8, 8), "layer2": (128, 16, 16),
                      "layer1": (64, 32, 32), "stem": (64, 32, 32)}
    with_proj = senet.build((3, 32, 32), 10, projector_width=32)
    assert with_proj.z_dim == 32 and with_proj(batch(2)[0]).z.shape == (2, 32)


def test_se_block_rescales_channels_and_adds_the_shortcut() -> None:
    block = PreActSEBlock(32, 32, norm="group").eval()
    assert block.shortcut is None and block.se_reduce.out_channels == 2
    x = torch.randn(2, 32, 4, 4)
    with torch.no_grad():
        pre = torch.relu(block.bn1(x))
        body = block.conv2(torch.relu(block.bn2(block.conv1(pre))))
        squeeze = body.mean(dim=(2, 3), keepdim=True)
        gate = torch.sigmoid(block.se_expand(torch.relu(block.se_reduce(squeeze))))
        torch.testing.assert_close(block(x), body * gate + x)
    down = PreActSEBlock(32, 64, stride=2)
    assert down.shortcut is not None and down.shortcut.stride == (2, 2) and down.shortcut.bias is None


def test_senet18_norm_variants() -> None:
    assert norm_layers(senet.build((3, 32, 32), 10)) == (1 + 8 * 2, 0)
    assert norm_layers(senet.build((3, 32, 32), 10, norm="group")) == (0, 1 + 8 * 2)


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_senet18_one_step_learns_and_vmaps(norm: str) -> None:
    torch.manual_seed(0)
    assert_one_step_learns(senet.build((3, 32, 32), 10, norm=norm))
    assert_vmap_matches_single(lambda: senet.build((3, 32, 32), 10, norm=norm), ("layer2",))
