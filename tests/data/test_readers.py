"""The dataset readers on tiny files written in exactly the published on-disk formats."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedlatent.data.readers import (read_cifar10, read_cifar100, read_domains, read_ham10000, read_stl10,
                                    read_tinyimagenet)
from fedlatent.errors import DataError


def _pickle(path: Path, obj: object) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=2))


def _solid(path: Path, color: tuple[int, int, int], size: tuple[int, int], mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).convert(mode).save(path)


# ---------------------------------------------------------------- CIFAR

def _cifar10(root: Path, rng: np.random.Generator, per_batch: int = 2) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        _pickle(folder / name, {b"batch_label": name.encode(), b"data": data,
                                b"labels": [int(v) for v in rng.integers(0, 10, per_batch)],
                                b"filenames": [b"x.png"] * per_batch})
    _pickle(folder / "batches.meta", {b"label_names": [f"c{i}".encode() for i in range(10)],
                                      b"num_cases_per_batch": per_batch, b"num_vis": 3072})
    return folder


def test_cifar10_shapes_labels_and_plane_order(tmp_path: Path) -> None:
    folder = _cifar10(tmp_path, np.random.default_rng(0))
    batch = pickle.loads((folder / "data_batch_2").read_bytes(), encoding="bytes")
    batch[b"data"][1, 1024 + 5 * 32 + 7] = 201  # green plane, row 5, column 7 of image 1
    batch[b"labels"][1] = 9
    _pickle(folder / "data_batch_2", batch)

    train, test = read_cifar10(tmp_path)
    assert train.x.shape == (10, 3, 32, 32) and train.x.dtype == np.uint8
    assert test.x.shape == (2, 3, 32, 32) and train.y.dtype == np.int64
    assert train.x[3, 1, 5, 7] == 201 and train.y[3] == 9  # batch 2 follows batch 1's two images
    np.testing.assert_array_equal(train.x[2:4].reshape(2, -1), batch[b"data"])
    assert train.class_names == [f"c{i}" for i in range(10)] and train.domain is None
    np.testing.assert_array_equal(read_cifar10(folder)[1].x, test.x)  # the folder itself works too


def test_cifar10_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cifar-10-batches-py.*data.root"):
        read_cifar10(tmp_path)
    folder = _cifar10(tmp_path, np.random.default_rng(1))
    _pickle(folder / "data_batch_3", {b"labels": [0, 1]})
    with pytest.raises(DataError, match=r"data_batch_3.*b'data'"):
        read_cifar10(tmp_path)
    (folder / "data_batch_3").write_bytes((folder / "data_batch_4").read_bytes()[:100])
    with pytest.raises(DataError, match="data_batch_3 is not a readable pickle"):
        read_cifar10(tmp_path)
    (folder / "data_batch_3").unlink()
    with pytest.raises(DataError, match="'data_batch_3'"):
        read_cifar10(tmp_path)
    _pickle(folder / "data_batch_3", {b"data": np.zeros((2, 1024), np.uint8), b"labels": [0, 1]})
    with pytest.raises(DataError, match="expected uint8 N×3072"):
        read_cifar10(tmp_path)
    _pickle(folder / "data_batch_3", {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]})
    with pytest.raises(DataError, match="labels outside 0..9"):
        read_cifar10(tmp_path)


def test_cifar100_fine_labels(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    data = np.arange(3 * 3072, dtype=np.int64).reshape(3, 3072).astype(np.uint8)
    for name in ("train", "test"):
        _pickle(folder / name, {b"data": data, b"fine_labels": [0, 57, 99], b"coarse_labels": [0, 1, 19]})
    _pickle(folder / "meta", {b"fine_label_names": [f"f{i}".encode() for i in range(100)],
                              b"coarse_label_names": [f"k{i}".encode() for i in range(20)]})
    train, test = read_cifar100(folder)
    assert train.x.shape == (3, 3, 32, 32) and test.y.tolist() == [0, 57, 99]
    assert train.x[2, 2, 31, 31] == data[2, 3071] and train.x[0, 0, 0, 1] == data[0, 1]
    assert train.class_names[57] == "f57" and len(train.class_names) == 100
    (folder / "meta").unlink()
    assert read_cifar100(tmp_path)[0].class_names[:3] == ["0", "1", "2"]  # meta is optional
    with pytest.raises(DataError, match="cifar-100-python"):
        read_cifar100(tmp_path / "nowhere")


# ---------------------------------------------------------------- STL-10

def _stl10(root: Path, images: dict[str, np.ndarray], labels: dict[str, list[int]]) -> Path:
    """Write images given as N×3×96×96 (channel, row, column) in STL-10's column-major order."""
    folder = root / "stl10_binary"
    folder.mkdir(parents=True)
    for split in images:
        column_major = np.ascontiguousarray(images[split].transpose(0, 1, 3, 2))
        (folder / f"{split}_X.bin").write_bytes(column_major.tobytes())
        (folder / f"{split}_y.bin").write_bytes(bytes(labels[split]))
    return folder


