"""The table of what each backend honours (``docs/backends.md``'s and ``docs/architecture.md``'s),
rendered from ``fedlatent.backends.capabilities`` (the declarations the run's checks refuse by). A
page holds it between ``<!-- capabilities -->`` and ``<!-- /capabilities -->``; after changing a
declaration, rewrite them with

    .venv/bin/python docs/scripts/backend_table.py

``tests/test_capabilities.py`` fails while a page's table differs from the rendered one.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1]
PAGES = (DOCS / "backends.md", DOCS / "architecture.md")
BLOCK = re.compile(r"(<!-- capabilities -->\n)(.*?)(<!-- /capabilities -->)", re.S)


def refresh(text: str) -> str:
    """``text`` with its capabilities block rendered anew."""
    from fedlatent.backends.capabilities import table

    if not BLOCK.search(text):
        raise ValueError("no <!-- capabilities --> block")
    return BLOCK.sub(lambda m: m.group(1) + table() + m.group(3), text)


def main() -> int:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        new = refresh(text)
        if new != text:
            page.write_text(new, encoding="utf-8")
            print(f"rewrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
