"""AutoAugment, CIFAR-10 policy: the table, each operation against a hand computation, seeding."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fedlatent
from fedlatent.data import autoaugment as A
from fedlatent.data.augment import Augmentation, augment_batch
from fedlatent.errors import ConfigError

# Cubuk et al. 2019, appendix (policy found on reduced CIFAR-10), sub-policies 0-24 as
# "operation probability magnitude-bin" pairs; "-" where the operation takes no magnitude.
PUBLISHED = """
Invert 0.1 - | Contrast 0.2 6
Rotate 0.7 2 | TranslateX 0.3 9
Sharpness 0.8 1 | Sharpness 0.9 3
ShearY 0.5 8 | TranslateY 0.7 9
AutoContrast 0.5 - | Equalize 0.9 -
ShearY 0.2 7 | Posterize 0.3 7
Color 0.4 3 | Brightness 0.6 7
Sharpness 0.3 9 | Brightness 0.7 9
Equalize 0.6 - | Equalize 0.5 -
Contrast 0.6 7 | Sharpness 0.6 5
Color 0.7 7 | TranslateX 0.5 8
Equalize 0.3 - | AutoContrast 0.4 -
TranslateY 0.4 3 | Sharpness 0.2 6
Brightness 0.9 6 | Color 0.2 8
Solarize 0.5 2 | Invert 0.0 -
Equalize 0.2 - | AutoContrast 0.6 -
Equalize 0.2 - | Equalize 0.6 -
Color 0.9 9 | Equalize 0.6 -
AutoContrast 0.8 - | Solarize 0.2 8
Brightness 0.1 3 | Color 0.7 0
Solarize 0.4 5 | AutoContrast 0.9 -
TranslateY 0.9 9 | TranslateY 0.7 9
AutoContrast 0.9 - | Solarize 0.8 3
Equalize 0.8 - | Invert 0.1 -
TranslateY 0.7 9 | AutoContrast 0.9 -
"""


def _parse(line: str) -> tuple:
    ops = []
    for half in line.split("|"):
        name, prob, level = half.split()
        ops.append((name, float(prob), None if level == "-" else int(level)))
    return tuple(ops)


def test_policy_table_is_the_published_one() -> None:
    published = tuple(_parse(line) for line in PUBLISHED.strip().splitlines())
    assert len(published) == 25
    assert A.CIFAR10_POLICY == published
    assert {op for sub in published for op, _, _ in sub} <= set(A.OPS)


def test_magnitude_bins_by_hand() -> None:
    assert A.magnitude("TranslateX", 9, 32, 32) == pytest.approx(150 / 331 * 32)   # 14.50 px
    assert A.magnitude("Rotate", 2, 32, 32) == pytest.approx(30 * 2 / 9)
    assert A.magnitude("ShearY", 8, 32, 32) == pytest.approx(0.3 * 8 / 9)
    assert A.magnitude("Solarize", 2, 32, 32) == pytest.approx(255 - 2 * 255 / 9)
    assert [A.magnitude("Posterize", k, 32, 32) for k in range(10)] == [8, 8, 7, 7, 6, 6, 5, 5, 4, 4]
    assert A.magnitude("Equalize", None, 32, 32) == 0.0


def _img(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)[None, None]


def _m(v: float) -> torch.Tensor:
    return torch.tensor([v], dtype=torch.float64)


GRID = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_geometric_ops_by_hand() -> None:
    x = _img(GRID)
    # shear 0.3 about the top-left corner: rows 0 and 1 read floor(u + 0.5 + 0.3 (v + 0.5)) = u,
    # row 2 reads u + 1 (the last pixel falls outside: black)
    assert A.shear_x(x, _m(0.3)).tolist() == [[[[1, 2, 3], [4, 5, 6], [8, 9, 0]]]]
    assert A.shear_y(x, _m(0.3)).tolist() == [[[[1, 2, 6], [4, 5, 9], [7, 8, 0]]]]
    assert A.translate_x(x, _m(1.7)).tolist() == [[[[0, 1, 2], [0, 4, 5], [0, 7, 8]]]]   # int(1.7) = 1
    assert A.translate_y(x, _m(-1.7)).tolist() == [[[[4, 5, 6], [7, 8, 9], [0, 0, 0]]]]
    assert torch.equal(A.rotate(x, _m(90.0)), torch.rot90(x, 1, dims=(-2, -1)))        # counter-clockwise
    assert torch.equal(A.rotate(x, _m(0.0)), x)


def test_colour_ops_by_hand() -> None:
    x = _img([[0, 10], [20, 30]])
    assert A.invert(x, _m(0)).tolist() == [[[[255, 245], [235, 225]]]]
    # contrast 1.5 around the rounded mean 15: 15 + 1.5 (v - 15), clipped, truncated
    assert A.contrast(x, _m(0.5)).tolist() == [[[[0, 7], [22, 37]]]]
    assert A.brightness(_img([[100, 101, 200]]), _m(0.5)).tolist() == [[[[150, 151, 255]]]]
    assert A.posterize(_img([[203, 7, 255]]), _m(5)).tolist() == [[[[200, 0, 248]]]]
    assert A.solarize(_img([[200, 198, 0]]), _m(198.33)).tolist() == [[[[55, 198, 0]]]]
    assert A.autocontrast(_img([[50, 100, 150]]), _m(0)).tolist() == [[[[0, 127, 255]]]]
    flat = _img([[7, 7]])
    assert torch.equal(A.autocontrast(flat, _m(0)), flat)
    # colour: grey of (200, 100, 0) is (200·19595 + 100·38470 + 32768) >> 16 = 7798768 >> 16 = 118
    # (65536·119 = 7798784); factor 1.9: 118 + 1.9·82 → 255, 118 − 1.9·18 = 83.8 → 83, 0
    rgb = torch.tensor([200.0, 100.0, 0.0])[None, :, None, None]
    assert A.grey(rgb).item() == 118
    assert A.color(rgb, _m(0.9)).flatten().tolist() == [255, 83, 0]
    assert torch.equal(A.color(x, _m(0.9)), x)           # one channel: its own grey
    # sharpness: the centre smooths to round(5·130 / 13) = 50, borders stay; 50 + 1.5 (130 - 50)
    spot = torch.zeros(1, 1, 3, 3)
    spot[0, 0, 1, 1] = 130
    out = A.sharpness(spot, _m(0.5))
    assert out[0, 0, 1, 1] == 170 and float(out.sum()) == 170


def test_equalize_by_hand() -> None:
    # 1024 pixels: 512 × 10, 256 × 20, 256 × 30. step = (1024 - 256) // 255 = 3,
    # lut = (1 + cdf(v - 1)) // 3: 10 → 0, 20 → 171, 30 → 256 → 255
    x = torch.tensor([10.0] * 512 + [20.0] * 256 + [30.0] * 256).reshape(1, 1, 32, 32)
    out = A.equalize(x, _m(0))
    assert sorted(set(out.flatten().tolist())) == [0, 171, 255]
    assert out.flatten()[:512].eq(0).all() and out.flatten()[-256:].eq(255).all()
    few = _img([[0, 0, 1, 2]])                            # step 0: unchanged
    assert torch.equal(A.equalize(few, _m(0)), few)


def _pixels(n: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, 8, 8), generator=torch.Generator().manual_seed(seed)).float()


def test_autoaugment_is_seeded_and_stays_on_the_pixel_grid() -> None:
    x = _pixels()
    a = A.autoaugment(x, torch.Generator().manual_seed(3))
    b = A.autoaugment(x, torch.Generator().manual_seed(3))
    c = A.autoaugment(x, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a, a.round()) and a.min() >= 0 and a.max() <= 255
    assert 0 < sum(not torch.equal(o, i) for o, i in zip(a, x)) < len(x)   # some images kept


def test_autoaugment_applies_the_drawn_sub_policy() -> None:
    """Replaying the generator's draws gives, image by image, the ops of the chosen sub-policy."""
    x = _pixels(16, seed=1)
    out = A.autoaugment(x, torch.Generator().manual_seed(9))
    g = torch.Generator().manual_seed(9)
    choice = torch.randint(0, 25, (16,), generator=g)
    probs = torch.rand(16, 2, generator=g)
    signs = torch.randint(0, 2, (16, 2), generator=g)
    for i in range(16):
        img = x[i:i + 1]
        for stage, (name, p, level) in enumerate(A.CIFAR10_POLICY[int(choice[i])]):
            if probs[i, stage] <= p:
                mag = A.magnitude(name, level, 8, 8)
                if name in A.SIGNED and signs[i, stage] == 0:
                    mag = -mag
                img = A.OPS[name](img, _m(mag))
        assert torch.equal(out[i:i + 1], img)


