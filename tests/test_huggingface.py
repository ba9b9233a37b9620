"""``data.dataset = "huggingface"``: datasets made here with the ``datasets`` library (random PNG
images, ClassLabel or integer labels, tabular arrays), written with ``save_to_disk`` and as parquet
files in the Hub's layouts, read back pixel for pixel, partitioned and run end to end; the bad
inputs are cases of the bad-input corpus (tests/test_bad_input.py) and the missing package here."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

datasets = pytest.importorskip("datasets")

import fedlatent  # noqa: E402
from fedlatent import load_config  # noqa: E402
from fedlatent.cli import main  # noqa: E402
from fedlatent.config import DataConfig  # noqa: E402
from fedlatent.data.federation import build_federation  # noqa: E402
from fedlatent.data.readers.huggingface import read_huggingface  # noqa: E402
from fedlatent.data.registry import DATASETS  # noqa: E402
from fedlatent.data.sources import Pool  # noqa: E402
from fedlatent.errors import ConfigError, DataError  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_figures")
datasets.disable_progress_bars()  # save_to_disk and to_parquet would draw bars on stderr

NAMES = ["zebra", "ant", "moth"]  # a ClassLabel's order, not sorted: the labels keep it
LAYOUTS = ["disk", "parquet"]


def pixels(n: int, seed: int, mode: str = "RGB", size: tuple[int, int] = (8, 8)) -> list[np.ndarray]:
    """``n`` random uint8 images, H×W×3 (RGB) or H×W (L)."""
    rng = np.random.default_rng(seed)
    shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
    return [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(n)]


def chw(images: list[np.ndarray]) -> np.ndarray:
    return np.stack([p[None] if p.ndim == 2 else p.transpose(2, 0, 1) for p in images])


def save(root: Path, layout: str, splits: dict[str, dict[str, list]], features: Any = "classlabel") -> Path:
    """Write ``splits`` = {split: {column: values}} (numpy images become datasets.Image PNGs) as
    ``layout``: "disk" (DatasetDict.save_to_disk), "dataset" (the first split alone, Dataset.save_to_disk),
    "parquet" (data/<split>-00000-of-00001.parquet, the Hub's), "parquet-flat" (<split>-….parquet)
    or "parquet-folders" (<split>/0000.parquet). ``features``: "classlabel" (image + ClassLabel label),
    None (inferred) or datasets.Features."""
    if features == "classlabel":
        features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES)})
    made = {}
    for split, columns in splits.items():
        columns = {c: [Image.fromarray(v) if isinstance(v, np.ndarray) and v.dtype == np.uint8 else v for v in values]
                   for c, values in columns.items()}
        made[split] = datasets.Dataset.from_dict(columns, features=features)
    if layout == "disk":
        datasets.DatasetDict(made).save_to_disk(str(root))
    elif layout == "dataset":
        next(iter(made.values())).save_to_disk(str(root))
    else:
        for split, ds in made.items():
            path = {"parquet": root / "data" / f"{split}-00000-of-00001.parquet",
                    "parquet-flat": root / f"{split}-00000-of-00001.parquet",
                    "parquet-folders": root / split / "0000.parquet"}[layout]
            path.parent.mkdir(parents=True, exist_ok=True)
            ds.to_parquet(str(path))
    return root


def standard(root: Path, layout: str = "parquet", **change: Any) -> Path:
    """3 classes × 20 train and × 5 test images of 8×8 (RGB, ClassLabel), with ``change`` applied
    to both splits' columns (None removes a column)."""
    splits = {}
    for split, per_class, seed in (("train", 20, 0), ("test", 5, 1)):
        n = 3 * per_class
        columns: dict[str, list] = {"image": pixels(n, seed), "label": [k % 3 for k in range(n)]}
        for key, value in change.items():
            if value is None:
                columns.pop(key)
            else:
                columns[key] = value(n) if callable(value) else value
        splits[split] = columns
    features = "classlabel" if not change else None
    return save(root, layout, splits, features)


def _pool(root: Path, **data: Any) -> Pool:
    own = {k: data.pop(k) for k in ("image_column", "label_column", "train_split", "test_split") if k in data}
    return DATASETS.get("huggingface").build(DataConfig(dataset="huggingface", root=str(root), options=own, **data), 0)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Any]:
    """The standard dataset in both layouts, with what was written."""
    base = tmp_path_factory.mktemp("hf")
    return {"disk": standard(base / "disk", "disk"), "parquet": standard(base / "parquet", "parquet"),
            "x": {"train": chw(pixels(60, 0)), "test": chw(pixels(15, 1))},
            "y": {"train": [k % 3 for k in range(60)], "test": [k % 3 for k in range(15)]}}


