"""The "keys and defaults" blocks of the method pages, rendered from the method registry.

A method page holds its block between ``<!-- keys:preset:NAME -->`` (``keys:part:NAME`` on the terms
page, ``keys:common`` for the keys every preset accepts) and ``<!-- /keys -->``. The registry is the
only source: after changing a preset's or a part's keys, rewrite the blocks with

    .venv/bin/python docs/scripts/method_keys.py

``tests/test_docs.py`` fails while a page's block differs from what :func:`refresh` renders, so a
page cannot silently state stale defaults.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

METHODS_DIR = Path(__file__).resolve().parents[1] / "methods"
BLOCK = re.compile(r"(<!-- keys:(preset|part|common):?([a-z0-9_]*) -->\n)(.*?)(<!-- /keys -->)", re.S)


def toml_value(value: Any) -> str:
    """A default as it is written in a configuration file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def _table(defaults: dict[str, Any], prefix: str) -> str:
    if not defaults:
        return "No keys of its own; the [universal keys](index.md#universal-keys) apply.\n"
    rows = "".join(f"| `{prefix}{key}` | `{toml_value(value)}` |\n" for key, value in defaults.items())
    return "| key | default |\n|---|---|\n" + rows


def render(kind: str, name: str) -> str:
    """The block's content: the registry's one-line description and a table of keys and defaults."""
    from fedlatent.methods import PARTS, PRESETS
    from fedlatent.methods.registry import COMMON_KEYS
    if kind == "common":
        return _table(COMMON_KEYS, "algorithm.")
    registry = PRESETS if kind == "preset" else PARTS
    if name not in registry:
        raise KeyError(f"docs: {kind} '{name}' is not registered")
    entry = registry[name]
    prefix = "algorithm." if kind == "preset" else ""  # a part's keys sit in its own [[terms]] table
    return f"`fedlatent methods`: {entry.doc}\n\n" + _table(entry.defaults, prefix)


def refresh(text: str) -> str:
    """``text`` with every keys block rendered afresh."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group(2), m.group(3)) + m.group(5), text)


def blocks(text: str) -> list[tuple[str, str]]:
    """The (kind, name) of every keys block in ``text``."""
    return [(m.group(2), m.group(3)) for m in BLOCK.finditer(text)]


def main() -> int:
    changed = 0
    for page in sorted(METHODS_DIR.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        new = refresh(text)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed += 1
            print(f"rewrote {page}")
    print(f"{changed} page(s) rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
