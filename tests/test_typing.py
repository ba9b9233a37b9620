"""Static types: the modules ``[tool.mypy]`` lists in pyproject.toml pass mypy, so that a change which
breaks the typing of a checked module fails the suite as well as CI's own mypy step (.ci/run). It uses
mypy's own cache in the checkout (``.mypy_cache``, ignored by git), so that after CI's mypy step, or a
developer's, it checks incrementally (seconds) rather than from scratch (about a minute)."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_checked_modules_pass_mypy(monkeypatch: pytest.MonkeyPatch) -> None:
    api = pytest.importorskip("mypy.api")
    monkeypatch.chdir(ROOT)  # mypy finds pyproject.toml, and the file list in it, from the working directory
    stdout, stderr, status = api.run([])
    assert status == 0, stdout + stderr
