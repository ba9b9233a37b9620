"""Hugging Face ``datasets`` on disk: a folder written by ``DatasetDict.save_to_disk`` /
``Dataset.save_to_disk``, or a folder of parquet files (``train-00000-of-00001.parquet``,
``data/train-*.parquet`` as on the Hub, or ``train/*.parquet``; the split is the file name up to its
first ``-``, or the folder's name).

The input column holds images (``datasets.Image``: PNG/JPEG bytes or a file path), decoded to
uint8 C×H×W (one channel when every image is greyscale, else RGB) and resized bilinearly to
``image_size`` when given (else all must be one square size, as in an image-folder tree), or
fixed-length numeric arrays (tabular features, float32). The label column holds integers: a
``ClassLabel`` gives the class names, a plain integer column classes 0..K-1. Splits are named;
a missing test split is None (the caller holds out a test fraction).

>>> train, test = read_huggingface("~/data/mnist-saved")  # doctest: +SKIP
>>> train.class_names  # the ClassLabel's names  # doctest: +SKIP
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from fedlatent.data.types import ImageSet
from fedlatent.errors import ConfigError, DataError

WHAT = "huggingface"
LAYOUTS = {"dict": "the save_to_disk DatasetDict in", "dataset": "the save_to_disk Dataset in",
           "parquet": "the parquet files in"}
_EXPECTED = ("a save_to_disk folder (dataset_dict.json or state.json) nor parquet files "
             "(<split>-*.parquet, data/<split>-*.parquet or <split>/*.parquet)")
_IMAGE_NAMES, _LABEL_NAMES = ("image", "img"), ("label", "labels")
_GREY = frozenset({"1", "L", "LA", "I", "I;16", "F"})  # PIL modes with one grey channel (alpha dropped)


@dataclass
class _Split:
    """One split: its columns (arrow schema), its features (for ClassLabel names), and a reader
    of chosen columns as one arrow table."""

    name: str
    schema: pa.Schema
    features: datasets.Features
    read: Callable[[list[str]], pa.Table]


def layout(root: Path) -> str:
    """Which layout ``root`` holds: a key of :data:`LAYOUTS` (one line naming both otherwise)."""
    if (root / "dataset_dict.json").is_file():
        return "dict"
    if (root / "state.json").is_file():
        return "dataset"
    if _parquet_splits(root):
        return "parquet"
    raise DataError(f"{WHAT}: data.root = '{root}' holds neither {_EXPECTED}")


def read_huggingface(root: Path | str, *, image_column: str = "", label_column: str = "",
                     train_split: str = "train", test_split: str = "test",
                     image_size: int | None = None) -> tuple[ImageSet, ImageSet | None]:
    """(train, test) from the splits named ``train_split`` and ``test_split`` of the dataset at
    ``root``. Columns given as "" are found by name ("image"/"img", "label"/"labels"), else by type.
    test is None when ``test_split`` is "", or is "test" and there is no such split."""
    root = Path(root).expanduser()
    splits = _splits(root, layout(root), train_split)
    if train_split not in splits:
        raise ConfigError(f"data.train_split = '{train_split}': no such split in {root} "
                          f"(its splits: {', '.join(splits)})")
    if test_split and test_split not in splits and test_split != "test":
        raise ConfigError(f"data.test_split = '{test_split}': no such split in {root} "
                          f"(its splits: {', '.join(splits)}; \"\" holds out data.test_fraction)")
    train = splits[train_split]
    x_col = _column(train, image_column, "image_column", _IMAGE_NAMES, "datasets.Image",
                    lambda c: _is_image(train.schema.field(c).type))
    y_col = _column(train, label_column, "label_column", _LABEL_NAMES, "ClassLabel",
                    lambda c: isinstance(train.features.get(c), datasets.ClassLabel))
    images = _is_image(train.schema.field(x_col).type)
    if not images and not _is_numeric_array(train.schema.field(x_col).type):
        raise ConfigError(f"data.image_column = '{x_col}': the column holds {_type(train, x_col)}, neither images "
                          f"(datasets.Image) nor fixed-length numeric arrays")
    if not images and image_size:
        raise ConfigError(f"data.image_size = {image_size}: column '{x_col}' holds numeric arrays, not images")
    names = _class_names(train, y_col)
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    for split in [train] + ([splits[test_split]] if test_split in splits else []):
        size = image_size if image_size or not xs else int(xs[0].shape[-1])  # test: the train images' size
        x, y = _read_split(split, x_col, y_col, images, size, bool(image_size), names, root)
        xs.append(x)
        ys.append(y)
    if len(xs) == 2 and xs[0].shape[1:] != xs[1].shape[1:]:
        if not images:
            raise DataError(f"{WHAT}: column '{x_col}' holds arrays of shape {xs[0].shape[1:]} in split "
                            f"'{train_split}' but {xs[1].shape[1:]} in split '{test_split}'")
        xs = _same_channels(xs)
    names = names or [str(k) for k in range(max(int(y.max()) for y in ys) + 1)]
    sets = [ImageSet(x, y, list(names)) for x, y in zip(xs, ys)]
    return sets[0], sets[1] if len(sets) == 2 else None


def _read_split(split: _Split, x_col: str, y_col: str, images: bool, size: int | None, resize: bool,
                names: list[str], root: Path) -> tuple[np.ndarray, np.ndarray]:
    """One split's inputs (images when ``images``, else numeric arrays) and labels."""
    for column in (x_col, y_col):
        if column not in split.schema.names:
            raise ConfigError(f"{WHAT}: split '{split.name}' has no column '{column}' "
                              f"(its columns: {', '.join(split.schema.names)})")
    x_type = split.schema.field(x_col).type
    if not (_is_image(x_type) if images else _is_numeric_array(x_type)):  # the test split unlike the train one
        kind = "images (datasets.Image)" if images else "fixed-length numeric arrays"
        raise DataError(f"{WHAT}: column '{x_col}' holds {_type(split, x_col)} in split '{split.name}', "
                        f"not {kind} as in the train split")
    table = split.read([x_col, y_col])
    if len(table) == 0:
        raise DataError(f"{WHAT}: split '{split.name}' of {root} has no rows")
    x = _images(table.column(x_col), split.name, size, resize, root) if images else \
        _arrays(table.column(x_col), split.name, x_col)
    return x, _labels(table.column(y_col), split.name, y_col, names)