# ------------------------------------------------------------ reading


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_images_and_labels_come_back_exactly(written: dict, layout: str) -> None:
    train, test = read_huggingface(written[layout])
    assert test is not None
    for got, split in ((train, "train"), (test, "test")):
        assert got.x.dtype == np.uint8 and got.x.shape == (len(written["y"][split]), 3, 8, 8)
        np.testing.assert_array_equal(got.x, written["x"][split])  # PNG: pixel-exact
        assert got.y.dtype == np.int64 and got.y.tolist() == written["y"][split]
        assert got.class_names == NAMES                              # the ClassLabel's names, in its order
    pool = _pool(written[layout])
    assert pool.num_classes == 3
    np.testing.assert_array_equal(pool.test_x, written["x"]["test"])


@pytest.mark.parametrize("layout", ["parquet-flat", "parquet-folders"])
def test_the_other_parquet_layouts_name_their_splits(tmp_path: Path, layout: str) -> None:
    train, test = read_huggingface(standard(tmp_path, layout))
    assert test is not None and (len(train.y), len(test.y)) == (60, 15)
    np.testing.assert_array_equal(train.x, chw(pixels(60, 0)))


def test_greyscale_images_keep_one_channel_and_a_colour_one_makes_all_rgb(tmp_path: Path) -> None:
    grey = pixels(6, 3, "L")
    train, _ = read_huggingface(save(tmp_path / "grey", "parquet", {"train": {"image": grey, "label": [0, 1] * 3}}))
    assert train.x.shape == (6, 1, 8, 8)
    np.testing.assert_array_equal(train.x, chw(grey))
    colour = pixels(1, 4)
    mixed = grey[:3] + colour + grey[3:]   # a colour image after greyscale ones
    train, _ = read_huggingface(save(tmp_path / "mixed", "parquet", {"train": {"image": mixed, "label": [0] * 7}}))
    assert train.x.shape == (7, 3, 8, 8)
    np.testing.assert_array_equal(train.x[3], colour[0].transpose(2, 0, 1))
    for i in (0, 2, 4, 6):                 # the grey ones as RGB conversion gives them: the value thrice
        g = mixed[i]
        np.testing.assert_array_equal(train.x[i], np.stack([g, g, g]))


def test_a_grey_test_split_beside_an_rgb_train_split_becomes_rgb(tmp_path: Path) -> None:
    grey = pixels(3, 5, "L")
    root = save(tmp_path, "disk", {"train": {"image": pixels(3, 6), "label": [0, 1, 2]},
                                   "test": {"image": grey, "label": [0, 1, 2]}})
    train, test = read_huggingface(root)
    assert test is not None and train.x.shape[1:] == test.x.shape[1:] == (3, 8, 8)
    np.testing.assert_array_equal(test.x, np.repeat(chw(grey), 3, axis=1))


def test_image_size_resizes_as_the_image_folder_reader_does(tmp_path: Path) -> None:
    sizes = [(8, 8), (10, 6), (12, 12)]  # sizes and aspect ratios differ: fine once a size is given
    images = [pixels(1, 7 + i, size=s)[0] for i, s in enumerate(sizes)]
    root = save(tmp_path, "parquet", {"train": {"image": images, "label": [0, 1, 2]}})
    train, _ = read_huggingface(root, image_size=9)
    expected = [np.asarray(Image.fromarray(p).resize((9, 9), Image.Resampling.BILINEAR)) for p in images]
    np.testing.assert_array_equal(train.x, chw(expected))
    with pytest.raises(DataError, match="row 1: the image is 10×6 but the images before it are 8×8"):
        read_huggingface(root)


