"""HAM10000 dermatoscopic images: ``HAM10000_metadata.csv`` plus ``<image_id>.jpg`` files.

The label is the diagnosis ``dx`` over the seven classes, sorted; the domain is the ``dataset``
column (the source collection: a natural feature shift). Images are looked up in ``root``,
``root/HAM10000_images_part_1``, ``root/HAM10000_images_part_2`` and ``root/images``.

>>> ham = read_ham10000("~/data/HAM10000", image_size=64)
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from fedlatent.data.readers._common import read_images
from fedlatent.data.types import ImageSet
from fedlatent.errors import DataError

CLASSES = ["akiec", "bcc", "bkl", "df", "mel", "nv", "vasc"]
_METADATA = "HAM10000_metadata.csv"
_IMAGE_FOLDERS = (".", "HAM10000_images_part_1", "HAM10000_images_part_2", "images")
_NEEDED = ("image_id", "dx", "dataset")


def read_ham10000(root: Path | str, image_size: int) -> ImageSet:
    """All images listed in the metadata CSV, in its row order, resized to image_size×image_size."""
    root = Path(root).expanduser()
    rows = _metadata(root / _METADATA)
    label = {name: i for i, name in enumerate(CLASSES)}
    domain_names = sorted({row["dataset"] for row in rows})
    domain = {name: i for i, name in enumerate(domain_names)}
    folders = [root / f for f in _IMAGE_FOLDERS]
    paths: list[Path] = []
    for row in rows:
        if row["dx"] not in label:
            raise DataError(f"ham10000: {root / _METADATA}: image {row['image_id']} has dx {row['dx']!r}, "
                            f"expected one of {', '.join(CLASSES)}")
        name = f"{row['image_id']}.jpg"
        path = next((f / name for f in folders if (f / name).is_file()), None)
        if path is None:
            raise DataError(f"ham10000: {name} is listed in {_METADATA} but is neither in {root} nor in its "
                            f"subfolders {', '.join(_IMAGE_FOLDERS[1:])}")
        paths.append(path)
    x = read_images(paths, image_size, "ham10000")
    y = np.array([label[row["dx"]] for row in rows], dtype=np.int64)
    d = np.array([domain[row["dataset"]] for row in rows], dtype=np.int64)
    return ImageSet(x, y, list(CLASSES), d, domain_names)


def _metadata(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise DataError(f"ham10000: expected the file {path} (columns lesion_id,image_id,dx,dx_type,age,sex,"
                        f"localization,dataset; images <image_id>.jpg beside it); see data.root")
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        missing = [c for c in _NEEDED if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(f"ham10000: {path} lacks the column(s) {', '.join(missing)} "
                            f"(expected lesion_id,image_id,dx,dx_type,age,sex,localization,dataset)")
        rows = [{k: (row[k] or "").strip() for k in _NEEDED} for row in reader]
    if not rows:
        raise DataError(f"ham10000: {path} lists no images")
    return rows