def _splits(root: Path, kind: str, train_split: str) -> dict[str, _Split]:
    """The splits of the dataset at ``root`` by name (a lone save_to_disk Dataset is ``train_split``)."""
    if kind == "parquet":
        return {name: _parquet_split(name, files) for name, files in _parquet_splits(root).items()}
    try:
        loaded = datasets.load_from_disk(str(root))
    except (OSError, ValueError) as err:
        raise DataError(f"{WHAT}: cannot read the save_to_disk folder {root} ({type(err).__name__}: {err})") from None
    if isinstance(loaded, datasets.Dataset):
        loaded = {train_split: loaded}
    return {name: _dataset_split(name, ds) for name, ds in loaded.items()}


def _dataset_split(name: str, ds: datasets.Dataset) -> _Split:
    def read(columns: list[str]) -> pa.Table:
        return ds.select_columns(columns).with_format("arrow")[:]
    return _Split(name, ds.features.arrow_schema, ds.features, read)


def _parquet_split(name: str, files: list[Path]) -> _Split:
    try:
        schema = pq.read_schema(files[0])
    except (OSError, pa.ArrowException) as err:
        raise DataError(f"{WHAT}: cannot read the parquet file {files[0]} ({err})") from None

    def read(columns: list[str]) -> pa.Table:
        tables = []
        for path in files:
            try:
                tables.append(pq.read_table(path, columns=columns))
            except (OSError, pa.ArrowException) as err:
                raise DataError(f"{WHAT}: cannot read the parquet file {path} ({err})") from None
        try:
            return pa.concat_tables(tables)
        except pa.ArrowInvalid as err:
            raise DataError(f"{WHAT}: the parquet files of split '{name}' differ in their columns ({err})") from None
    return _Split(name, schema, datasets.Features.from_arrow_schema(schema), read)


def _parquet_splits(root: Path) -> dict[str, list[Path]]:
    """Parquet files by split: ``<split>[-*].parquet`` in root or root/data, else ``<split>/*.parquet``."""
    found: dict[str, list[Path]] = {}
    for folder in (root, root / "data"):
        for path in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
            if not path.name.startswith("."):
                found.setdefault(path.stem.split("-")[0], []).append(path)
    if found:
        return found
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = sorted(p for p in folder.glob("*.parquet") if not p.name.startswith("."))
        if files:
            found[folder.name] = files
    return found


def _column(split: _Split, given: str, key: str, names: tuple[str, ...], kind: str,
            is_kind: Callable[[str], bool]) -> str:
    """The column ``given``, or the one named like ``names``, or the one of type ``kind``."""
    columns = split.schema.names
    listed = ", ".join(f"{c} ({_type(split, c)})" for c in columns)
    if given:
        if given not in columns:
            raise ConfigError(f"data.{key} = '{given}': split '{split.name}' has no such column "
                              f"(its columns: {listed})")
        return given
    found = [c for c in names if c in columns] or [c for c in columns if is_kind(c)]
    if len(found) == 1:
        return found[0]
    which = f"several candidate columns ({', '.join(found)})" if found else \
        f"no column named {' or '.join(names)} nor of type {kind}"
    raise ConfigError(f"data.{key}: split '{split.name}' has {which}; set data.{key} to one of its columns: {listed}")


def _type(split: _Split, column: str) -> str:
    """A column's type as ``datasets`` names it (Image, ClassLabel, int64, List, ...)."""
    feature = split.features.get(column)
    return feature.dtype if isinstance(feature, datasets.Value) else type(feature).__name__


def _is_image(t: pa.DataType) -> bool:
    """datasets.Image's storage: a struct of the encoded ``bytes`` and a ``path``."""
    return pa.types.is_struct(t) and {t.field(i).name for i in range(t.num_fields)} >= {"bytes", "path"}


