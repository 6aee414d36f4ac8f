"""Where a stale rank stands against every other: the summary one rank gathers per count of marks.

Standard library only: the monitor runs as a script and imports it from its own folder
(see ``lifecycle._liveness.monitor``, whose ``behind`` gathers, publishes and reads it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

AHEAD_NAMED = 8
"""How many of the ranks ahead of a rank judged behind its verdict names (it counts the rest)."""


@dataclass(frozen=True, slots=True)
class Summary:
    """All positions against one count of marks: ranks below it, missing (done, or in another attempt), above it."""

    below: int
    missing: int
    above: int
    ahead: list[int]
    """The first ``AHEAD_NAMED`` ranks above it."""

    def encode(self) -> bytes:
        """The summary as the store holds it (JSON, a few hundred bytes at most)."""
        return json.dumps([self.below, self.missing, self.above, self.ahead]).encode()

    @classmethod
    def decode(cls, data: bytes) -> Summary:
        """The summary ``encode`` wrote."""
        below, missing, above, ahead = json.loads(data)
        return cls(below, missing, above, ahead)

    def reason(self) -> str:
        """Why a rank at this count is behind every other (which ranks went on), or "" when it is not.

        Behind: no rank below, none missing, done or in another attempt, and one above.
        """
        if self.below or self.missing or not self.above:
            return ""
        if self.above <= len(self.ahead):
            return f"rank(s) {', '.join(map(str, self.ahead))} went on past it"
        return f"{self.above} ranks went on past it ({', '.join(map(str, self.ahead))}, …)"


def summarize(beats: Sequence[bytes | None], me: int, count: int, attempt: int) -> Summary:
    """Every rank's beat (``beats[rank]``, None if it never beat) against rank ``me``'s ``count`` in ``attempt``.

    A done rank (finished, or failing on its own: its count moved one past its last mark)
    counts as missing: it is no evidence that anyone is behind. When a culprit is killed
    the first peer to fail would otherwise put the peers still waiting for it behind it.
    """
    below = missing = above = 0
    ahead: list[int] = []
    for rank, beat in enumerate(beats):
        if rank == me:
            continue
        fields = json.loads(beat) if beat is not None else None
        if fields is None or fields[2] != attempt or fields[5:] == ["done"]:
            missing += 1
        elif fields[1] < count:
            below += 1
        elif fields[1] > count:
            above += 1
            if len(ahead) < AHEAD_NAMED:
                ahead.append(rank)
    return Summary(below, missing, above, ahead)
