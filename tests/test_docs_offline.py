"""The documentation site works offline: every formula becomes MathML when the site is built
(docs/scripts/mathml.py, a MkDocs hook) and a formula the converter cannot render fails the build, and
docs/scripts/check_offline.py finds every resource a built page would fetch from another host."""
from __future__ import annotations

import importlib.util
import logging
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "docs" / "scripts"
MATHML_NS = "{http://www.w3.org/1998/Math/MathML}"


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mathml() -> ModuleType:
    pytest.importorskip("latex2mathml")
    return _script("mathml")


@pytest.fixture(scope="module")
def offline() -> ModuleType:
    return _script("check_offline")


def _math(fragment: str) -> ET.Element:
    """The <math> element inside one converted arithmatex span or div."""
    wrapper = ET.fromstring(fragment)
    assert wrapper.get("class") == "arithmatex" and len(wrapper) == 1
    return wrapper[0]


# --- formulas -------------------------------------------------------------------------------------


def test_inline_and_display_formulas_become_mathml(mathml: ModuleType) -> None:
    page = ('<p>with <span class="arithmatex">\\(x^2\\)</span> and</p>\n'
            '<div class="arithmatex">\\[\n\\frac{a}{b}\n\\]</div>')
    converted, failures = mathml.render(page)
    assert failures == []
    assert converted.startswith("<p>with ") and "and</p>\n" in converted  # the text around is kept
    inline = _math(converted[converted.index("<span"):converted.index("</span>") + 7])
    assert inline.tag == f"{MATHML_NS}math" and inline.get("display") == "inline"
    power = next(inline.iter(f"{MATHML_NS}msup"))
    assert [(e.tag, e.text) for e in power] == [(f"{MATHML_NS}mi", "x"), (f"{MATHML_NS}mn", "2")]
    display = _math(converted[converted.index("<div"):])
    assert display.get("display") == "block"
    fraction = next(display.iter(f"{MATHML_NS}mfrac"))
    assert [e.text for e in fraction.iter() if e.text and e.text.strip()] == ["a", "b"]
    assert "\\" not in converted  # no LaTeX left


def test_html_escapes_in_the_latex_are_undone_before_converting(mathml: ModuleType) -> None:
    converted, failures = mathml.render('<span class="arithmatex">\\(a &lt; b\\)</span>')
    assert failures == []
    assert [e.text for e in _math(converted).iter(f"{MATHML_NS}mo")] == ["<"]


def test_an_environment_block_without_delimiters_converts(mathml: ModuleType) -> None:
    converted, failures = mathml.render(
        '<div class="arithmatex">\\begin{cases} 1 &amp; x &gt; 0 \\\\ 0 &amp; \\text{else} \\end{cases}</div>')
    assert failures == []
    rows = list(_math(converted).iter(f"{MATHML_NS}mtr"))
    assert len(rows) == 2 and all(len(row) == 2 for row in rows)


@pytest.mark.parametrize(("latex", "reason"), [
    ("\\arg\\min_h f", "unknown to latex2mathml: \\arg"),              # kept verbatim by the converter
    ("\\operatorname{arg\\,min}_h f", "lost its name"),               # an empty <mo/>
    ("\\text{a &lt; b}", "not well-formed"),                          # a bare < in the MathML
    ("\\begin{aligned} a &amp;= b \\end{aligned}", "not well-formed"),  # a bare & (no alignment support)
    ("\\frac{a}", "<mfrac> of 1 parts, not 2"),                       # a fraction of one part
    ("{a", "unbalanced braces"),                                       # closed silently by the converter
    ("x^", "latex2mathml failed"),                                     # the converter raises
])
def test_a_formula_the_converter_cannot_render_is_reported_and_kept(mathml: ModuleType, latex: str,
                                                                    reason: str) -> None:
    page = f'<p><span class="arithmatex">\\({latex}\\)</span></p>'
    converted, failures = mathml.render(page)
    assert converted == page
    assert len(failures) == 1 and reason in failures[0][1]
    assert failures[0][0].replace("&amp;", "&") == latex.replace("&lt;", "<").replace("&amp;", "&")