def test_stl10_column_major_and_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    images = {s: rng.integers(0, 256, (n, 3, 96, 96), dtype=np.uint8) for s, n in (("train", 2), ("test", 3))}
    folder = _stl10(tmp_path, images, {"train": [1, 10], "test": [3, 3, 7]})
    raw = bytearray((folder / "train_X.bin").read_bytes())
    raw[96 * 96 * 3 + 2 * 96 * 96 + 5 * 96 + 2] = 17  # image 1, blue channel, column 5, row 2
    (folder / "train_X.bin").write_bytes(bytes(raw))
    (folder / "class_names.txt").write_text("\n".join(f"n{i}" for i in range(10)) + "\n")

    train, test = read_stl10(tmp_path)
    assert train.x.shape == (2, 3, 96, 96) and train.x.dtype == np.uint8 and train.x.flags.c_contiguous
    assert train.x[1, 2, 2, 5] == 17
    np.testing.assert_array_equal(test.x, images["test"])
    assert train.y.tolist() == [0, 9] and test.y.tolist() == [2, 2, 6] and test.y.dtype == np.int64
    assert train.class_names[9] == "n9"
    (folder / "class_names.txt").unlink()
    assert read_stl10(folder)[0].class_names == [str(i) for i in range(10)]


def test_stl10_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="stl10_binary.*train_X.bin"):
        read_stl10(tmp_path)
    images = {s: np.zeros((2, 3, 96, 96), np.uint8) for s in ("train", "test")}
    folder = _stl10(tmp_path, images, {"train": [1, 2], "test": [1, 2]})
    (folder / "test_X.bin").write_bytes((folder / "test_X.bin").read_bytes()[:-1])
    with pytest.raises(DataError, match="test_X.bin.*truncated"):
        read_stl10(tmp_path)
    (folder / "test_X.bin").write_bytes(bytes(2 * 3 * 96 * 96))
    (folder / "test_y.bin").write_bytes(bytes([1]))
    with pytest.raises(DataError, match="test_y.bin has 1 labels"):
        read_stl10(tmp_path)
    (folder / "test_y.bin").write_bytes(bytes([0, 1]))
    with pytest.raises(DataError, match="outside 1..10"):
        read_stl10(tmp_path)
    (folder / "test_y.bin").unlink()
    with pytest.raises(DataError, match="'test_y.bin'"):
        read_stl10(tmp_path)


# ---------------------------------------------------------------- Tiny-ImageNet

