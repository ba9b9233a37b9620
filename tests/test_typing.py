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


def _unchecked_in_comment(text: str) -> set[str]:
    """The modules pyproject.toml's comment above ``[tool.mypy]`` names as not yet checked."""
    comment = text[text.index("# Not yet checked"):text.index("[tool.mypy]")]
    lines = [line.removeprefix("#").strip() for line in comment.splitlines()[2:]]
    return {name.strip().rstrip(".") for name in " ".join(lines).split(",") if name.strip()}


def test_the_comment_names_every_module_mypy_does_not_check_yet() -> None:
    """The comment's list is what ``files`` leaves out of ``src/fedlatent``, no more and no less: a
    new module outside ``files``, or one that joined it, fails here until the comment says so."""
    import tomllib
    text = (ROOT / "pyproject.toml").read_text()
    files = [Path(f) for f in tomllib.loads(text)["tool"]["mypy"]["files"]]
    package = ROOT / "src" / "fedlatent"
    left_out = {str(p.relative_to(package)) for p in package.rglob("*.py")
                if not any(p.relative_to(ROOT) == f or f in p.relative_to(ROOT).parents for f in files)}
    assert len(left_out) > 10 and _unchecked_in_comment(text) == left_out