def test_augmentation_in_standardised_space() -> None:
    mean = np.array([0.5, 0.4, 0.3], np.float32).reshape(3, 1, 1)
    std = np.array([0.2, 0.25, 0.3], np.float32).reshape(3, 1, 1)
    x = (_pixels() / 255 - torch.from_numpy(mean)) / torch.from_numpy(std)
    aug = Augmentation(policy="cifar10", mean=mean, std=std)
    out = augment_batch(x, torch.Generator().manual_seed(0), aug)
    pixels = (out * torch.from_numpy(std) + torch.from_numpy(mean)) * 255
    assert torch.allclose(pixels, pixels.round(), atol=1e-3)            # back on the 0..255 grid
    assert not Augmentation() and Augmentation(crop_flip=True) and aug
    legacy = augment_batch(x, torch.Generator().manual_seed(2))
    assert torch.equal(legacy, augment_batch(x, torch.Generator().manual_seed(2), Augmentation(crop_flip=True)))


def test_config_key_reaches_the_federation() -> None:
    cfg = fedlatent.load_config(None, ["data.autoaugment=cifar10", "data.augment=true"])
    from fedlatent.data.federation import build_federation
    fed = build_federation(cfg.data, 0)
    assert fed.augment.policy == "cifar10" and fed.augment.crop_flip
    assert np.asarray(fed.augment.std).shape == (1, 1, 1)                # digits: one channel
    with pytest.raises(ConfigError, match="data.autoaugment"):
        fedlatent.load_config(None, ["data.autoaugment=imagenet"])