def _tinyimagenet(root: Path) -> Path:
    folder = root / "tiny-imagenet-200"
    wnids = ["n02", "n01"]  # wnids.txt order, not sorted order, fixes the labels
    folder.mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    _solid(folder / "train/n02/images/n02_0.JPEG", (250, 0, 0), (64, 64))
    _solid(folder / "train/n02/images/n02_1.JPEG", (200, 200, 200), (64, 64), mode="L")  # grayscale
    _solid(folder / "train/n01/images/n01_0.JPEG", (0, 0, 250), (64, 64))
    (folder / "train/n01/n01_boxes.txt").write_text("n01_0.JPEG\t0\t0\t63\t63\n")
    _solid(folder / "val/images/val_0.JPEG", (0, 250, 0), (64, 64))
    _solid(folder / "val/images/val_1.JPEG", (250, 0, 0), (64, 64))
    (folder / "val/val_annotations.txt").write_text("val_0.JPEG\tn01\t0\t3\t60\t62\nval_1.JPEG\tn02\t1\t1\t9\t9\n")
    return folder


def test_tinyimagenet_train_and_val(tmp_path: Path) -> None:
    _tinyimagenet(tmp_path)
    train, val = read_tinyimagenet(tmp_path)
    assert train.x.shape == (3, 3, 64, 64) and train.x.dtype == np.uint8
    assert train.class_names == ["n02", "n01"] and train.y.tolist() == [0, 0, 1]
    assert val.y.tolist() == [1, 0] and val.x.shape == (2, 3, 64, 64)
    assert abs(int(train.x[1, 0].mean()) - 200) <= 2 and abs(int(train.x[1, 2].mean()) - 200) <= 2  # L → RGB
    assert int(val.x[0, 1].mean()) > 240 and int(val.x[0, 0].mean()) < 10  # green image, JPEG-approximate


def test_tinyimagenet_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="tiny-imagenet-200.*wnids.txt"):
        read_tinyimagenet(tmp_path)
    folder = _tinyimagenet(tmp_path)
    (folder / "val/images/val_1.JPEG").unlink()
    with pytest.raises(DataError, match="lists val_1.JPEG"):
        read_tinyimagenet(folder)
    (folder / "val/val_annotations.txt").write_text("val_0.JPEG\tn99\t0\t0\t1\t1\n")
    with pytest.raises(DataError, match="line 1"):
        read_tinyimagenet(folder)
    (folder / "val/images/val_0.JPEG").write_bytes(b"not a jpeg")
    (folder / "val/val_annotations.txt").write_text("val_0.JPEG\tn01\t0\t0\t1\t1\n")
    with pytest.raises(DataError, match="cannot read the image .*val_0.JPEG"):
        read_tinyimagenet(folder)


# ---------------------------------------------------------------- domain folders (PACS, Office-Home)

def test_domains_union_of_classes_and_domain_index(tmp_path: Path) -> None:
    _solid(tmp_path / "sketch/dog/b.png", (10, 20, 30), (20, 12))
    _solid(tmp_path / "sketch/dog/a.jpg", (200, 200, 200), (9, 9))
    _solid(tmp_path / "sketch/horse/h.PNG", (1, 2, 3), (8, 8), mode="RGBA")
    _solid(tmp_path / "art_painting/dog/d.png", (40, 50, 60), (30, 30), mode="P")
    _solid(tmp_path / "art_painting/cat/c.png", (70, 80, 90), (5, 7))
    (tmp_path / "art_painting/cat/notes.txt").write_text("not an image")
    (tmp_path / ".hidden").mkdir()

    data = read_domains(tmp_path, image_size=8)
    assert data.domain_names == ["art_painting", "sketch"] and data.class_names == ["cat", "dog", "horse"]
    assert data.x.shape == (5, 3, 8, 8) and data.x.dtype == np.uint8
    assert data.y.tolist() == [0, 1, 1, 1, 2] and data.y.dtype == np.int64
    assert data.domain is not None and data.domain.tolist() == [0, 0, 1, 1, 1]
    assert data.x[0, :, 4, 4].tolist() == [70, 80, 90]
    assert data.x[3, :, 0, 0].tolist() == [10, 20, 30]  # sketch/dog/b.png: a.jpg sorts before it
    assert data.x[4, :, 7, 7].tolist() == [1, 2, 3]  # sketch/horse, RGBA → RGB, PNG exact


