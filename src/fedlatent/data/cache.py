"""The decoded-image cache: what a reader decoded from image files, written once as ``.npy`` arrays
and memory-mapped by every later run, so that 60,000 JPEGs are decoded once, not per run.

Where: ``$FEDLATENT_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/fedlatent``, else
``~/.cache/fedlatent``; each entry is a folder ``decoded/<what>-<key>/``. ``fedlatent cache`` lists
the entries and their sizes, ``fedlatent cache --clear`` deletes them (deleting the folder by hand
is as good). ``FEDLATENT_CACHE_DIR=off`` turns the cache off.

The key is a SHA-256 over the reader's name, its parameters (e.g. ``image_size``) and every file
under the data set's folder (relative path, size, modification time), so a file changed, added or
removed is a different tree and is decoded afresh. An entry is written to a temporary folder and
renamed into place, so a crash or a concurrent run never leaves a half-written entry behind.

>>> train, test = decoded("image_folder", "the image-folder tree", root, {"image_size": None},
...                       lambda: read_image_folder(root))  # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import numpy as np

from fedlatent.data.types import ImageSet

T = TypeVar("T")
_FORMAT = 1  # bump when the stored layout changes: old entries are then simply not found
_held: ContextVar[list[str] | None] = ContextVar("fedlatent_cache_lines", default=None)


def cache_root() -> Path | None:
    """The cache folder, or None when ``FEDLATENT_CACHE_DIR=off``."""
    configured = os.environ.get("FEDLATENT_CACHE_DIR", "")
    if configured.lower() == "off":
        return None
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fedlatent"


def fingerprint(folder: Path) -> str:
    """SHA-256 of every visible file under ``folder``: relative path, size and mtime (ns). Plain
    strings and one stat per file: 60,000 files take well under a second."""
    base = len(os.path.join(str(folder), ""))
    lines: list[str] = []
    stack = [str(folder)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir():
                    stack.append(entry.path)
                elif entry.is_file():
                    st = entry.stat()
                    lines.append(f"{entry.path[base:]}\0{st.st_size}\0{st.st_mtime_ns}")
    lines.sort()
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def entry_key(what: str, folder: Path, params: dict[str, Any]) -> str:
    """The entry's folder name: the reader's name and a digest of its parameters and files."""
    digest = hashlib.sha256(json.dumps([_FORMAT, what, params, fingerprint(folder)], sort_keys=True).encode())
    return f"{what}-{digest.hexdigest()[:24]}"


def decoded(what: str, source: str, folder: Path, params: dict[str, Any], read: Callable[[], T]) -> T:
    """``read()``'s result, from the cache when this tree was decoded before with these ``params``;
    otherwise read, stored, and returned. The result may nest ``ImageSet``, lists, tuples, dicts,
    numpy arrays, strings, numbers and None; cached arrays come back memory-mapped (copy on write).
    Once the data are read, one line on stderr names the layout they came from (``source``, e.g.
    "the image-folder tree") and the cache entry."""
    root = cache_root()
    if root is None:
        return read()
    target = root / "decoded" / entry_key(what, folder, params)
    if (target / "tree.json").is_file():
        value = _decode(json.loads((target / "tree.json").read_text()), target)
        _say(f"{what}: {source} {folder}: read from the cache {target}")
        return value
    value = read()
    _store(value, target)
    if (target / "tree.json").is_file():
        _say(f"{what}: {source} {folder}: decoded once; later runs read the cache {target}")
    else:  # a read-only or full disk: said, not fatal
        _say(f"{what}: {source} {folder}: decoded, but the cache {target.parent} could not be written "
             f"(later runs decode it again)")
    return value


def _say(line: str) -> None:
    held = _held.get()
    if held is not None:
        held.append(line)
        return
    print(f"fedlatent: {line}", file=sys.stderr, flush=True)


@contextmanager
def lines_held() -> Iterator[None]:
    """Hold the cache's lines until the block (or decorated function) ends, and drop them when it
    raises: an error found after the data are read (a partition that cannot be made) stays the
    one line on stderr."""
    held: list[str] = []
    token = _held.set(held)
    try:
        yield
    finally:
        _held.reset(token)
    for line in held:  # reached only when the block did not raise
        _say(line)


def _store(value: Any, target: Path) -> None:
    """Write the entry beside ``target`` and rename it into place; a full or read-only disk leaves no
    entry (the run goes on with what it decoded)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=target.parent))
    except OSError:
        return
    try:
        arrays: list[np.ndarray] = []
        tree = _encode(value, arrays)
        for i, array in enumerate(arrays):
            np.save(staging / f"a{i}.npy", np.ascontiguousarray(array), allow_pickle=False)
        (staging / "tree.json").write_text(json.dumps(tree))
        os.rename(staging, target)
    except OSError:  # another run stored it first, or the disk is full: nothing is lost
        shutil.rmtree(staging, ignore_errors=True)


def _encode(value: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(value, np.ndarray):
        arrays.append(value)
        return {"array": len(arrays) - 1}
    if isinstance(value, ImageSet):
        return {"imageset": {f.name: _encode(getattr(value, f.name), arrays) for f in fields(value)}}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, arrays) for v in value]}
    if isinstance(value, list):
        return {"list": [_encode(v, arrays) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[k, _encode(v, arrays)] for k, v in value.items()]}
    if value is None or isinstance(value, (str, int, float, bool)):
        return {"value": value}
    raise TypeError(f"the decoded-image cache cannot store a {type(value).__name__}")


def _decode(tree: dict, folder: Path) -> Any:
    (kind, body), = tree.items()
    if kind == "array":
        return np.load(folder / f"a{body}.npy", mmap_mode="c", allow_pickle=False)
    if kind == "imageset":
        return ImageSet(**{k: _decode(v, folder) for k, v in body.items()})
    if kind == "tuple":
        return tuple(_decode(v, folder) for v in body)
    if kind == "list":
        return [_decode(v, folder) for v in body]
    if kind == "dict":
        return {k: _decode(v, folder) for k, v in body}
    return body


def entries() -> list[tuple[Path, int]]:
    """Every cache entry with its size in bytes."""
    root = cache_root()
    folder = None if root is None else root / "decoded"
    if folder is None or not folder.is_dir():
        return []
    return [(p, sum(f.stat().st_size for f in p.iterdir() if f.is_file()))
            for p in sorted(folder.iterdir()) if p.is_dir() and not p.name.startswith(".")]


def clear() -> int:
    """Delete every entry (and any left-over partial one); return how many entries there were."""
    root = cache_root()
    count = len(entries())
    if root is not None and (root / "decoded").is_dir():
        shutil.rmtree(root / "decoded")
    return count
