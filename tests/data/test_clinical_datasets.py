"""Fed-ISIC2019 and RxRx1 read from generated files in their published layouts: clients, splits,
classes, pixel values, and one line for each broken piece."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedlatent.config import DataConfig
from fedlatent.data.datasets import fed_isic2019, rxrx1
from fedlatent.data.compact import uint8_channel_stats
from fedlatent.data.federation import build_federation
from fedlatent.errors import DataError
from tests.data.clinical_files import ISIC_COLUMNS, RXRX1_COLUMNS, write_csv, write_isic, write_rxrx1

SIZE = 16


def _cfg(name: str, root: Path, **kw) -> DataConfig:
    return DataConfig(dataset=name, partition="given", root=str(root), image_size=SIZE, **kw)


def _resized(path: Path) -> np.ndarray:
    """The file's pixels resized bilinearly to SIZE×SIZE, float in [0, 1], C×H×W (3 channels)."""
    img = Image.open(path).convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    return np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0


def test_isic_clients_are_centers_with_flamby_split(tmp_path: Path) -> None:
    rows = write_isic(tmp_path, per_split=(3, 2))
    fed = build_federation(_cfg("fed_isic2019", tmp_path), seed=0)
    assert len(fed.clients) == 6 and fed.num_classes == 8 and fed.input_shape == (3, SIZE, SIZE)
    for center, client in enumerate(fed.clients):
        own = [r for r in rows if r["center"] == center]
        for split, data in (("train", client.train), ("test", client.test)):
            chosen = [r for r in own if r["fold"] == split]
            assert data.y.tolist() == [r["target"] for r in chosen]
        first = next(r for r in own if r["fold"] == "train")
        path = tmp_path / "ISIC_2019_Training_Input_preprocessed" / f"{first['image']}.jpg"
        crop = fed_isic2019.read_centre_crop(path, SIZE).astype(np.float32) / 255.0
        expect = (crop - fed_isic2019.IMAGENET_MEAN[:, None, None]) / fed_isic2019.IMAGENET_STD[:, None, None]
        np.testing.assert_allclose(client.train.x[0].numpy(), expect, atol=1e-5)
        assert client.val is None
    assert len(fed.test) == 6 * 2  # the union of the centers' test splits


@pytest.mark.parametrize("width, height", [(448, 224), (224, 448), (896, 448)])
def test_isic_images_are_cut_as_flambys_centre_crop(tmp_path: Path, width: int, height: int) -> None:
    """A red centre square (the shorter side's size) between blue bands: the 200 crop of the
    shorter side 224 lies inside the red, whatever the orientation and scale."""
    img = np.zeros((height, width, 3), dtype=np.uint8)
    img[..., 2] = 255
    side = min(width, height)
    top, left = (height - side) // 2, (width - side) // 2
    img[top:top + side, left:left + side] = (255, 0, 0)
    Image.fromarray(img).save(tmp_path / "a.png")
    crop = fed_isic2019.read_centre_crop(tmp_path / "a.png", 200)
    assert crop.shape == (3, 200, 200)
    assert (crop[0] >= 250).all() and (crop[2] <= 5).all()
    smaller = fed_isic2019.read_centre_crop(tmp_path / "a.png", 50)  # shorter side 56, crop 50: still inside
    assert smaller.shape == (3, 50, 50) and (smaller[0] >= 250).all() and (smaller[2] <= 5).all()


def test_isic_without_normalisation_keeps_unit_range(tmp_path: Path) -> None:
    write_isic(tmp_path, per_split=(1, 1))
    fed = build_federation(_cfg("fed_isic2019", tmp_path, normalize=False), seed=0)
    x = fed.clients[0].train.x[:]
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0


def _edit_csv(path: Path, columns: list[str], edit) -> None:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    edit(rows)
    write_csv(path, columns, rows)


@pytest.mark.parametrize("breakage, message", [
    (lambda root: (root / "train_test_split").unlink(), "train_test_split"),
    (lambda root: write_csv(root / "train_test_split", ["image", "target", "fold"], [{"image": "a", "target": 0,
                                                                                      "fold": "train"}]), "center"),
    (lambda root: (root / "ISIC_2019_Training_Input_preprocessed" / "ISIC_0000004.jpg").unlink(), "ISIC_0000004.jpg"),
    (lambda root: _edit_csv(root / "train_test_split", ISIC_COLUMNS,
                            lambda rows: rows[0].update(center="7")), "center '7'"),
    (lambda root: _edit_csv(root / "train_test_split", ISIC_COLUMNS,
                            lambda rows: rows[0].update(fold="val")), "fold 'val'"),
    (lambda root: _edit_csv(root / "train_test_split", ISIC_COLUMNS,
                            lambda rows: rows.__setitem__(slice(None), [r for r in rows if r["center"] != "5"])),
     "center 5"),
])
def test_isic_errors_name_the_broken_piece(tmp_path: Path, breakage, message: str) -> None:
    write_isic(tmp_path, per_split=(1, 1))
    breakage(tmp_path)
    with pytest.raises(DataError, match=message.replace(".", r"\.")):
        build_federation(_cfg("fed_isic2019", tmp_path), seed=0)