def test_domains_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="expected domain folders.*PACS"):
        read_domains(tmp_path / "missing", image_size=8)
    with pytest.raises(DataError, match="expected domain folders"):
        read_domains(tmp_path, image_size=8)
    (tmp_path / "photo/dog").mkdir(parents=True)
    with pytest.raises(DataError, match="photo holds no images"):
        read_domains(tmp_path, image_size=8)
    (tmp_path / "photo/dog/x.jpg").write_bytes(b"\xff\xd8 garbage")
    with pytest.raises(DataError, match="cannot read the image .*x.jpg"):
        read_domains(tmp_path, image_size=8)


# ---------------------------------------------------------------- HAM10000

_HEADER = "lesion_id,image_id,dx,dx_type,age,sex,localization,dataset\n"


def _ham10000(root: Path) -> None:
    rows = [("HAM_1", "ISIC_0000001", "vasc", "rosendahl"), ("HAM_2", "ISIC_0000002", "akiec", "vidir_modern"),
            ("HAM_3", "ISIC_0000003", "nv", "rosendahl"), ("HAM_4", "ISIC_0000004", "mel", "vienna_dias")]
    lines = [f"{lesion},{image},{dx},histo,55.0,male,back,{dataset}\n" for lesion, image, dx, dataset in rows]
    (root / "HAM10000_metadata.csv").write_text(_HEADER + "".join(lines))
    _solid(root / "HAM10000_images_part_1/ISIC_0000001.jpg", (255, 0, 0), (60, 45))
    _solid(root / "HAM10000_images_part_2/ISIC_0000002.jpg", (0, 255, 0), (60, 45))
    _solid(root / "ISIC_0000003.jpg", (0, 0, 255), (60, 45))
    _solid(root / "images/ISIC_0000004.jpg", (255, 255, 255), (60, 45))


def test_ham10000_labels_domains_and_image_folders(tmp_path: Path) -> None:
    _ham10000(tmp_path)
    data = read_ham10000(tmp_path, image_size=16)
    assert data.class_names == ["akiec", "bcc", "bkl", "df", "mel", "nv", "vasc"]
    assert data.y.tolist() == [6, 0, 5, 4] and data.y.dtype == np.int64
    assert data.domain_names == ["rosendahl", "vidir_modern", "vienna_dias"]
    assert data.domain is not None and data.domain.tolist() == [0, 1, 0, 2]
    assert data.x.shape == (4, 3, 16, 16) and data.x.dtype == np.uint8
    assert int(data.x[0, 0].mean()) > 245 and int(data.x[2, 2].mean()) > 245 and int(data.x[2, 0].mean()) < 10


def test_ham10000_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="HAM10000_metadata.csv.*data.root"):
        read_ham10000(tmp_path, image_size=16)
    _ham10000(tmp_path)
    (tmp_path / "images/ISIC_0000004.jpg").unlink()
    with pytest.raises(DataError, match="ISIC_0000004.jpg is listed"):
        read_ham10000(tmp_path, image_size=16)
    csv_path = tmp_path / "HAM10000_metadata.csv"
    csv_path.write_text("lesion_id,image_id,dx_type\nHAM_1,ISIC_0000001,histo\n")
    with pytest.raises(DataError, match="lacks the column.*dx, dataset"):
        read_ham10000(tmp_path, image_size=16)
    csv_path.write_text(_HEADER + "HAM_1,ISIC_0000001,melanoma,histo,50,male,back,rosendahl\n")
    with pytest.raises(DataError, match="'melanoma'"):
        read_ham10000(tmp_path, image_size=16)
    csv_path.write_text(_HEADER)
    with pytest.raises(DataError, match="lists no images"):
        read_ham10000(tmp_path, image_size=16)
