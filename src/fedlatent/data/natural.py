"""Clients of their own, read from a file of natural client ids: LEAF's JSON layout and a CSV of sample → client.

Cross-device data sets come with their clients (FEMNIST's writers, Sent140's users): LEAF (Caldas
et al. 2018, https://leaf.cmu.edu) writes each split as JSON files holding ``users`` (the ids),
``num_samples`` (each user's count, in the same order) and ``user_data`` (id → ``{"x": rows, "y":
labels}``), a folder ``train/`` and one ``test/`` of such files. :func:`read_leaf` reads them into
a :class:`~fedlatent.data.sources.GivenClients`, one client per user in the order the (sorted)
files list them. :func:`read_client_map` reads a CSV with the columns ``sample,client`` that names
each sample of a pool to partition by its client, into one index array per client (in the order
the clients first appear). A malformed file — a user without samples, a sample without a user, a
label out of range — is a :class:`~fedlatent.errors.DataError` naming the file and the entry.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from fedlatent.data.sources import GivenClients
from fedlatent.errors import DataError


def _leaf_files(path: Path) -> tuple[list[Path], list[Path]]:
    """The train and test JSON files at ``path``: one file (train only), or a folder with ``train/``
    (and optionally ``test/``) of ``*.json`` files."""
    if path.is_file():
        return [path], []
    if not path.is_dir():
        raise DataError(f"data.path = '{path}': not found (expected a LEAF .json file or a folder with train/ "
                        "and test/ of .json files)")
    train, test = sorted((path / "train").glob("*.json")), sorted((path / "test").glob("*.json"))
    if not train:
        raise DataError(f"data.path = '{path}': no train/*.json (LEAF's layout: train/ and test/ of .json files)")
    return train, test


def _leaf_users(files: list[Path], classes: int) -> dict[str, tuple[np.ndarray, np.ndarray, Path]]:
    """Every user of ``files``: id → (x float32, y int64, the file it came from), in file order."""
    users: dict[str, tuple[np.ndarray, np.ndarray, Path]] = {}
    for file in files:
        try:
            doc = json.loads(file.read_text())
        except (OSError, ValueError) as err:
            raise DataError(f"{file}: not readable as JSON ({err})") from None
        if not isinstance(doc, dict) or not {"users", "user_data"} <= set(doc):
            raise DataError(f"{file}: not LEAF's layout (keys users, num_samples, user_data)")
        listed, data, counts = doc["users"], doc["user_data"], doc.get("num_samples")
        if counts is not None and len(counts) != len(listed):
            raise DataError(f"{file}: {len(listed)} users but {len(counts)} num_samples entries")
        stray = [u for u in data if u not in set(listed)]
        if stray:
            raise DataError(f"{file}: user_data holds samples of user {stray[0]!r}, who is not in users "
                            "(a sample without a user)")
        for i, user in enumerate(listed):
            entry = data.get(user)
            if not entry or not entry.get("y"):
                raise DataError(f"{file}: user {user!r} has no samples in user_data (a user without samples)")
            y_list, x_list = entry["y"], entry.get("x", [])
            if len(x_list) != len(y_list):
                raise DataError(f"{file}: user {user!r} has {len(x_list)} x rows but {len(y_list)} labels")
            if counts is not None and counts[i] != len(y_list):
                raise DataError(f"{file}: user {user!r}: num_samples says {counts[i]}, user_data holds {len(y_list)}")
            bad = next((v for v in y_list if isinstance(v, bool) or not isinstance(v, int) or v < 0
                        or (classes and v >= classes)), None)
            if bad is not None:
                bound = f"0..{classes - 1}" if classes else "a class index >= 0"
                raise DataError(f"{file}: user {user!r} has label {bad!r}, out of range ({bound})")
            try:
                x = np.asarray(x_list, dtype=np.float32)
            except (TypeError, ValueError):
                raise DataError(f"{file}: user {user!r}: x rows must be equal-length lists of numbers") from None
            if x.ndim != 2:
                raise DataError(f"{file}: user {user!r}: x rows must be equal-length lists of numbers")
            if user in users:
                raise DataError(f"{file}: user {user!r} appears in {users[user][2]} too")
            users[user] = (x, np.asarray(y_list, dtype=np.int64), file)
    return users


def read_leaf(path: str | Path, classes: int = 0) -> GivenClients:
    """The clients of a LEAF data set at ``path`` (:func:`_leaf_files`): one per user of the train
    files, its test split the same user's samples in the test files (None where it has none; a
    test user with no training samples is refused). ``classes``: the number of classes (0: the
    largest label + 1); a label at or above it is refused."""
    path = Path(path)
    train_files, test_files = _leaf_files(path)
    train, test = _leaf_users(train_files, classes), _leaf_users(test_files, classes)
    unknown = next((u for u in test if u not in train), None)
    if unknown is not None:
        raise DataError(f"{test[unknown][2]}: user {unknown!r} has test samples but none in train/ "
                        "(a user without training samples)")
    widths = {x.shape[1] for x, _, _ in [*train.values(), *test.values()]}
    if len(widths) > 1:
        raise DataError(f"{path}: x rows of different lengths across users ({sorted(widths)})")
    top = max(int(y.max()) for _, y, _ in [*train.values(), *test.values()])
    clients = [{"train": (x, y), "val": None, "test": (test[u][0], test[u][1]) if u in test else None}
               for u, (x, y, _) in train.items()]
    return GivenClients(clients, num_classes=classes or top + 1)


def read_client_map(path: str | Path, num_samples: int) -> list[np.ndarray]:
    """One index array per client from the CSV at ``path`` (header ``sample,client``): each of the
    ``num_samples`` samples to partition named once by its client's natural id; clients in the order
    they first appear, each client's samples in file order."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data.clients_file = '{path}': file not found (a CSV with the columns sample,client)")
    owners: dict[str, list[int]] = {}
    seen = np.full(num_samples, -1, dtype=np.int64)
    with path.open(newline="") as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header is None or [h.strip() for h in header[:2]] != ["sample", "client"]:
            raise DataError(f"{path}: the first line must be the header sample,client")
        for line, row in enumerate(rows, start=2):
            if len(row) < 2 or not row[1].strip():
                raise DataError(f"{path}: line {line}: sample {row[0] if row else ''!r} has no client "
                                "(a sample without a user)")
            try:
                sample = int(row[0])
            except ValueError:
                raise DataError(f"{path}: line {line}: sample {row[0]!r} is not an index") from None
            if not 0 <= sample < num_samples:
                raise DataError(f"{path}: line {line}: sample {sample} is out of range (0..{num_samples - 1})")
            if seen[sample] >= 0:
                raise DataError(f"{path}: line {line}: sample {sample} is named again (first on line {seen[sample]})")
            seen[sample] = line
            owners.setdefault(row[1].strip(), []).append(sample)
    missing = np.flatnonzero(seen < 0)
    if len(missing):
        raise DataError(f"{path}: sample {int(missing[0])} has no client ({len(missing)} samples unnamed; "
                        "a sample without a user)")
    return [np.asarray(samples, dtype=np.int64) for samples in owners.values()]