def test_the_hook_warns_naming_the_page_so_a_strict_build_fails(mathml: ModuleType,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    page = SimpleNamespace(file=SimpleNamespace(src_uri="methods/x.md"))
    with caplog.at_level(logging.WARNING, logger="mkdocs"):
        out = mathml.on_page_content('<span class="arithmatex">\\(\\arg x\\)</span> '
                                     '<span class="arithmatex">\\(y\\)</span>', page=page, config={}, files=[])
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert caplog.records[0].name.startswith("mkdocs.")  # MkDocs counts these for --strict
    assert "methods/x.md" in caplog.text and "\\\\arg x" in caplog.text
    assert out.count("<math") == 1


def test_every_formula_in_the_docs_converts(mathml: ModuleType) -> None:
    """The pages' Markdown with mkdocs.yml's extensions: each arithmatex formula renders as MathML."""
    markdown = pytest.importorskip("markdown")
    yaml = pytest.importorskip("yaml")
    entries = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["markdown_extensions"]
    names = [e if isinstance(e, str) else next(iter(e)) for e in entries]
    configs = {next(iter(e)): next(iter(e.values())) for e in entries if isinstance(e, dict)}
    assert configs["pymdownx.arithmatex"] == {"generic": True}  # the markup the hook reads
    count = 0
    for path in sorted((ROOT / "docs").rglob("*.md")):
        page = markdown.Markdown(extensions=names, extension_configs=configs).convert(path.read_text(encoding="utf-8"))
        converted, failures = mathml.render(page)
        assert failures == [], f"{path.relative_to(ROOT)}: {failures}"
        count += converted.count("<math ")
    assert count >= 100  # the method pages' formulas were found


# --- external resources ---------------------------------------------------------------------------


def _site(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


LOCAL_PAGE = """<!doctype html><html><head>
<link rel="stylesheet" href="../assets/main.css"><link rel="icon" href="assets/favicon.png">
<link rel="canonical" href="https://example.org/page/"><link rel="next" href="https://example.org/next/">
<script src="assets/bundle.js"></script><style>body { background: url("img/a.png") }</style>
</head><body><a href="https://github.com/x/y">a link, not a request</a>
<img src="data:image/png;base64,AAAA" srcset="img/a.png 1x, img/b.png 2x"><iframe src="frame.html"></iframe>
<p style="background: url(img/c.png)">text that says https://example.org</p></body></html>
"""


def test_a_site_of_local_resources_and_plain_links_passes(offline: ModuleType, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    site = _site(tmp_path, {"index.html": LOCAL_PAGE, "assets/main.css": "@import 'more.css';\n"
                            "@font-face { src: url(fonts/a.woff2) }\n/* url(https://example.org/x.css) */"})
    assert offline.check(site) == []
    assert offline.main([str(site)]) == 0
    assert "no resource from another host" in capsys.readouterr().out


def test_a_page_with_an_external_script_fails_naming_file_and_line(offline: ModuleType, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    site = _site(tmp_path, {"index.html": LOCAL_PAGE,
                            "methods/x.html": "<html><head>\n\n<script src='https://cdn.example.net/m.js'></script>"})
    assert offline.main([str(site)]) == 1
    assert capsys.readouterr().out.splitlines() == ["methods/x.html:3: <script src> https://cdn.example.net/m.js"]


@pytest.mark.parametrize("markup", [
    '<link rel="stylesheet" href="https://fonts.example.com/css?family=Roboto">',
    '<link rel="preconnect" href="https://fonts.example.com">',
    '<link href="//cdn.example.net/x.css">',                       # protocol-relative, no rel
    '<img src="http://example.org/a.png">',
    '<img src="a.png" srcset="a.png 1x, https://example.org/b.png 2x">',
    '<iframe src="https://example.org/embed"></iframe>',
    '<video><source src="https://example.org/v.mp4"></video>',
    '<svg><use href="https://example.org/icons.svg#x"/></svg>',
    '<div style="background: url(\'https://example.org/a.png\')"></div>',
    '<style>\n@import "https://example.org/x.css";</style>',
    '<style>@font-face { font-family: F; src: url(https://example.org/f.woff2) }</style>',
])
def test_each_kind_of_external_resource_is_found(offline: ModuleType, tmp_path: Path, markup: str) -> None:
    site = _site(tmp_path, {"page.html": f"<html><body>{markup}</body></html>"})
    problems = offline.check(site)
    line = 1 + markup.count("\n")  # each resource is on the markup's last line
    assert len(problems) == 1 and problems[0].startswith(f"page.html:{line}: ") and "example." in problems[0]


def test_a_stylesheet_file_with_an_external_font_fails(offline: ModuleType, tmp_path: Path) -> None:
    css = "a { color: red }\n@font-face {\n  src: url( 'https://fonts.example.com/r.woff2' ) format('woff2');\n}"
    site = _site(tmp_path, {"index.html": LOCAL_PAGE, "assets/extra.css": css})
    assert offline.check(site) == ["assets/extra.css:3: css https://fonts.example.com/r.woff2"]


def test_not_a_folder_is_a_usage_error(offline: ModuleType, tmp_path: Path) -> None:
    assert offline.main([str(tmp_path / "missing")]) == 2
    assert offline.main([]) == 2


@pytest.mark.slow
def test_the_built_site_needs_no_other_host_and_shows_mathml(offline: ModuleType, built_site: Path) -> None:
    site = built_site
    assert offline.check(site) == []
    page = (site / "methods" / "feduv.html").read_text(encoding="utf-8")
    assert page.count('<math xmlns="http://www.w3.org/1998/Math/MathML" display="block">') == 3
    assert 'class="arithmatex">\\(' not in page and 'class="arithmatex">\\[' not in page
    assert (site / "search" / "search_index.js").is_file()  # the offline plugin: search from file://
    assert (site / "javascripts" / "iframe-worker.js").is_file() and "javascripts/iframe-worker.js" in page
