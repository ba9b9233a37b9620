"""A MkDocs hook (mkdocs.yml ``hooks:``): every formula becomes MathML when the site is built, so that a
page shows its mathematics with no script, no web font and no network (Chromium and Firefox render
MathML natively).

``pymdownx.arithmatex`` in generic mode leaves each formula as LaTeX in
``<span class="arithmatex">\\(...\\)</span>`` (inline) or ``<div class="arithmatex">\\[...\\]</div>``
(display); latex2mathml converts the LaTeX. It does not raise on everything it cannot convert: an
unknown command such as ``\\arg`` comes out verbatim, ``\\operatorname{arg\\,min}`` drops the operator's
name (an empty ``<mo/>``), ``\\frac{a}`` makes a fraction of one part, an unbalanced brace passes, and a
bare ``&`` or ``<`` comes out unescaped. Each of these is reported as a warning naming the page and the
formula, which fails the build under ``strict: true``; the formula is then left as LaTeX.
"""
from __future__ import annotations

import html
import logging
import re
import xml.etree.ElementTree as ET
from typing import Any

from latex2mathml.converter import convert

log = logging.getLogger("mkdocs.hooks.mathml")

FORMULA = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
DELIMITERS = {"span": ("\\(", "\\)"), "div": ("\\[", "\\]")}
MATHML = "{http://www.w3.org/1998/Math/MathML}"
# the elements that take a fixed number of children in MathML (fraction, root, scripts): fewer means a
# missing argument
ARITY = {"mfrac": 2, "mroot": 2, "msub": 2, "msup": 2, "munder": 2, "mover": 2, "msubsup": 3, "munderover": 3}


class UnconvertibleFormula(ValueError):
    """latex2mathml's output for a formula would not show what the LaTeX says."""


def to_mathml(latex: str, display: bool) -> str:
    """The MathML of ``latex`` (no delimiters), or :class:`UnconvertibleFormula` saying why not."""
    unescaped = re.sub(r"\\.", "", latex)  # \{ and \} are characters, not groups
    if unescaped.count("{") != unescaped.count("}"):
        raise UnconvertibleFormula("unbalanced braces")  # latex2mathml closes or prints them silently
    try:
        mathml = convert(latex, display="block" if display else "inline")
    except Exception as error:  # the converter raises bare exceptions of its own for bad LaTeX
        raise UnconvertibleFormula(f"latex2mathml failed: {error!r}") from error
    if "\\" in mathml:  # a command it does not know stays as its name (a real backslash is an entity)
        unknown = sorted(set(re.findall(r"\\[A-Za-z]+|\\.", mathml)))
        raise UnconvertibleFormula(f"unknown to latex2mathml: {', '.join(unknown)}")
    try:
        tree = ET.fromstring(mathml)
    except ET.ParseError as error:
        raise UnconvertibleFormula(f"not well-formed MathML ({error}): a bare & or < in the LaTeX?") from error
    if any(not (mo.text or "").strip() and len(mo) == 0 for mo in tree.iter(f"{MATHML}mo")):
        raise UnconvertibleFormula("an operator lost its name (e.g. \\operatorname{arg\\,min}): write it plainer")
    for element in tree.iter():
        name = element.tag.removeprefix(MATHML)
        if name in ARITY and len(element) != ARITY[name]:
            raise UnconvertibleFormula(f"<{name}> of {len(element)} parts, not {ARITY[name]}: an argument missing?")
    return mathml


def render(page_html: str) -> tuple[str, list[tuple[str, str]]]:
    """``page_html`` with each arithmatex formula as MathML (kept in its span or div, which the theme
    styles), and the ``(formula, reason)`` of each formula left as LaTeX because it could not be."""
    failures: list[tuple[str, str]] = []

    def replace(match: re.Match[str]) -> str:
        tag, escaped = match.group(1), match.group(2)
        latex = html.unescape(escaped).strip()
        opening, closing = DELIMITERS[tag]
        if latex.startswith(opening) and latex.endswith(closing):
            latex = latex[len(opening):-len(closing)]  # else a bare \begin{env}...\end{env} block
        try:
            mathml = to_mathml(latex.strip(), display=tag == "div")
        except UnconvertibleFormula as error:
            failures.append((latex.strip(), str(error)))
            return match.group(0)
        return f'<{tag} class="arithmatex">{mathml}</{tag}>'

    return FORMULA.sub(replace, page_html), failures


def on_page_content(content: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: the page's HTML, before the theme and the search index see it."""
    converted, failures = render(content)
    for latex, reason in failures:
        log.warning("%s: formula %r left as LaTeX: %s", page.file.src_uri, latex, reason)
    return converted
