"""Whether a folder — there, or to be made — can take the files a run writes: one check for the
run folder and the trackers' stores, made before any work."""
from __future__ import annotations

import tempfile
from pathlib import Path

from fedlatent.errors import ConfigError


def nearest_existing(path: Path) -> Path:
    """``path`` itself, or the closest of its parents that exists."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return existing


def check_folder(folder: Path, what: str) -> None:
    """Refuse ``folder`` (named ``what`` in the one-line error) when the closest existing folder on
    its path is a file or no file can be written in it."""
    existing = nearest_existing(folder)
    if not existing.is_dir():
        raise ConfigError(f"{what}: {existing} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise ConfigError(f"{what}: cannot write in {existing} ({err.strerror or err})") from None