def test_integer_labels_give_classes_0_to_k(tmp_path: Path) -> None:
    root = standard(tmp_path, label=lambda n: [k % 4 for k in range(n)])  # a plain int64 column
    train, test = read_huggingface(root)
    assert train.class_names == ["0", "1", "2", "3"] and test is not None
    assert train.y.tolist() == [k % 4 for k in range(60)]
    assert _pool(root).num_classes == 4


def test_columns_are_found_by_name_or_type_and_named_ones_win(tmp_path: Path) -> None:
    rgb = pixels(4, 8)
    features = datasets.Features({"picture": datasets.Image(), "kind": datasets.ClassLabel(names=["a", "b"]),
                                  "id": datasets.Value("int64")})
    root = save(tmp_path / "typed", "parquet", {"train": {"picture": rgb, "kind": [1, 0, 1, 0], "id": [9, 8, 7, 6]}},
                features)
    train, _ = read_huggingface(root)  # the only Image column, the only ClassLabel column (not "id")
    assert train.y.tolist() == [1, 0, 1, 0] and train.class_names == ["a", "b"]
    np.testing.assert_array_equal(train.x, chw(rgb))
    root = save(tmp_path / "named", "parquet", {"train": {"img": rgb, "labels": [0, 1, 2, 3], "other": rgb}},
                None)
    train, _ = read_huggingface(root)
    assert train.y.tolist() == [0, 1, 2, 3]
    assert read_huggingface(root, image_column="other", label_column="labels")[0].x.shape == (4, 3, 8, 8)


