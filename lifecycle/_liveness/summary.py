"""Where a stale rank stands against every other: the summary one rank gathers per count of marks.

Standard library only: the monitor runs as a script and imports it from its own folder
(see ``lifecycle._liveness.monitor``, whose ``behind`` gathers, publishes and reads it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

if __package__:
    from lifecycle._liveness.page import Collective, group_words, position_fields
else:  # loaded from the monitor's folder (see monitor.py)
    from page import Collective, group_words, position_fields  # type: ignore[import-not-found,no-redef]

AHEAD_NAMED = 8
"""How many of the ranks ahead of a rank judged behind its verdict names (it counts the rest)."""
OUTSIDE_NAMED = 8
"""How many ranks stuck outside a collective one summary names (the first by rank)."""
PEERS_NAMED = 8
"""How many of the ranks waiting in the collective a rank stuck outside it is named with."""


def done(fields: Sequence[object]) -> bool:
    """Whether a beat's fields say its rank is done: ``[beat, count, attempt, step, phase, "done", ...]``."""
    return len(fields) > 5 and fields[5] == "done"


NESTING = (
    "tensor-parallel",
    "context-parallel",
    "expert-parallel",
    "pipeline-parallel",
    "data-parallel",
    "data-parallel (gloo)",
    "data+context-parallel",
    "model-parallel",
)
"""Megatron-core's groups from the innermost (a layer's collectives) out; any other group comes after them."""


def _nesting(label: str) -> int:
    return NESTING.index(label) if label in NESTING else len(NESTING)


class Seen(NamedTuple):
    """One group's collective position as a beat carries it (``page.Collective``, and since when, wall clock)."""

    key: str
    label: str
    entered: int
    left: int
    op: str
    fingerprint: int
    blind: bool
    since: float

    @property
    def inside(self) -> bool:
        """Whether the rank is inside a collective of this group."""
        return self.entered > self.left


def collectives(fields: Sequence[object]) -> list[Seen]:
    """A beat's collective positions, one per group (``[..., "done" or "", [[key, label, entered, ...], ...]]``)."""
    found = fields[6] if len(fields) > 6 else []
    return [Seen(*position) for position in found] if isinstance(found, list) else []


class Outside(NamedTuple):
    """Why a rank is stuck outside a collective: the group (``key``, ``label`` in words), the collective it did not
    enter (``op`` #``number``), the ranks waiting in it (``peers``, the first ``PEERS_NAMED``), since when (wall)."""

    key: str
    label: str
    op: str
    number: int
    peers: list[int]
    since: float

    def why(self, where: str, now: float) -> str:
        """The words of the evidence, for a rank at ``where`` (``Position.where``), at ``now`` (wall clock)."""
        return (
            f"it is stuck in {where} before {self.op} #{self.number} of {group_words(self.label)}, which rank(s) "
            f"{', '.join(map(str, self.peers))} entered {max(0.0, now - self.since):.1f} s ago and wait in"
        )


@dataclass(frozen=True, slots=True)
class Summary:
    """All positions against one count of marks: ranks below it, missing (done, or in another attempt), above it."""

    below: int
    missing: int
    above: int
    ahead: list[int]
    """The first ``AHEAD_NAMED`` ranks above it."""
    outside: dict[int, Outside] = field(default_factory=dict)
    """Ranks at this count stuck outside a collective (``stuck_outside``)."""

    def encode(self) -> bytes:
        """The summary as the store holds it (JSON, a few hundred bytes at most)."""
        return json.dumps([self.below, self.missing, self.above, self.ahead, self.outside]).encode()

    @classmethod
    def decode(cls, data: bytes) -> Summary:
        """The summary ``encode`` wrote."""
        below, missing, above, ahead, *rest = json.loads(data)
        outside = {int(rank): Outside(*facts) for rank, facts in rest[0].items()} if rest else {}
        return cls(below, missing, above, ahead, outside)

    def reason(self) -> str:
        """Why a rank at this count is behind every other (which ranks went on), or "" when it is not.

        Behind: no rank below, none missing, done or in another attempt, and one above.
        """
        if self.below or self.missing or not self.above:
            return ""
        if self.above <= len(self.ahead):
            return f"rank(s) {', '.join(map(str, self.ahead))} went on past it"
        return f"{self.above} ranks went on past it ({', '.join(map(str, self.ahead))}, …)"


def beat_positions(found: Sequence[Collective], entered_at: dict[str, tuple[int, float]]) -> list[list[object]]:
    """The collective positions ``found`` in the page, as a beat carries them (``Seen``): each with the wall-clock
    time its ``entered`` was first seen, kept per group in ``entered_at`` (updated)."""
    beat = []
    for position in found:
        seen = entered_at.get(position.key)
        if seen is None or seen[0] != position.entered:
            seen = entered_at[position.key] = (position.entered, time.time())
        beat.append([*position_fields(position), seen[1]])
    return beat


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
        if fields is None or fields[2] != attempt or done(fields):
            missing += 1
        elif fields[1] < count:
            below += 1
        elif fields[1] > count:
            above += 1
            if len(ahead) < AHEAD_NAMED:
                ahead.append(rank)
    return Summary(below, missing, above, ahead, stuck_outside(beats, count, attempt))


def stuck_outside(beats: Sequence[bytes | None], count: int, attempt: int) -> dict[int, Outside]:
    """The ranks at ``count`` (of ``attempt``) stuck outside a collective their peers in a group wait in.

    Only when every rank beat in ``attempt``, none is done and none is below ``count``
    (else the count of marks names who is behind, or a failure is out: no evidence).
    A rank is stuck outside group G's collective #k when it is inside no collective of
    any group, none of its groups is blind (a caller bypassed the wrappers: it might be
    waiting where they cannot see), and a peer of G is inside #k, which it has not entered.
    The innermost such group is named: Megatron-core's by ``NESTING`` (tensor-parallel
    before data-parallel, whatever their sizes), then the one with the fewest members.
    """
    fields = [json.loads(beat) if beat is not None else None for beat in beats]
    if any(f is None or f[2] != attempt or done(f) or f[1] < count for f in fields):
        return {}
    seen = [collectives(f) if f is not None else [] for f in fields]
    members: dict[str, list[tuple[int, Seen]]] = {}
    for rank, positions in enumerate(seen):
        for position in positions:
            members.setdefault(position.key, []).append((rank, position))
    found: dict[int, Outside] = {}
    for rank, f in enumerate(fields):
        mine = seen[rank]
        if f is None or f[1] != count or not mine or any(p.inside or p.blind for p in mine):
            continue
        for position in sorted(mine, key=lambda p: (_nesting(p.label), len(members[p.key]))):
            waiting = [
                (peer, p)
                for peer, p in members[position.key]
                if peer != rank and p.inside and not p.blind and p.entered > position.entered
            ]
            if waiting:
                first = min((p for _, p in waiting), key=lambda p: p.entered)
                since = min(p.since for _, p in waiting)
                peers = sorted(peer for peer, _ in waiting)[:PEERS_NAMED]
                found[rank] = Outside(position.key, position.label, first.op, first.entered, peers, since)
                break
        if len(found) >= OUTSIDE_NAMED:
            break
    return found
