"""A griffe extension for the API reference (mkdocs.yml names it): the project's docstrings use
Sphinx roles (:func:`x`, :class:`~a.b.C`, ...), which MkDocs would print verbatim; each becomes
inline code of its target (``~`` keeps the last component, as in Sphinx)."""
from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc):`(~?)([^`]+)`")


def plain(text: str) -> str:
    """``text`` with every Sphinx role replaced by inline code of its target."""
    return ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
