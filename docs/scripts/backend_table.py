"""``docs/backends.md``'s table of what each backend honours, rendered from
``fedlatent.backends.capabilities`` (the declarations the run's checks refuse by). The page holds it
between ``<!-- capabilities -->`` and ``<!-- /capabilities -->``; after changing a declaration,
rewrite it with

    .venv/bin/python docs/scripts/backend_table.py

``tests/test_capabilities.py`` fails while the page's table differs from the rendered one.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "backends.md"
BLOCK = re.compile(r"(<!-- capabilities -->\n)(.*?)(<!-- /capabilities -->)", re.S)


def refresh(text: str) -> str:
    """``text`` with its capabilities block rendered anew."""
    from fedlatent.backends.capabilities import table

    if not BLOCK.search(text):
        raise ValueError("no <!-- capabilities --> block")
    return BLOCK.sub(lambda m: m.group(1) + table() + m.group(3), text)


def main() -> int:
    text = PAGE.read_text(encoding="utf-8")
    new = refresh(text)
    if new != text:
        PAGE.write_text(new, encoding="utf-8")
        print(f"rewrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
