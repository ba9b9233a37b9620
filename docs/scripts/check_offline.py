"""Check that a built documentation site loads nothing from another host (CI runs it on the site that
``mkdocs build --strict`` made):

    python docs/scripts/check_offline.py SITE_DIR

It reads every HTML and CSS file of the site and reports each resource whose URL names a host
(``https://...`` or ``//...``): a script, stylesheet, icon or preload (``<link>`` of any ``rel`` other
than the navigational ones), image, ``srcset``, media source, iframe, embed or object, and in CSS (files,
``<style>`` blocks, ``style=`` attributes) every ``url(...)`` and ``@import``, which covers ``@font-face``.
A link one follows (``<a href>``, ``<link rel="canonical">``) is not a request and is allowed. Exit 0
when there is none, 1 naming each one as ``file:line: what URL``, 2 when SITE_DIR is not a folder.
Scripts' own code is not read: a script may name hosts in strings it never fetches.
"""
from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

# attributes that make the browser fetch a URL, by element (SVG's <image>/<use> included)
FETCHED = {
    "script": ("src",), "img": ("src", "srcset"), "source": ("src", "srcset"), "iframe": ("src",),
    "embed": ("src",), "object": ("data",), "video": ("src", "poster"), "audio": ("src",), "track": ("src",),
    "input": ("src",), "image": ("href", "xlink:href"), "use": ("href", "xlink:href"), "link": ("href", "imagesrcset"),
}
# <link rel=...> values that only name a page to go to, so that nothing is fetched
NAVIGATIONAL = {"alternate", "author", "bookmark", "canonical", "external", "help", "license", "me", "next",
                "nofollow", "noopener", "noreferrer", "prev", "search", "tag"}
CSS_URL = re.compile(r"""url\(\s*(['"]?)(.*?)\1\s*\)|@import\s+(['"])(.*?)\3""", re.I | re.S)
CSS_COMMENT = re.compile(r"/\*.*?\*/", re.S)


def external(url: str) -> bool:
    """Whether fetching ``url`` would reach a host: it names one, and is not a file: URL."""
    parts = urlsplit(url.strip())
    return bool(parts.netloc) and parts.scheme.lower() in ("", "http", "https", "ftp", "ws", "wss")


def candidates(attribute: str, value: str) -> list[str]:
    """The URLs an attribute's value holds (a srcset lists several, each with its size)."""
    if attribute.endswith("srcset"):
        return [item.split()[0] for item in value.split(",") if item.split()]
    return [value]


def css_findings(css: str) -> list[tuple[int, str]]:
    """``(line, "css URL")`` for each external ``url()`` or ``@import`` in a style sheet's text."""
    css = CSS_COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), css)  # comments out, line numbers kept
    found = []
    for match in CSS_URL.finditer(css):
        url = match.group(2) if match.group(2) is not None else match.group(4)
        if external(url):
            found.append((css.count("\n", 0, match.start()) + 1, f"css {url}"))
    return found


class ResourceParser(HTMLParser):
    """Collects ``(line, "what URL")`` for each external resource of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[int, str]] = []
        self.in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        line = self.getpos()[0]
        values = {name: value or "" for name, value in attrs}
        rels = set(values.get("rel", "").lower().split())
        if not (tag == "link" and rels and rels <= NAVIGATIONAL):  # else a page to go to, not a resource
            for attribute in FETCHED.get(tag, ()):
                for url in candidates(attribute, values.get(attribute, "")):
                    if external(url):
                        self.found.append((line, f"<{tag} {attribute}> {url}"))
        if "style" in values:
            self.found += [(line, what) for _, what in css_findings(values["style"])]
        self.in_style = tag == "style"

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        self.in_style = False

    def handle_endtag(self, tag: str) -> None:
        self.in_style = False

    def handle_data(self, data: str) -> None:
        if self.in_style:
            first = self.getpos()[0]
            self.found += [(first + line - 1, what) for line, what in css_findings(data)]


def check(site: Path) -> list[str]:
    """Every external resource of the site, as ``file:line: what URL``, in file order."""
    problems = []
    for path in sorted(site.rglob("*")):
        if path.suffix not in (".html", ".htm", ".css") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".css":
            found = css_findings(text)
        else:
            parser = ResourceParser()
            parser.feed(text)
            parser.close()
            found = parser.found
        problems += [f"{path.relative_to(site)}:{line}: {what}" for line, what in found]
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: check_offline.py SITE_DIR (a built site's folder)", file=sys.stderr)
        return 2
    problems = check(Path(argv[0]))
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} resource(s) from another host: the site would not work offline", file=sys.stderr)
        return 1
    print(f"{argv[0]}: no resource from another host")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
