"""Measured numbers live in docs/benchmarks.md, not in the code: every pointer to one resolves, every row is used.

A comment that rests on a measurement says why it matters and points to its row
(``see docs/benchmarks.md, <anchor>``); the row says the number, the stack it was
measured on, and when. The section is written by hand in bench/measurements.md and
``make bench`` copies it to the end of docs/benchmarks.md.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "bench" / "measurements.md"
DOC = ROOT / "docs" / "benchmarks.md"

_ANCHOR = r"[a-z0-9]+(?:-[a-z0-9]+)+"
_POINTER = re.compile(rf"docs/benchmarks\.md, ((?:{_ANCHOR})(?:(?:, | and ){_ANCHOR})*)")


def anchors(text: str) -> list[str]:
    """The anchors the measurements section declares, in order."""
    return re.findall(rf'<a id="({_ANCHOR})"></a>', text)


def pointers(root: Path) -> dict[str, set[str]]:
    """Every anchor a comment or docstring under ``root`` points to, with the files that point to it."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        # A pointer may wrap: join the lines, dropping comment markers and indentation.
        text = re.sub(r"\s*\n\s*#?\s*", " ", path.read_text(encoding="utf-8"))
        for match in _POINTER.finditer(text):
            for anchor in re.split(r", | and ", match.group(1)):
                found.setdefault(anchor, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_benchmarks_doc_ends_with_the_measurements_section() -> None:
    """docs/benchmarks.md ends with bench/measurements.md as it is (``make bench`` copies it there)."""
    assert DOC.read_text(encoding="utf-8").endswith("\n" + SOURCE.read_text(encoding="utf-8"))


def test_every_anchor_is_declared_once() -> None:
    """No two rows of the measurements section share an anchor."""
    declared = anchors(SOURCE.read_text(encoding="utf-8"))
    assert declared, "the section declares no anchor"
    assert len(declared) == len(set(declared)), sorted(a for a in declared if declared.count(a) > 1)


def test_every_pointer_in_the_package_names_a_row() -> None:
    """Each ``see docs/benchmarks.md, <anchor>`` in lifecycle/ names a row of the measurements section."""
    declared = set(anchors(SOURCE.read_text(encoding="utf-8")))
    found = pointers(ROOT / "lifecycle")
    assert found, "no pointer found: the pattern no longer matches the comments"
    dangling = {anchor: sorted(files) for anchor, files in found.items() if anchor not in declared}
    assert not dangling, f"pointers to rows that do not exist: {dangling}"


def test_every_row_is_pointed_to_from_the_package() -> None:
    """Each row of the measurements section is used: some comment in lifecycle/ points to it."""
    found = pointers(ROOT / "lifecycle")
    unused = [anchor for anchor in anchors(SOURCE.read_text(encoding="utf-8")) if anchor not in found]
    assert not unused, f"rows no comment points to (remove them, or point to them): {unused}"
