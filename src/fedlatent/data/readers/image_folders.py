"""Multi-domain image folders, the PACS and Office-Home layout: ``root/<domain>/<class>/<images>``.

Domains and classes are sorted by name; the class set is the union over domains, so a class may be
absent from some domain. Images are converted to RGB and resized (bilinear) to a common square size.

>>> pacs = read_domains("~/data/PACS", image_size=224)
>>> pacs.domain_names  # ['art_painting', 'cartoon', 'photo', 'sketch']
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fedlatent.data.readers._common import IMAGE_SUFFIXES, read_images
from fedlatent.data.types import ImageSet
from fedlatent.errors import DataError

_LAYOUT = "root/<domain>/<class>/<image files>, e.g. PACS or Office-Home"


def read_domains(root: Path | str, image_size: int) -> ImageSet:
    """Every image under ``root/<domain>/<class>/``, with ``domain`` and ``domain_names`` filled."""
    root = Path(root).expanduser()
    domains = _subfolders(root) if root.is_dir() else []
    if not domains:
        raise DataError(f"domains: expected domain folders ({_LAYOUT}) under {root}; see data.root")
    classes = sorted({c.name for d in domains for c in _subfolders(d)})
    label = {name: i for i, name in enumerate(classes)}
    paths: list[Path] = []
    y: list[int] = []
    domain: list[int] = []
    for d, folder in enumerate(domains):
        start = len(paths)
        for class_folder in _subfolders(folder):
            found = sorted(p for p in class_folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            paths += found
            y += [label[class_folder.name]] * len(found)
        if len(paths) == start:
            raise DataError(f"domains: the domain folder {folder} holds no images in class folders ({_LAYOUT})")
        domain += [d] * (len(paths) - start)
    x = read_images(paths, image_size, "domains")
    return ImageSet(x, np.array(y, dtype=np.int64), classes, np.array(domain, dtype=np.int64),
                    [d.name for d in domains])


def _subfolders(folder: Path) -> list[Path]:
    """Visible subfolders, sorted by name."""
    return sorted((p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.name)
