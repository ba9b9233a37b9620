"""What the clinical data sets (Fed-ISIC2019, RxRx1) share: reading their CSV files with a named
error for each missing piece."""
from __future__ import annotations

import csv
from pathlib import Path

from fedlatent.errors import DataError


def read_rows(path: Path, needed: tuple[str, ...], what: str, layout: str) -> list[dict[str, str]]:
    """The rows of CSV ``path`` restricted to the ``needed`` columns (stripped strings)."""
    if not path.is_file():
        raise DataError(f"{what}: expected the file {path} ({layout}); see data.root")
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        missing = [c for c in needed if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(f"{what}: {path} lacks the column(s) {', '.join(missing)}")
        rows = [{k: (row[k] or "").strip() for k in needed} for row in reader]
    if not rows:
        raise DataError(f"{what}: {path} lists no images")
    return rows