def test_rxrx1_clients_classes_and_channels(tmp_path: Path) -> None:
    rows = write_rxrx1(tmp_path)
    fed = build_federation(_cfg("rxrx1", tmp_path, normalize=False), seed=0)
    assert len(fed.clients) == 4 and fed.num_classes == 50
    for cell, client in zip(rxrx1.CELL_TYPES, fed.clients):
        for split, data in (("train", client.train), ("test", client.test)):
            kept = [r for r in rows if r["cell_type"] == cell and r["dataset"] == split and r["sirna_id"] < 50]
            assert data.y.tolist() == [r["sirna_id"] for r in kept]  # ids 0..49 sorted → class = id
        row = next(r for r in rows if r["cell_type"] == cell and r["dataset"] == "train")
        folder = tmp_path / "images" / row["experiment"] / f"Plate{row['plate']}"
        for c in range(3):
            expect = _resized(folder / f"{row['well']}_s{row['site']}_w{c + 1}.png")[0]
            np.testing.assert_allclose(client.train.x[0, c].numpy(), expect, atol=1e-6)


def test_rxrx1_normalised_with_training_statistics(tmp_path: Path) -> None:
    write_rxrx1(tmp_path)
    fed = build_federation(_cfg("rxrx1", tmp_path), seed=0)
    train = np.concatenate([c.train.x[:].numpy() for c in fed.clients]).astype(np.float64)
    np.testing.assert_allclose(train.mean(axis=(0, 2, 3)), 0.0, atol=1e-4)
    np.testing.assert_allclose(train.std(axis=(0, 2, 3)), 1.0, atol=1e-3)


def test_top_classes_count_over_all_rows_ties_by_smaller_id() -> None:
    ids = [str(i) for i in range(60)] + [str(i) for i in range(10, 50)] + ["59"]
    # 10..49 and 59 twice; then the tie among the once-seen 0..9, 50..58 goes to the smaller ids 0..8
    assert rxrx1.top_classes(ids) == [str(i) for i in [*range(0, 9), *range(10, 50), 59]]


def test_chunked_channel_stats_equal_float64_reference() -> None:
    rng = np.random.default_rng(0)
    sets = [rng.integers(0, 256, (300, 3, 4, 5), dtype=np.uint8), rng.integers(0, 256, (7, 3, 4, 5), dtype=np.uint8)]
    whole = np.concatenate(sets).astype(np.float64) / 255.0
    mean, std = uint8_channel_stats(sets)
    np.testing.assert_allclose(mean, whole.mean(axis=(0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(std, whole.std(axis=(0, 2, 3)), rtol=1e-5)


@pytest.mark.parametrize("breakage, message", [
    (lambda root: (root / "metadata.csv").unlink(), "metadata.csv"),
    (lambda root: _edit_csv(root / "metadata.csv", [c for c in RXRX1_COLUMNS if c != "sirna_id"],
                            lambda rows: [r.pop("sirna_id") for r in rows]), "sirna_id"),
    (lambda root: (root / "images" / "HUVEC-01" / "Plate1" / "B000_s1_w2.png").unlink(), "B000_s1_w2.png"),
    (lambda root: _edit_csv(root / "metadata.csv", RXRX1_COLUMNS,
                            lambda rows: rows[0].update(cell_type="HeLa")), "cell_type 'HeLa'"),
    (lambda root: _edit_csv(root / "metadata.csv", RXRX1_COLUMNS,
                            lambda rows: rows.__setitem__(slice(None), [r for r in rows if int(r["sirna_id"]) < 49])),
     "49 distinct sirna_id"),
])
def test_rxrx1_errors_name_the_broken_piece(tmp_path: Path, breakage, message: str) -> None:
    write_rxrx1(tmp_path)
    breakage(tmp_path)
    with pytest.raises(DataError, match=message.replace(".", r"\.")):
        build_federation(_cfg("rxrx1", tmp_path), seed=0)
