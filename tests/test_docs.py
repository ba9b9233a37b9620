"""The documentation against the code: every method preset has a page in the site's nav, each page's
keys block is what the registry says now, every configuration, spec and test a page names exists,
and the README stays short. With mkdocs installed, the site builds with --strict."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from fedlatent.methods import PARTS, PRESETS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"
SPECS = ROOT / "src" / "fedlatent" / "experiment" / "studies" / "specs"


def _keys_script():
    spec = importlib.util.spec_from_file_location("method_keys", DOCS / "scripts" / "method_keys.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]


def test_every_preset_has_a_page_listed_in_the_nav() -> None:
    nav = MKDOCS_YML.read_text(encoding="utf-8")
    missing_page = [n for n in PRESETS if not (DOCS / "methods" / f"{n}.md").is_file()]
    missing_nav = [n for n in PRESETS if not re.search(rf":\s*methods/{n}\.md\s*$", nav, re.M)]
    assert not missing_page, f"no docs/methods/<preset>.md for {missing_page}"
    assert not missing_nav, f"mkdocs.yml's nav lacks methods/<preset>.md for {missing_nav}"


def test_no_page_for_a_preset_that_is_gone() -> None:
    pages = {p.stem for p in (DOCS / "methods").glob("*.md")} - {"index", "terms"}
    assert pages <= set(PRESETS), f"method pages without a preset: {sorted(pages - set(PRESETS))}"


def test_each_method_page_holds_its_own_keys_block_and_every_part_is_on_the_terms_page() -> None:
    keys = _keys_script()
    for name in PRESETS:
        text = (DOCS / "methods" / f"{name}.md").read_text(encoding="utf-8")
        assert keys.blocks(text) == [("preset", name)], f"docs/methods/{name}.md: expected one keys:preset:{name} block"
    terms = keys.blocks((DOCS / "methods" / "terms.md").read_text(encoding="utf-8"))
    assert sorted(n for kind, n in terms if kind == "part") == sorted(PARTS)
    assert ("common", "") in keys.blocks((DOCS / "methods" / "index.md").read_text(encoding="utf-8"))


def test_keys_blocks_state_the_registry_defaults() -> None:
    keys = _keys_script()
    stale = [p.name for p in sorted((DOCS / "methods").glob("*.md"))
             if keys.refresh(p.read_text(encoding="utf-8")) != p.read_text(encoding="utf-8")]
    assert not stale, f"stale keys blocks in {stale}: run .venv/bin/python docs/scripts/method_keys.py"


def test_rendered_block_carries_every_default(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = _keys_script()
    block = keys.render("preset", "feduv")
    for key, value in PRESETS["feduv"].defaults.items():
        assert f"| `algorithm.{key}` | `{keys.toml_value(value)}` |" in block
    assert keys.toml_value(True) == "true" and keys.toml_value([]) == "[]" and keys.toml_value("x") == '"x"'
    # a changed default makes the page stale: the check is not a tautology
    page = (DOCS / "methods" / "feduv.md").read_text(encoding="utf-8")
    monkeypatch.setitem(PRESETS["feduv"].defaults, "mu", 0.25)
    assert keys.refresh(page) != page
    with pytest.raises(KeyError):
        keys.render("preset", "no_such_preset")


def test_every_configuration_a_page_names_exists() -> None:
    named = {(page.relative_to(ROOT), path) for page in _pages()
             for path in re.findall(r"\bconfigs/[\w./-]+?\.toml\b", page.read_text(encoding="utf-8"))}
    assert named, "no page names a configuration: the pattern is broken"
    missing = sorted((str(page), path) for page, path in named if not (ROOT / path).is_file())
    assert not missing, f"configurations named but absent: {missing}"


def test_every_spec_and_test_file_a_page_names_exists() -> None:
    specs, tests = set(), set()
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        specs |= set(re.findall(r"`((?:feduv|feddecorr|spherefed|ditto)_(?:supp_)?(?:table|figure)\w*)`", text))
        tests |= set(re.findall(r"\btests/[\w/]+\.py\b", text))
    assert specs and tests
    assert not sorted(s for s in specs if not (SPECS / f"{s}.toml").is_file()), "specs named but absent"
    assert not sorted(t for t in tests if not (ROOT / t).is_file()), "test files named but absent"


def test_readme_is_short_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    links = re.findall(r"\]\((?!https?:)([^)#]+)(?:#[^)]*)?\)", readme)
    assert links
    assert not [link for link in links if not (ROOT / link).exists()]


def test_the_readmes_commands_run_after_its_own_install() -> None:
    """The install makes a virtual environment it never activates, so every command of the README's
    shell blocks calls the tools inside it (``.venv/bin/...``): a bare ``fedlatent`` is exit 127."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = [line.strip() for block in re.findall(r"```bash\n(.*?)```", readme, re.S) for line in block.splitlines()
                if line.strip() and not line.strip().startswith("#")]
    bare = [c for c in commands for part in re.split(r"&&|;|\|", c)
            if part.split() and part.split()[0] in ("fedlatent", "pytest", "ruff", "mkdocs", "mypy", "pip")]
    assert any(".venv/bin/fedlatent run" in c for c in commands) and not bare, bare


@pytest.mark.slow
def test_site_builds_strict(built_site: Path) -> None:
    """``mkdocs build --strict`` succeeds (the fixture asserts it) and writes one .html file per page."""
    assert (built_site / "methods" / "feduv.html").is_file()  # the offline plugin: no directory URLs


def test_sphinx_roles_become_inline_code_in_the_api_reference() -> None:
    pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("griffe_roles", DOCS / "scripts" / "griffe_roles.py")
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)
    assert roles.plain("see :func:`load_config`, :class:`~fedlatent.errors.ConfigError` and :mod:`.single`") == \
        "see `load_config`, `ConfigError` and `.single`"
    assert roles.plain("no role: `x`") == "no role: `x`"
