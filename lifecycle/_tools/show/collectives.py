"""Where each rank stood in each process group's collectives when an attempt failed (issue 40), for ``show``.

From the ``collectives`` records the failing ranks wrote (their last positions, per group)
and the verdicts of their liveness monitors (a rank killed before it could write: the
collective it was stuck before, or waited in, is the verdict's evidence). One line per
group: the ranks that stood alike together (``ranks 0, 2-3: in all_reduce #101``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lifecycle._tools.show.cause import ranks_text
from lifecycle.journal import Collectives, Record, Verdict
from lifecycle.journal.evidence import Kind

MAX_GROUPS = 8
"""The most groups listed for one attempt (the innermost first, as the records list them)."""


def collective_lines(ranks: Mapping[int, Sequence[Record]]) -> list[str]:
    """The attempt's collective positions, one line per group where a rank waited inside a collective or was stuck
    before one (none when no rank recorded any, or every rank had left its groups' last collectives)."""
    where: dict[str, dict[str, list[int]]] = {}  # group, in words → what a rank did there → its ranks
    for rank, records in ranks.items():
        for record in records:
            if isinstance(record, Collectives):
                for position in record.groups:
                    if position.entered > position.left:
                        said = f"in {position.op} #{position.entered}"
                    else:
                        said = f"left {position.op} #{position.left}" if position.op else f"at #{position.left}"
                    where.setdefault(_words(position.label), {}).setdefault(said, []).append(rank)
            elif isinstance(record, Verdict) and record.culprit == rank and record.evidence is not None:
                facts = record.evidence
                if facts.collective:
                    said = "in" if Kind.named(facts.kind) in (Kind.DESYNC, Kind.DIED) else "before"
                    verdict = f"{said} {facts.collective} ({facts.kind}: its verdict)"
                    where.setdefault(facts.group, {}).setdefault(verdict, []).append(rank)
    # Only the groups where a rank waited (inside a collective, or stuck before one): a failure between collectives,
    # every rank having left the last one, says nothing here.
    where = {words: stood for words, stood in where.items() if any(s.startswith(("in ", "before ")) for s in stood)}
    lines = []
    for words, stood in list(where.items())[:MAX_GROUPS]:
        parts = [f"{ranks_text(sorted(set(ranks)))}: {said}" for said, ranks in stood.items()]
        lines.append(f"  collectives in {words}: {'; '.join(parts)}")
    if len(where) > MAX_GROUPS:
        lines.append(f"  … and {len(where) - MAX_GROUPS} more groups")
    return lines


def _words(label: str) -> str:
    """A group's label in words (``page.group_words``: ``the data-parallel group``)."""
    return label if label.startswith(("group ", "the ")) else f"the {label} group"
