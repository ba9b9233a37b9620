"""Fed-ISIC2019 (FLamby): dermoscopy images of 6 hospitals, 8 diagnoses, FLamby's fixed
train/test split per hospital.

Layout under ``data.root`` (what FLamby's download and preprocessing scripts leave)::

    train_test_split                                  CSV: image,MEL,NV,...,UNK,target,center,fold,fold2
    ISIC_2019_Training_Input_preprocessed/<image>.jpg  shorter side 224, aspect ratios vary

Client ``k`` is ``center == k`` (k = 0..5, FLamby's order); ``fold`` ∈ {train, test} gives each
client's train and test split (the union of the tests is the global test set). Images are cut as
FLamby's test transform cuts them, scaled to ``data.image_size``: the shorter side resized to
224/200 · image_size, then the centre image_size × image_size crop (FLamby: shorter side 224,
centre crop 200); standardised with ImageNet's channel statistics, as FLamby does for its
ImageNet-pretrained EfficientNet-B0 (``data.normalize = false`` keeps them in [0, 1]).

``data.augment_policy = "flamby_isic"`` turns on FLamby's training augmentation
(:mod:`fedlatent.data.flamby_isic`): training images are then kept as the centre square of side
224/200 · image_size (FLamby's 224-side image, less its long side's ends) so that the
augmentation's random crop to image_size has FLamby's margin; read without augmentation
(evaluation, diagnostics) they give the centre image_size crop, the test cut.

>>> cfg = DataConfig(dataset="fed_isic2019", partition="given", root="~/flamby/isic2019", image_size=200)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from fedlatent.config import DataConfig
from fedlatent.data.datasets._clinical import read_rows
from fedlatent.data.cache import decoded
from fedlatent.data.registry import register_dataset
from fedlatent.data.sources import GivenClients, check_root
from fedlatent.errors import DataError

CLASSES = ["MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC"]  # FLamby's target 0..7
CENTERS = 6
SPLIT_FILE = "train_test_split"
IMAGE_FOLDER = "ISIC_2019_Training_Input_preprocessed"
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
_NEEDED = ("image", "target", "center", "fold")
_SIDE_PER_CROP = 224 / 200  # FLamby: images with shorter side 224, centre crop 200
_WHAT = "fed_isic2019"


def _index(row: dict[str, str], column: str, count: int, path: Path) -> int:
    """``row[column]`` as an integer in 0..count-1 (one line naming the image otherwise)."""
    try:
        value = int(float(row[column]))
    except ValueError:
        value = -1
    if not 0 <= value < count or row[column] == "":
        raise DataError(f"{_WHAT}: {path}: image {row['image']} has {column} {row[column]!r}, "
                        f"expected an integer 0..{count - 1}")
    return value


def read_centre_crop(path: Path, size: int, margin: bool = False) -> np.ndarray:
    """``path`` as RGB, shorter side scaled to round(224/200 · size) (bilinear), centre size×size
    crop (``margin``: the centre square of that shorter side); uint8 3×size×size."""
    try:
        with Image.open(path) as img:
            rgb = img.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise DataError(f"{_WHAT}: cannot read the image {path} ({type(exc).__name__})") from exc
    side = round(_SIDE_PER_CROP * size)
    w, h = rgb.size
    scale = side / min(w, h)
    new = (max(size, round(w * scale)), max(size, round(h * scale)))
    if new != (w, h):
        rgb = rgb.resize(new, Image.Resampling.BILINEAR)
    cut = max(side, size) if margin else size
    # placed so that the centre size×size of the margin square is exactly the plain centre crop
    left, top = ((n - size) // 2 - (cut - size) // 2 for n in new)
    return np.asarray(rgb.crop((left, top, left + cut, top + cut)), dtype=np.uint8).transpose(2, 0, 1)


def train_side(image_size: int) -> int:
    """The side training images are kept at for FLamby's augmentation: round(224/200 · image_size)."""
    return max(image_size, round(_SIDE_PER_CROP * image_size))


def read_fed_isic2019(root: Path, image_size: int,
                      margin: bool = False) -> list[dict[str, tuple[np.ndarray, np.ndarray] | None]]:
    """Per center (0..5): uint8 train/test images N×3×S×S and int64 labels, in the file's row order
    (``margin``: training images at :func:`train_side` instead of S)."""
    split_path = root / SPLIT_FILE
    rows = read_rows(split_path, _NEEDED, _WHAT,
                     f"FLamby's split file, columns image,{','.join(CLASSES)},UNK,target,center,fold,fold2")
    folder = root / IMAGE_FOLDER
    chosen: dict[tuple[int, str], list[tuple[Path, int]]] = {}
    for row in rows:
        center = _index(row, "center", CENTERS, split_path)
        label = _index(row, "target", len(CLASSES), split_path)
        if row["fold"] not in ("train", "test"):
            raise DataError(f"{_WHAT}: {split_path}: image {row['image']} has fold {row['fold']!r}, "
                            f"expected train or test")
        path = folder / f"{row['image']}.jpg"
        if not path.is_file():
            raise DataError(f"{_WHAT}: {path.name} is listed in {split_path} but is not in {folder}")
        chosen.setdefault((center, row["fold"]), []).append((path, label))
    clients: list[dict[str, tuple[np.ndarray, np.ndarray] | None]] = []
    for center in range(CENTERS):
        if (center, "train") not in chosen:
            raise DataError(f"{_WHAT}: {split_path} lists no training image of center {center} "
                            f"(expected centers 0..{CENTERS - 1})")
        client: dict[str, tuple[np.ndarray, np.ndarray] | None] = {"val": None, "test": None}
        for fold in ("train", "test"):
            items = chosen.get((center, fold), [])
            if items:
                keep = margin and fold == "train"
                side = train_side(image_size) if keep else image_size
                x = np.empty((len(items), 3, side, side), dtype=np.uint8)
                for i, (path, _) in enumerate(items):
                    x[i] = read_centre_crop(path, image_size, keep)
                client[fold] = (x,
                                np.array([lab for _, lab in items], dtype=np.int64))
        clients.append(client)
    return clients


@register_dataset("fed_isic2019", reads=("root", "image_size", "augment_policy"), own_clients=True,
                  headline="balanced_accuracy")
def _fed_isic2019(cfg: DataConfig, seed: int) -> GivenClients:
    """FLamby's Fed-ISIC2019 (6 centers, 8 classes, fixed train/test per center) under data.root."""
    root = Path(cfg.root).expanduser()
    check_root(root)
    margin, side = cfg.augment_policy == "flamby_isic", cfg.side()
    clients = decoded("fed_isic2019", "the images and split file in", root, {"image_size": side, "margin": margin},
                      lambda: read_fed_isic2019(root, side, margin))
    return GivenClients(clients, num_classes=len(CLASSES),
                        stats=(IMAGENET_MEAN, IMAGENET_STD) if cfg.normalize else None,
                        train_crop=side if margin else None)
