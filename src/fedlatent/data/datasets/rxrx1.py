"""RxRx1 (Recursion): fluorescence microscopy of cells treated with siRNAs, as the Ditto + MMD
paper uses it: the 50 most frequent ``sirna_id`` values are the classes, channels 1–3 form a
3-channel image, the 4 cell types are the clients.

Layout under ``data.root`` (the released ``rxrx1`` archive)::

    metadata.csv   columns site_id,well_id,cell_type,dataset,experiment,plate,well,site,well_type,sirna,sirna_id
    images/<experiment>/Plate<plate>/<well>_s<site>_w<channel>.png

Clients in the order RPE, HUVEC, HEPG2, U2OS; the ``dataset`` column (train | test) gives each
client's train and test split. The 50 classes are counted over the whole metadata (ties broken by
the smaller id) and numbered by ascending ``sirna_id``; rows of other siRNAs are dropped, so only
their images need be present. Images are resized to ``data.image_size`` and standardised with the
training images' channel statistics (``data.normalize``).

>>> cfg = DataConfig(dataset="rxrx1", partition="given", root="~/data/rxrx1", image_size=64)
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from fedlatent.config import DataConfig
from fedlatent.data.compact import uint8_channel_stats
from fedlatent.data.datasets._clinical import read_rows
from fedlatent.data.readers._common import read_image
from fedlatent.data.cache import decoded
from fedlatent.data.registry import register_dataset
from fedlatent.data.sources import GivenClients, check_root
from fedlatent.errors import DataError

CELL_TYPES = ["RPE", "HUVEC", "HEPG2", "U2OS"]
NUM_CLASSES = 50
CHANNELS = (1, 2, 3)
_NEEDED = ("cell_type", "dataset", "experiment", "plate", "well", "site", "sirna_id")
_WHAT = "rxrx1"


def top_classes(sirna_ids: list[str], count: int = NUM_CLASSES) -> list[str]:
    """The ``count`` most frequent ids (ties: the smaller id first), sorted by id."""
    freq = Counter(sirna_ids)
    if len(freq) < count:
        raise DataError(f"{_WHAT}: metadata.csv holds {len(freq)} distinct sirna_id values; "
                        f"{count} classes are needed")
    ranked = sorted(freq, key=lambda s: (-freq[s], _id_key(s)))
    return sorted(ranked[:count], key=_id_key)


def _id_key(sirna_id: str) -> tuple[int, int | str]:
    return (0, int(sirna_id)) if sirna_id.lstrip("-").isdigit() else (1, sirna_id)


def _image(root: Path, row: dict[str, str], size: int) -> np.ndarray:
    """Channels 1–3 of one site as a uint8 3×size×size image (each PNG is one grey channel)."""
    folder = root / "images" / row["experiment"] / f"Plate{row['plate']}"
    out = np.empty((len(CHANNELS), size, size), dtype=np.uint8)
    for i, channel in enumerate(CHANNELS):
        path = folder / f"{row['well']}_s{row['site']}_w{channel}.png"
        if not path.is_file():
            raise DataError(f"{_WHAT}: {path} is listed in metadata.csv but is absent")
        out[i] = read_image(path, size, _WHAT)[0]  # grey → RGB repeats the channel
    return out


def read_rxrx1(root: Path, image_size: int) -> list[dict[str, tuple[np.ndarray, np.ndarray] | None]]:
    """Per cell type: uint8 train/test images N×3×S×S and int64 labels (top-50 siRNAs only)."""
    meta = root / "metadata.csv"
    rows = read_rows(meta, _NEEDED, _WHAT, "the RxRx1 release's metadata, columns site_id,well_id,"
                     "cell_type,dataset,experiment,plate,well,site,well_type,sirna,sirna_id")
    for row in rows:
        if row["cell_type"] not in CELL_TYPES:
            raise DataError(f"{_WHAT}: {meta}: site {row['experiment']}/{row['plate']}/{row['well']}_s"
                            f"{row['site']} has cell_type {row['cell_type']!r}, expected one of "
                            f"{', '.join(CELL_TYPES)}")
        if row["dataset"] not in ("train", "test"):
            raise DataError(f"{_WHAT}: {meta}: dataset {row['dataset']!r}, expected train or test")
    label = {s: i for i, s in enumerate(top_classes([r["sirna_id"] for r in rows]))}
    clients: list[dict[str, tuple[np.ndarray, np.ndarray] | None]] = []
    for cell in CELL_TYPES:
        client: dict[str, tuple[np.ndarray, np.ndarray] | None] = {"val": None, "test": None}
        for split in ("train", "test"):
            kept = [r for r in rows if r["cell_type"] == cell and r["dataset"] == split and r["sirna_id"] in label]
            if not kept:
                continue
            x = np.empty((len(kept), len(CHANNELS), image_size, image_size), dtype=np.uint8)
            for i, row in enumerate(kept):
                x[i] = _image(root, row, image_size)
            client[split] = (x, np.array([label[r["sirna_id"]] for r in kept], dtype=np.int64))
        if client["train"] is None:
            raise DataError(f"{_WHAT}: {meta} lists no training image of cell type {cell} among the "
                            f"{NUM_CLASSES} classes")
        clients.append(client)
    return clients


@register_dataset("rxrx1", reads=("root", "image_size"), own_clients=True)
def _rxrx1(cfg: DataConfig, seed: int) -> GivenClients:
    """RxRx1 (4 cell types as clients, the 50 most frequent siRNAs, channels 1–3) under data.root."""
    root = Path(cfg.root).expanduser()
    check_root(root)
    side = cfg.side()
    clients = decoded("rxrx1", "the metadata and images in", root, {"image_size": side}, lambda: read_rxrx1(root, side))
    stats = uint8_channel_stats([c["train"][0] for c in clients]) if cfg.normalize else None
    return GivenClients(clients, num_classes=NUM_CLASSES, stats=stats)
