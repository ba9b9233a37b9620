"""Images stay uint8 until the batch: indexing gives the float batch the float pipeline gave,
pools of images (CIFAR-10 here) and the clinical data sets hold 1 byte per pixel-channel, and
resident memory grows by at most 2 bytes per pixel-channel as a data set grows."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlatent.config import DataConfig
from fedlatent.data.compact import Images
from fedlatent.data.federation import build_federation
from fedlatent.data.types import Split
from tests.data.clinical_files import write_isic
from tests.data.test_readers import _cifar10

ROOT = Path(__file__).resolve().parents[2]


def _images(n: int = 5) -> tuple[Images, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (n, 3, 4, 5), dtype=np.uint8)
    mean, std = np.array([0.1, 0.5, 0.9], np.float32), np.array([0.2, 0.3, 0.4], np.float32)
    return Images(torch.from_numpy(raw), mean, std), raw, mean, std


@pytest.mark.parametrize("idx", [torch.tensor([3, 0, 3]), slice(1, 4), 2, (1, 2), (slice(0, 2), 0, 1)])
def test_indexing_standardises_like_the_float_pipeline(idx) -> None:
    images, raw, mean, std = _images()
    reference = (raw.astype(np.float64) / 255.0 - mean[:, None, None]) / std[:, None, None]
    key = idx.numpy() if isinstance(idx, torch.Tensor) else idx
    got = images[idx]
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), reference[key], rtol=1e-5, atol=1e-6)


def test_take_and_concat_stay_compact() -> None:
    images, raw, *_ = _images()
    split = Split(images, torch.arange(5))
    sub = split.subset(np.array([4, 1]))
    assert isinstance(sub.x, Images) and torch.equal(sub.x.data, torch.from_numpy(raw[[4, 1]]))
    both = Split.concat([sub, split])
    assert isinstance(both.x, Images) and len(both) == 7 and torch.equal(both.x[0], split.x[4])
    other = Images(images.data, images.mean.flatten() + 0.1, images.std.flatten(), images.crop)
    with pytest.raises(ValueError, match="statistics or crops differ"):
        Images.concat([images, other])


def test_image_pool_is_uint8_and_standardised_with_training_statistics(tmp_path: Path) -> None:
    _cifar10(tmp_path, np.random.default_rng(0), per_batch=4)
    fed = build_federation(DataConfig(dataset="cifar10", root=str(tmp_path), num_clients=2), seed=0)
    for split in [c.train for c in fed.clients] + [fed.test]:
        assert isinstance(split.x, Images) and split.x.data.dtype == torch.uint8
    train = torch.cat([c.train.x[:] for c in fed.clients]).double()
    np.testing.assert_allclose(train.mean(dim=(0, 2, 3)).numpy(), 0.0, atol=1e-5)
    np.testing.assert_allclose(train.std(dim=(0, 2, 3), unbiased=False).numpy(), 1.0, atol=1e-4)


_PEAK = """
import json, resource, sys, torch
torch.set_num_threads(1)
from fedlatent.config import DataConfig
from fedlatent.data.federation import build_federation
fed = build_federation(DataConfig(dataset="fed_isic2019", partition="given", root=sys.argv[1],
                                  image_size=int(sys.argv[2])), seed=0)
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
"""


@pytest.mark.slow
def test_resident_memory_grows_by_at_most_two_bytes_per_pixel_channel(tmp_path: Path) -> None:
    size, peaks, counts = 160, [], []
    for per_center in (10, 60):
        root = tmp_path / str(per_center)
        write_isic(root, per_split=(per_center, 0))
        out = subprocess.run([sys.executable, "-c", _PEAK, str(root), str(size)], capture_output=True, text=True,
                             check=True, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
        peaks.append(json.loads(out.stdout))
        counts.append(6 * per_center * 3 * size * size)
    per_pixel_channel = (peaks[1] - peaks[0]) / (counts[1] - counts[0])
    assert per_pixel_channel <= 2.0, per_pixel_channel


@pytest.mark.slow
def test_augmentation_statistics_map_compact_batches_back_to_their_pixels(tmp_path: Path) -> None:
    """AutoAugment works in pixel space: on a uint8 (compact) image pool, the run's augmentation
    statistics must undo the per-batch standardisation exactly, and a run with it trains."""
    import fedlatent
    from fedlatent.data.federation import build_federation
    from tests.data.test_readers import _cifar10
    _cifar10(tmp_path, np.random.default_rng(0), per_batch=8)
    overrides = ['data.dataset="cifar10"', f'data.root="{tmp_path}"', "data.num_clients=2", "data.augment=true",
                 'data.autoaugment="cifar10"', 'model.arch="cnn"', "train.rounds=1", "train.batch_size=8"]
    config = fedlatent.load_config(None, overrides)
    federation = build_federation(config.data, config.data_seed)
    images = federation.clients[0].train.x
    assert isinstance(images, Images)
    aug = federation.augment
    pixels = (images[torch.arange(len(images))] * torch.as_tensor(aug.std) + torch.as_tensor(aug.mean)) * 255
    torch.testing.assert_close(pixels, images.data.to(torch.float32), atol=1e-3, rtol=0)
    summary = fedlatent.run(config, tmp_path / "run")
    assert np.isfinite(summary["final"]["loss"])
