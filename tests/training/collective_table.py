"""The collective table: read from docs/collectives.md, copied into docs/design.md (``README``, by its old name).

``python tests/training/collective_table.py`` rewrites design.md's copy (between
``README_BEGIN`` and ``TABLE_END``) from the table in docs/collectives.md (between
``DOCS_BEGIN`` and ``TABLE_END``); ``readme_section`` is what design.md must hold, and
``rows`` the ``(operation, group, device)`` triples the interception test compares with.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "collectives.md"
README = REPO / "docs" / "design.md"
DOCS_BEGIN = "<!-- collectives table -->"
README_BEGIN = "<!-- collectives table: generated from docs/collectives.md by tests/training/collective_table.py -->"
TABLE_END = "<!-- end collectives table -->"


def _between(text: str, begin: str, where: Path) -> tuple[int, int]:
    """The offsets of the text between ``begin``'s line and ``TABLE_END``; ``ValueError`` naming ``where`` if absent."""
    start = text.find(begin)
    end = text.find(TABLE_END, start)
    if start < 0 or end < 0:
        raise ValueError(f"{where} has no {begin!r} ... {TABLE_END!r} section")
    return start + len(begin) + 1, end


def table(docs: str | None = None) -> str:
    """The table's markdown lines in docs/collectives.md (``docs``: that file's text), each ending in a newline."""
    text = DOCS.read_text() if docs is None else docs
    start, end = _between(text, DOCS_BEGIN, DOCS)
    return text[start:end]


def rows(docs: str | None = None) -> set[tuple[str, str, str]]:
    """The table's ``(operation, group, device)`` triples."""
    found = set()
    for line in table(docs).splitlines()[2:]:  # after the header and its rule
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        found.add((cells[1], cells[2], cells[3]))
    return found


def readme_section(docs: str | None = None) -> str:
    """What the README holds from its ``README_BEGIN`` line to ``TABLE_END``, both included."""
    return f"{README_BEGIN}\n{table(docs)}{TABLE_END}"


def rewrite_readme() -> bool:
    """Put the current table into the README; True if it changed."""
    text = README.read_text()
    start, end = _between(text, README_BEGIN, README)
    new = text[: start - len(README_BEGIN) - 1] + readme_section() + text[end + len(TABLE_END) :]
    if new == text:
        return False
    README.write_text(new)
    return True


if __name__ == "__main__":
    print("docs/design.md updated" if rewrite_readme() else "docs/design.md already up to date")
    sys.exit(0)
