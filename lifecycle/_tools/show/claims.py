"""One rank's failure as a world test's report knows it: its error and the notes on its exception, no journal.

``claim`` gives a ``verdict.RankEnd`` that ``verdict.order`` and ``verdict.find_cause``
take, for ``lifecycle.testing``'s world report: the notes are prose (they hold no typed
evidence), read with ``lifecycle._tools.show.older``'s expressions.
"""

from __future__ import annotations

from dataclasses import replace

from lifecycle._tools.show.older import FIRST_NOTE, LIVENESS
from lifecycle._tools.show.verdict import RankEnd, _missing, _short


def claim(rank: int, error: str, *, time: float | None, note: str = "", killed: bool = False) -> RankEnd:
    """One rank's failure as a report outside a journal knows it (``lifecycle.testing``'s world report):
    ``error``, when (``time``), the notes on its exception (``note``: a ``lifecycle: rank R failed first ...``
    or liveness note names the first rank), or ``killed`` (it died without a word)."""
    first_rank = None
    for line in note.splitlines():
        found = FIRST_NOTE.match(line) or LIVENESS.search(line)
        if found is not None and int(found["rank"]) != rank:
            first_rank = int(found["rank"])
            break
    base = _missing(rank)
    return replace(
        base,
        journaled=True,
        state=None if killed else "failed",
        failed_at=None if killed else time,
        first_rank=first_rank,
        last_time=time,
        error=_short(error) or "(no error recorded)",
        note=note,
    )