def _is_numeric_array(t: pa.DataType) -> bool:
    """A (nested) list of integers or floats, e.g. datasets' Sequence/List of Value or Array2D."""
    if isinstance(t, pa.ExtensionType):
        t = t.storage_type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        return False
    inner = t.value_type
    return pa.types.is_integer(inner) or pa.types.is_floating(inner) or _is_numeric_array(inner)


def _class_names(split: _Split, column: str) -> list[str]:
    feature = split.features.get(column)
    return list(feature.names) if isinstance(feature, datasets.ClassLabel) else []


def _labels(column: pa.ChunkedArray, split: str, name: str, names: list[str]) -> np.ndarray:
    """Integer class labels; with ``names`` (a ClassLabel), each below their count."""
    where = f"{WHAT}: label column '{name}' of split '{split}'"
    if not pa.types.is_integer(column.type):
        raise DataError(f"{where} holds {column.type}, not integer class labels (set data.label_column)")
    if column.null_count:
        raise DataError(f"{where} has {column.null_count} rows without a label")
    y = column.to_numpy().astype(np.int64)
    if y.min() < 0:
        raise DataError(f"{where} holds the label {int(y.min())}; class labels are 0..K-1 "
                        f"(-1 is the Hub's 'no label': choose a labelled split)")
    if names and y.max() >= len(names):
        raise DataError(f"{where} holds the label {int(y.max())}, but its ClassLabel has {len(names)} classes")
    return y


def _arrays(column: pa.ChunkedArray, split: str, name: str) -> np.ndarray:
    """Fixed-length numeric rows as float32 N×…"""
    where = f"{WHAT}: column '{name}' of split '{split}'"
    try:
        x = np.asarray(column.to_pylist(), dtype=np.float32)
    except (TypeError, ValueError):
        raise DataError(f"{where}: its arrays differ in length or have missing values; "
                        f"expected one fixed-length numeric array per row") from None
    if not np.isfinite(x).all():
        raise DataError(f"{where} holds non-finite values (NaN or infinity)")
    return x


def _images(column: pa.ChunkedArray, split: str, size: int | None, resize: bool, root: Path) -> np.ndarray:
    """Decode every image into one preallocated uint8 N×C×size×size array: C = 1 while every image
    is greyscale, 3 from the first colour one on (the grey ones before it repeated, as RGB
    conversion would). ``size`` None: the first image's, which must be square; ``resize`` False:
    every image must already be size×size."""
    out: np.ndarray | None = None
    row, side = 0, size or 0  # side 0: the first image's
    for chunk in column.chunks:
        fields = dict(zip((f.name for f in chunk.type), chunk.flatten()))  # flatten: the chunk's offset kept
        for raw, path, absent in zip(fields["bytes"].to_pylist(), fields["path"].to_pylist(),
                                     chunk.is_null().to_pylist()):
            img = _open(None if absent else raw, None if absent else path, split, row, root)
            if out is None:
                if not side:
                    if img.size[0] != img.size[1]:
                        raise DataError(f"{WHAT}: split '{split}' row {row}: the image is "
                                        f"{img.size[0]}×{img.size[1]}, not square; set data.image_size to resize "
                                        f"the images to a square")
                    side, resize = img.size[0], False
                out = np.empty((len(column), 1 if img.mode == "L" else 3, side, side), dtype=np.uint8)
            elif out.shape[1] == 1 and img.mode == "RGB":
                out = np.repeat(out, 3, axis=1)
            if img.size != (side, side):
                if not resize:
                    raise DataError(f"{WHAT}: split '{split}' row {row}: the image is {img.size[0]}×{img.size[1]} "
                                    f"but the images before it are {side}×{side}; set data.image_size to resize "
                                    f"them all to one size")
                img = img.resize((side, side), Image.Resampling.BILINEAR)
            pixels = np.asarray(img if out.shape[1] == 1 or img.mode == "RGB" else img.convert("RGB"), dtype=np.uint8)
            out[row] = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
            row += 1
    assert out is not None  # the caller refuses an empty split
    return out


def _open(raw: bytes | None, path: str | None, split: str, row: int, root: Path) -> Image.Image:
    """One image from its encoded bytes, else from its file (relative paths: under ``root``), as
    "L" when greyscale, else "RGB"."""
    if raw is not None:
        source: io.BytesIO | Path = io.BytesIO(raw)
    elif path:
        source = root / Path(path).expanduser()  # an absolute path stays itself
    else:
        raise DataError(f"{WHAT}: split '{split}' row {row} has no image")
    try:
        with Image.open(source) as img:
            return img.convert("L" if img.mode in _GREY else "RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        where = "" if raw is not None else f" {source}"
        raise DataError(f"{WHAT}: split '{split}' row {row}: cannot read the image{where} "
                        f"({type(exc).__name__}: {exc})") from None


def _same_channels(xs: list[np.ndarray]) -> list[np.ndarray]:
    """Train and test with one channel count: a greyscale split beside an RGB one becomes RGB."""
    channels = max(x.shape[1] for x in xs)
    return [np.repeat(x, channels, axis=1) if x.shape[1] == 1 else x for x in xs]
