"""FLamby's Fed-ISIC2019 training augmentation (data.augment_policy = "flamby_isic"): each op
against a hand computation on tiny images, the whole pipeline's determinism and shapes, the
standardisation undone around it, and the data set keeping a crop margin for it."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlatent.config import DataConfig
from fedlatent.data import flamby_isic as fi
from fedlatent.data.augment import Augmentation, augment_batch
from fedlatent.data.datasets import fed_isic2019
from fedlatent.data.federation import build_federation
from fedlatent.errors import ConfigError
from tests.data.clinical_files import write_isic


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_flip_modes_by_hand() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).expand(4, 1, 2, 2)
    out = fi.flip(x, torch.tensor([0, 1, 2, 3]))
    assert out[0, 0].tolist() == [[1, 2], [3, 4]]
    assert out[1, 0].tolist() == [[2, 1], [4, 3]]   # left-right
    assert out[2, 0].tolist() == [[3, 4], [1, 2]]   # up-down
    assert out[3, 0].tolist() == [[4, 3], [2, 1]]   # both


def test_rotation_by_90_degrees_is_a_counter_clockwise_quarter_turn() -> None:
    x = torch.arange(16, dtype=torch.float32).reshape(1, 1, 4, 4)
    quarter = fi.warp(x, fi.rotation(torch.tensor([90.0])))
    # as displayed (row 0 on top): the right column becomes the top row
    torch.testing.assert_close(quarter, torch.rot90(x, 1, dims=(-2, -1)), atol=1e-5, rtol=0)
    assert quarter[0, 0, 0].tolist() == pytest.approx([3, 7, 11, 15], abs=1e-5)
    half = fi.warp(x, fi.rotation(torch.tensor([180.0])))
    torch.testing.assert_close(half, x.flip(-1).flip(-2), atol=1e-5, rtol=0)


def test_identity_warp_and_zoom_by_hand() -> None:
    x = torch.rand(2, 3, 5, 5, generator=_gen())
    torch.testing.assert_close(fi.warp(x, torch.eye(2, dtype=torch.float64).expand(2, 2, 2)), x, atol=1e-5, rtol=0)
    # a ramp: pixel centres at p = −1.5, −0.5, 0.5, 1.5 about the centre hold p + 1.5; zoomed by 2,
    # output p reads the input at p / 2 (bilinear, exact on a ramp): p / 2 + 1.5
    row = torch.tensor([0.0, 1.0, 2.0, 3.0]).expand(1, 1, 4, 4)
    out = fi.warp(row, fi.zoom(torch.tensor([2.0])))
    assert out[0, 0, 0].tolist() == pytest.approx([0.75, 1.25, 1.75, 2.25], abs=1e-5)


def test_shear_inverse_by_hand() -> None:
    inverse = fi.shear(torch.tensor([45.0]), torch.tensor([0.0]))
    torch.testing.assert_close(inverse[0], torch.tensor([[1.0, -1.0], [0.0, 1.0]], dtype=torch.float64))
    small = fi.shear(torch.tensor([0.1]), torch.tensor([-0.1]))[0]
    t = math.tan(math.radians(0.1))
    forward = torch.tensor([[1.0, t], [-t, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(small @ forward, torch.eye(2, dtype=torch.float64))


def test_brightness_contrast_arithmetic_and_clipping() -> None:
    x = torch.tensor([0.5, 0.95, 0.0]).reshape(1, 1, 1, 3).expand(2, 1, 1, 3)
    out = fi.brightness_contrast(x, torch.tensor([1.1, 0.9]), torch.tensor([0.1, -0.15]))
    assert out[0, 0, 0].tolist() == pytest.approx([0.65, 1.0, 0.1])          # 1.1 · 0.95 + 0.1 clips to 1
    assert out[1, 0, 0].tolist() == pytest.approx([0.3, 0.705, 0.0])         # 0.9 · 0 − 0.15 clips to 0


def test_crop_and_holes_at_given_places() -> None:
    x = torch.arange(2 * 36, dtype=torch.float32).reshape(2, 1, 6, 6)
    out = fi.crop(x, torch.tensor([0, 2]), torch.tensor([1, 3]), 3)
    torch.testing.assert_close(out[0, 0], x[0, 0, 0:3, 1:4])
    torch.testing.assert_close(out[1, 0], x[1, 0, 2:5, 3:6])
    ones = torch.ones(1, 2, 6, 6)
    cut = fi.holes(ones, torch.tensor([[1, 0]]), torch.tensor([[2, 0]]), torch.tensor([[True, False]]), 2)
    expect = torch.ones(6, 6)
    expect[1:3, 2:4] = 0  # the second hole is not used
    assert (cut[0, 0] == expect).all() and (cut[0, 1] == expect).all()


def test_pipeline_is_seeded_and_crops_to_the_input_side() -> None:
    x = torch.rand(6, 3, 224, 224, generator=_gen(1))
    a = fi.flamby_isic(x, _gen(5), 200)
    assert a.shape == (6, 3, 200, 200)
    torch.testing.assert_close(a, fi.flamby_isic(x, _gen(5), 200), atol=0, rtol=0)
    assert not torch.equal(a, fi.flamby_isic(x, _gen(6), 200))
    assert float(a.min()) >= 0.0 and float(a.max()) <= 1.0
    with pytest.raises(ValueError, match="cannot crop 200"):
        fi.flamby_isic(torch.rand(1, 3, 150, 150), _gen(), 200)


def test_constant_image_keeps_one_value_outside_16px_holes() -> None:
    """Geometry leaves a constant image constant (mirrored border): every output pixel is the
    brightness/contrast value or 0 inside dropout holes, which cover whole 16×16 squares."""
    n = 64
    out = fi.flamby_isic(torch.full((n, 1, 40, 40), 0.5), _gen(3), 32)
    with_holes = 0
    for img in out[:, 0]:
        kept = img[img != 0]  # 0.5 α + β ≥ 0.3: only holes are 0
        assert float((kept - kept[0]).abs().max()) < 1e-5 and 0.3 <= float(kept[0]) <= 0.7
        count = int((img == 0).sum())
        with_holes += count > 0
        assert count == 0 or 256 <= count <= 8 * 256
    assert 16 <= with_holes <= 48  # CoarseDropout's probability 1/2 over 64 images


def test_augment_batch_undoes_the_standardisation_around_it() -> None:
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)
    pixels = torch.rand(3, 3, 22, 22, generator=_gen(2))
    standardised = (pixels - torch.from_numpy(mean)) / torch.from_numpy(std)
    aug = Augmentation(mean=mean, std=std, transform="flamby_isic", size=20)
    assert aug
    out = augment_batch(standardised, _gen(9), aug)
    expect = (fi.flamby_isic(pixels, _gen(9), 20) - torch.from_numpy(mean)) / torch.from_numpy(std)
    torch.testing.assert_close(out, expect, atol=1e-5, rtol=0)


def _cfg(root: Path, **kw) -> DataConfig:
    return DataConfig(dataset="fed_isic2019", partition="given", root=str(root), image_size=16, **kw)


def test_isic_keeps_a_crop_margin_for_the_policy(tmp_path: Path) -> None:
    write_isic(tmp_path, per_split=(2, 1))
    plain = build_federation(_cfg(tmp_path), seed=0)
    fed = build_federation(_cfg(tmp_path, augment_policy="flamby_isic"), seed=0)
    side = fed_isic2019.train_side(16)
    assert side == 18 and fed.input_shape == (3, 16, 16)
    assert isinstance(fed.augment, Augmentation) and (fed.augment.transform, fed.augment.size) == ("flamby_isic", 16)
    assert not plain.augment
    for mine, theirs in zip(fed.clients, plain.clients):
        assert mine.train.x.data.shape[1:] == (3, side, side) and mine.train.x.shape[1:] == (3, 16, 16)
        # read without augmentation: the centre crop, exactly the plain (test) cut
        torch.testing.assert_close(mine.train.x[:], theirs.train.x[:], atol=0, rtol=0)
        assert mine.test.x.data.shape[1:] == (3, 16, 16)
    batch = augment_batch(fed.clients[0].train.x.full(torch.arange(2)), _gen(), fed.augment)
    assert batch.shape == (2, 3, 16, 16)


def test_policy_is_refused_on_other_data_sets() -> None:
    with pytest.raises(ConfigError, match="augment_policy"):
        build_federation(DataConfig(dataset="digits", augment_policy="flamby_isic"), seed=0)
