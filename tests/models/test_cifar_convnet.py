"""The Ditto + MMD CIFAR-10 ConvNet: shapes and depth taps, parameter count from the release's
layer list, training, vmap."""
from __future__ import annotations

import torch

from fedlatent.models import cifar_convnet
from tests.models.model_checks import assert_one_step_learns, assert_vmap_matches_single, batch

torch.set_num_threads(1)


def _params(classes: int, side: int = 32) -> int:
    """conv5×5 3→32 + BN, conv5×5 32→64 + BN (all with bias), FC 64·(side/4)² → 2048, FC 2048 → C."""
    flat = 64 * (side // 4) ** 2
    return (3 * 32 * 25 + 32 + 2 * 32) + (32 * 64 * 25 + 64 + 2 * 64) + (flat * 2048 + 2048) + (2048 * classes + classes)


def test_cifar_convnet_parameter_count_matches_the_release_layer_list() -> None:
    model = cifar_convnet.build((3, 32, 32), 10)
    assert sum(p.numel() for p in model.parameters()) == _params(10)


def test_cifar_convnet_shapes_and_the_papers_depth_taps() -> None:
    model = cifar_convnet.build((3, 32, 32), 10)
    assert model.tap_names == ("fc1", "bn2", "bn1")  # constraint depths 1, 2, 3 of the paper
    out = model(batch(4)[0], taps=model.tap_names)
    assert out.logits.shape == (4, 10) and out.z.shape == (4, 2048)
    shapes = {k: tuple(v.shape[1:]) for k, v in out.features.items()}
    assert shapes == {"fc1": (2048,), "bn2": (64, 16, 16), "bn1": (32, 32, 32)}
    assert torch.equal(out.features["fc1"], out.z)
    assert all((f >= 0).all() for f in out.features.values())  # after the (release's in-place) ReLU


def test_cifar_convnet_one_step_learns_and_vmaps() -> None:
    torch.manual_seed(0)
    assert_one_step_learns(cifar_convnet.build((3, 32, 32), 10))
    assert_vmap_matches_single(lambda: cifar_convnet.build((3, 32, 32), 10), ("bn2", "bn1"))
