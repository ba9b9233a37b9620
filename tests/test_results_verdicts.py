"""Every verdict in ``results/`` is recomputed here from the raw numbers committed beside it, by the
one rule (:func:`fedlatent.analysis.compare.paired_verdict`), and must be the verdict the file prints.

A results file records its verdicts in a fenced ``toml`` block whose first line is ``# verdicts``
(format in ``results/README.md``): the claims, their direction and verdict, and ``raw``, the CSV beside
the file with one row per claim and seed (the paired difference, and both sides' values where the
runs' numbers are committed). Every ``*.md`` under ``results/`` is checked, so a new results file
needs no line here: a file with a verdict section needs the block and its CSV.
"""
from __future__ import annotations

import csv
import re
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

from fedlatent.analysis.compare import DID_NOT_TRAIN, NOT_JUDGED, VERDICTS, did_train, paired_verdict

RESULTS = Path(__file__).resolve().parents[1] / "results"
FILES = sorted(RESULTS.rglob("*.md"))
BLOCK = re.compile(r"^```toml\n(# verdicts\b.*?)^```", re.S | re.M)
CLAIM = re.compile(r"^- \*\*([^*]+?):\*\*\s*(.*)", re.M)
ROUNDING = 0.006  # points: a difference of two values each printed to two decimals


def _flat(text: str) -> str:
    """Text with every run of whitespace one space, so that a wrapped line reads as one."""
    return " ".join(text.split())


def records(text: str) -> dict:
    """The file's verdict record: its budget, raw file and ``[[verdict]]`` entries ({} without a block)."""
    blocks = [tomllib.loads(b) for b in BLOCK.findall(text)]
    assert len(blocks) <= 1, "one verdict block per results file"
    return blocks[0] if blocks else {}


def raw_differences(path: Path) -> dict[str, list[float]]:
    """Per claim, the paired differences of its raw CSV in seed order, each checked against the two
    values it is the difference of where the CSV gives them."""
    found: dict[str, list[tuple[int, float]]] = defaultdict(list)
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            difference = float(row["difference"])
            if row["method_value"] and row["baseline_value"]:
                computed = float(row["method_value"]) - float(row["baseline_value"])
                assert abs(computed - difference) <= ROUNDING, (row["claim"], row["seed"], computed, difference)
            found[row["claim"]].append((int(row["seed"]), difference))
    for claim, pairs in found.items():
        assert len({seed for seed, _ in pairs}) == len(pairs), f"{path.name}: {claim!r} repeats a seed"
    return {claim: [d for _, d in sorted(pairs)] for claim, pairs in found.items()}


def verdict_sections(text: str) -> list[str]:
    """The sections whose heading names a verdict, each up to the next heading of any level."""
    parts = re.split(r"^(#{1,6} .*)$", text, flags=re.M)
    return [parts[i] + parts[i + 1] for i in range(1, len(parts) - 1, 2) if "verdict" in parts[i].lower()]


def recomputed(entry: dict, differences: list[float]) -> str:
    """The rule on one record: its raw differences, and whether the runs it compares trained (a
    record naming a ``floor`` gives the runs' final accuracies as ``ends``)."""
    trained = did_train([float(e) for e in entry["ends"]], float(entry["floor"])) if "floor" in entry else True
    return paired_verdict(differences, int(entry["direction"]), trained=trained)


def test_results_files_are_found() -> None:
    assert RESULTS / "real_images" / "feddecorr_cifar10.md" in FILES and RESULTS / "README.md" in FILES


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(RESULTS)) for p in FILES])
def test_each_verdict_follows_from_its_raw_numbers_and_is_the_one_printed(path: Path) -> None:
    text = path.read_text()
    assert "does not hold" not in text, f"{path.name}: 'does not hold' says neither which way; use the rule's words"
    record, sections = records(text), verdict_sections(text)
    if not sections:
        assert not record.get("verdict"), f"{path.name}: a verdict record without a section headed 'Verdict'"
        return
    assert record.get("verdict"), f"{path.name}: a verdict section needs a '# verdicts' toml block"
    raw = raw_differences(path.parent / record["raw"])
    printed = BLOCK.sub("", "".join(sections))  # the prose, the record aside
    section = _flat(printed)
    assert _flat(record["budget"]) in section, f"{path.name}: the verdict section must name its budget"
    claims = {}
    for entry in record["verdict"]:
        assert entry["verdict"] in VERDICTS, entry["claim"]
        assert recomputed(entry, raw.get(entry["claim"], [])) == entry["verdict"], entry["claim"]
        assert f"**{_flat(entry['claim'])}:** {entry['verdict']}" in section, f"{entry['claim']} not printed"
        claims[_flat(entry["claim"])] = entry["verdict"]
    assert set(raw) <= set(record_claim["claim"] for record_claim in record["verdict"]), f"{path.name}: raw rows of no claim"
    for claim, rest in CLAIM.findall(printed):  # every claim the sections print is recorded
        assert _flat(claim) in claims or rest.startswith(NOT_JUDGED), f"{path.name}: {claim!r} has no record"


def test_a_claim_on_runs_that_did_not_train_reads_so_whatever_its_differences() -> None:
    entry = {"direction": -1, "floor": 10.0, "ends": [10.5, 26.7]}
    assert recomputed(entry, [-15.25, -23.95]) != DID_NOT_TRAIN           # 10.5 % left chance (10 %)
    assert recomputed({**entry, "ends": [9.9, 26.7]}, [-15.25, -23.95]) == DID_NOT_TRAIN


def test_the_readme_lists_only_files_that_exist() -> None:
    named = re.findall(r"^- `([\w./-]+\.md)`", (RESULTS / "README.md").read_text(), re.M)  # the list's entries
    missing = [name for name in named if not (RESULTS / name).exists()]
    assert len(named) > 10 and not missing, missing