def test_numeric_array_columns_are_tabular_features(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    rows = {s: rng.normal(size=(n, 5)).astype(np.float32) for s, n in (("train", 30), ("test", 9))}
    root = save(tmp_path, "disk", {s: {"features": list(x), "label": [k % 3 for k in range(len(x))]}
                                   for s, x in rows.items()}, None)
    pool = _pool(root, image_column="features")
    assert pool.x.dtype == np.float32 and pool.test_x is not None
    np.testing.assert_array_equal(pool.x, rows["train"])
    np.testing.assert_array_equal(pool.test_x, rows["test"])
    cfg = load_config(None, ["data.dataset='huggingface'", f"data.root='{root}'", "data.image_column='features'",
                             "data.num_clients=2", "model.hidden=[8]", "train.rounds=1"])
    federation = build_federation(cfg.data, 0)
    assert federation.input_shape == (5,) and sum(len(c.train) for c in federation.clients) == 30


def test_without_a_test_split_a_seeded_fraction_is_held_out(tmp_path: Path) -> None:
    """A lone save_to_disk Dataset is the train split; data.test_split = '' also holds out."""
    lone = save(tmp_path / "lone", "dataset", {"train": {"image": pixels(30, 2), "label": [k % 3 for k in range(30)]}})
    both = standard(tmp_path / "both", "disk")
    for root, extra in ((lone, []), (both, ["data.test_split=''"])):
        assert _pool(root, **({"test_split": ""} if extra else {})).test_x is None
        cfg = load_config(None, ["data.dataset='huggingface'", f"data.root='{root}'", "data.test_fraction=0.2",
                                 "data.num_clients=2", *extra])
        federation = build_federation(cfg.data, 0)
        n = 30 if root == lone else 60
        assert federation.test is not None and len(federation.test) == round(0.2 * n)  # stratified: 2 or 4 per class
        assert np.bincount(federation.test.y.numpy()).tolist() == [round(0.2 * n / 3)] * 3
        assert sum(len(c.train) for c in federation.clients) + len(federation.test) == n
        again = build_federation(cfg.data, 0)
        np.testing.assert_array_equal(federation.test.x.data.numpy(), again.test.x.data.numpy())  # seeded


def test_other_splits_are_chosen_by_name(tmp_path: Path) -> None:
    root = save(tmp_path, "parquet-flat", {"train": {"image": pixels(3, 0), "label": [0, 1, 2]},
                                           "validation": {"image": pixels(2, 1), "label": [2, 1]}})
    train, test = read_huggingface(root, test_split="validation")
    assert test is not None and test.y.tolist() == [2, 1]
    assert read_huggingface(root)[1] is None  # no split 'test': held out by the caller
    train, test = read_huggingface(root, train_split="validation", test_split="")
    assert train.y.tolist() == [2, 1] and test is None


def test_decoded_once_then_read_from_the_cache(written: dict, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("FEDLATENT_CACHE_DIR", str(tmp_path / "cache"))
    first = _pool(written["parquet"])
    assert "huggingface: the parquet files in" in capsys.readouterr().err
    from fedlatent.data.readers import huggingface as hf

    def decode(*args, **kwargs):
        raise AssertionError("decoded again")

    monkeypatch.setattr(hf, "read_huggingface", decode)
    second = _pool(written["parquet"])
    assert "read from the cache" in capsys.readouterr().err
    assert isinstance(second.x, np.memmap)
    np.testing.assert_array_equal(first.x, second.x)
    np.testing.assert_array_equal(first.test_x, second.test_x)
    with pytest.raises(AssertionError, match="decoded again"):  # other keys: another entry
        _pool(written["parquet"], image_size=16)


# ------------------------------------------------------------ end to end


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_dirichlet_run_end_to_end(written: dict, layout: str, tmp_path: Path) -> None:
    cfg = load_config(None, ["data.dataset='huggingface'", f"data.root='{written[layout]}'",
                             "data.partition='dirichlet'", "data.num_clients=3", "data.min_size=2",
                             "model.arch='mlp'", "model.hidden=[16]", "train.rounds=2", "train.batch_size=8"])
    summary = fedlatent.run(cfg, tmp_path / "run")
    assert summary["rounds_completed"] == 2 and summary["dataset"] == "huggingface"
    counts = np.array(json.loads((tmp_path / "run" / "partition.json").read_text())["counts"])
    assert counts.shape == (3, 3)
    assert counts.sum(axis=0).tolist() == np.bincount(written["y"]["train"]).tolist()


# ------------------------------------------------------------ bad input (more in tests/test_bad_input.py)


def test_without_the_package_choosing_the_data_set_is_one_line(written: dict, digits_config: Path, tmp_path: Path,
                                                               monkeypatch, capsys) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real(name, *a))
    out = tmp_path / "run"
    assert main(["run", str(digits_config), "--no-progress", "--set", "data.dataset=huggingface",
                 "--set", f"data.root={written['disk']}", "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "pip install 'fedlatent[huggingface]'" in lines[0], lines
    assert not out.exists()


@pytest.mark.parametrize("change,error,message", [
    ({"image_column": "pixels"}, ConfigError, "data.image_column = 'pixels': split 'train' has no such column "
                                              "(its columns: image (Image), label (ClassLabel))"),
    ({"label_column": "label", "image_column": "label"}, ConfigError, "holds ClassLabel, neither images"),
    ({"train_split": "training"}, ConfigError, "data.train_split = 'training': no such split"),
    ({"test_split": "validation"}, ConfigError, "its splits: train, test"),
])
def test_bad_keys_name_what_there_is(written: dict, change: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        read_huggingface(written["disk"], **change)


def test_a_test_split_unlike_the_train_split_is_refused(tmp_path: Path) -> None:
    root = save(tmp_path, "parquet", {"train": {"image": pixels(3, 0), "label": [0, 1, 2]},
                                      "test": {"image": [[0.5, 1.0]] * 3, "label": [0, 1, 2]}}, None)
    with pytest.raises(DataError, match=r"column 'image' holds \w+ in split 'test', not images"):
        read_huggingface(root)
    assert read_huggingface(root, test_split="")[1] is None


def test_ambiguous_columns_are_refused_with_the_list(tmp_path: Path) -> None:
    root = standard(tmp_path, img=lambda n: pixels(n, 3))  # both "image" and "img"
    with pytest.raises(ConfigError, match=re.escape("data.image_column: split 'train' has several candidate columns "
                                                   "(image, img); set data.image_column to one of its columns: "
                                                   "image (Image), label (int64), img (Image)")):
        read_huggingface(root)
