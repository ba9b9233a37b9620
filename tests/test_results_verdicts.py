"""Every verdict in ``results/`` follows from its committed numbers by the one rule
(:func:`fedlatent.analysis.compare.paired_verdict`) and is the verdict the file prints.

A results file records the paired differences its verdicts rest on in a fenced ``toml`` block whose
first line is ``# verdicts`` (format in ``results/README.md``). Every ``*.md`` under ``results/`` is
checked, so a new results file needs no line here: a file with a verdict section needs the block.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from fedlatent.analysis.compare import NOT_JUDGED, VERDICTS, paired_verdict

RESULTS = Path(__file__).resolve().parents[1] / "results"
FILES = sorted(RESULTS.rglob("*.md"))
BLOCK = re.compile(r"^```toml\n(# verdicts\b.*?)^```", re.S | re.M)
CLAIM = re.compile(r"^- \*\*([^*]+?):\*\*\s*(.*)", re.M)


def _flat(text: str) -> str:
    """Text with every run of whitespace one space, so that a wrapped line reads as one."""
    return " ".join(text.split())


def records(text: str) -> dict:
    """The file's verdict record: its budget and ``[[verdict]]`` entries ({} without a block)."""
    blocks = [tomllib.loads(b) for b in BLOCK.findall(text)]
    assert len(blocks) <= 1, "one verdict block per results file"
    return blocks[0] if blocks else {}


def verdict_sections(text: str) -> list[str]:
    """The sections whose heading names a verdict, each up to the next heading of any level."""
    parts = re.split(r"^(#{1,6} .*)$", text, flags=re.M)
    return [parts[i] + parts[i + 1] for i in range(1, len(parts) - 1, 2) if "verdict" in parts[i].lower()]


def test_results_files_are_found() -> None:
    assert RESULTS / "real_images" / "feddecorr_cifar10.md" in FILES and RESULTS / "README.md" in FILES


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(RESULTS)) for p in FILES])
def test_each_verdict_follows_from_its_numbers_and_is_the_one_printed(path: Path) -> None:
    text = path.read_text()
    record, sections = records(text), verdict_sections(text)
    if not sections:
        assert not record.get("verdict"), f"{path.name}: a verdict record without a section headed 'Verdict'"
        return
    assert record.get("verdict"), f"{path.name}: a verdict section needs a '# verdicts' toml block"
    printed = BLOCK.sub("", "".join(sections))  # the prose, the record aside
    section = _flat(printed)
    assert _flat(record["budget"]) in section, f"{path.name}: the verdict section must name its budget"
    claims = {}
    for entry in record["verdict"]:
        differences, direction = [float(d) for d in entry["differences"]], int(entry["direction"])
        assert entry["verdict"] in VERDICTS
        assert paired_verdict(differences, direction) == entry["verdict"], entry["claim"]
        assert f"**{_flat(entry['claim'])}:** {entry['verdict']}" in section, f"{entry['claim']} not printed"
        claims[_flat(entry["claim"])] = entry["verdict"]
    for claim, rest in CLAIM.findall(printed):  # every claim the sections print is recorded
        assert _flat(claim) in claims or rest.startswith(NOT_JUDGED), f"{path.name}: {claim!r} has no record"
