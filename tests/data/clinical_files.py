"""Tiny Fed-ISIC2019 and RxRx1 folders in their published layouts (FLamby's preprocessed split file
and images; the RxRx1 release's metadata.csv and per-channel PNGs), for the tests."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from PIL import Image

ISIC_COLUMNS = ["image", "MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC", "UNK", "target", "center",
                "fold", "fold2"]
RXRX1_COLUMNS = ["site_id", "well_id", "cell_type", "dataset", "experiment", "plate", "well", "site",
                 "well_type", "sirna", "sirna_id"]


def write_isic(root: Path, per_split: tuple[int, int] = (3, 2), seed: int = 0) -> list[dict]:
    """Per center 0..5: per_split[0] train and per_split[1] test images of varying aspect ratio;
    returns the rows written (center-major order)."""
    rng = np.random.default_rng(seed)
    folder = root / "ISIC_2019_Training_Input_preprocessed"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for center in range(6):
        for fold, count in zip(("train", "test"), per_split):
            for _ in range(count):
                name = f"ISIC_{len(rows):07d}"
                target = int(rng.integers(0, 8))
                w, h = int(rng.integers(12, 20)), int(rng.integers(12, 20))
                Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"{name}.jpg")
                onehot = [1.0 if k == target else 0.0 for k in range(9)]
                rows.append(dict(zip(ISIC_COLUMNS, [name, *onehot, target, center, fold, f"{fold}_{center}"])))
    write_csv(root / "train_test_split", ISIC_COLUMNS, rows)
    return rows


def write_rxrx1(root: Path, classes: int = 52, seed: int = 0) -> list[dict]:
    """Sites spread over the cell types in turn: two train sites for ids 0..49 (the 50 most
    frequent), one for ids 50.. (dropped, so their images are not written) and a test site for ids
    0..7; only channels 1-3 are written (the release has 6). Returns the rows written."""
    rng = np.random.default_rng(seed)
    cells = ("HUVEC", "U2OS", "RPE", "HEPG2")  # not the client order: the reader must order them
    sites = [(s, "train") for s in range(50) for _ in range(2)] + [(s, "train") for s in range(50, classes)]
    sites += [(s, "test") for s in range(8)]
    rows = []
    for i, (sirna, split) in enumerate(sites):
        cell = cells[i % 4]
        experiment, plate, well, site = f"{cell}-01", 1 + i % 3, f"B{i:03d}", 1 + i % 2
        if sirna < 50:
            folder = root / "images" / experiment / f"Plate{plate}"
            folder.mkdir(parents=True, exist_ok=True)
            for channel in (1, 2, 3):
                Image.fromarray(rng.integers(0, 256, (10, 12), dtype=np.uint8)).save(
                    folder / f"{well}_s{site}_w{channel}.png")
        rows.append(dict(zip(RXRX1_COLUMNS, [f"{experiment}_{plate}_{well}_{site}", f"{experiment}_{plate}_{well}",
                                             cell, split, experiment, plate, well, site, "treatment",
                                             f"siRNA-{sirna}", sirna])))
    write_csv(root / "metadata.csv", RXRX1_COLUMNS, rows)
    return rows


def write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
