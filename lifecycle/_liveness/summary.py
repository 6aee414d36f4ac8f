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
    from lifecycle._liveness.page import Collective, group_words, position_fields, tensor_words
else:  # loaded from the monitor's folder (see monitor.py)
    from page import Collective, group_words, position_fields, tensor_words  # type: ignore[import-not-found,no-redef]

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
    site: str = ""

    @property
    def inside(self) -> bool:
        """Whether the rank is inside a collective of this group."""
        return self.entered > self.left


def collectives(fields: Sequence[object]) -> list[Seen]:
    """A beat's collective positions, one per group (``[..., "done" or "", [[key, label, entered, ...], ...]]``)."""
    found = fields[6] if len(fields) > 6 else []
    return [Seen(*position) for position in found] if isinstance(found, list) else []


class Outside(NamedTuple):
    """Why a rank is named inside the step: stuck outside a collective (``kind`` ``stuck_outside``) or in one its
    peers never entered (``desync``). The group (``key``, ``label`` in words), the collective (``op`` #``number``:
    the one it did not enter, or the one it waits in), the ranks on the other side (``peers``, the first
    ``PEERS_NAMED``), since when (wall), for a desync what they wait in (``theirs``), and where the collectives
    named were called (``sites``: ``all_reduce #101 of the data-parallel group at _training/pretrain.py:550 in
    <lambda> by rank(s) 0``, ``; ``-joined: ``called``)."""

    key: str
    label: str
    op: str
    number: int
    peers: list[int]
    since: float
    kind: str = "stuck_outside"
    theirs: str = ""
    sites: str = ""

    def stands(self, now: Sequence[Collective]) -> bool:
        """Whether the rank's collective positions ``now`` (fresh from its page) still show this: stuck outside, in
        no collective, #``number`` not entered; in a desync, still inside #``number``."""
        mine = next((c for c in now if c.key == self.key), None)
        if mine is None:
            return False
        if self.kind in ("desync", "collective_hang"):
            return mine.inside and mine.entered == self.number
        return mine.entered < self.number and not any(c.inside for c in now)

    def why(self, where: str, now: float) -> str:
        """The words of the evidence, for a rank at ``where`` (``Position.where``), at ``now`` (wall clock); the call
        sites last."""
        return self._words(where, now) + (f"; called: {self.sites}" if self.sites else "")

    def _words(self, where: str, now: float) -> str:
        peers, waited = ", ".join(map(str, self.peers)), max(0.0, now - self.since)
        if self.kind == "collective_hang":
            return (
                f"it waits in {where} in {self.op} #{self.number} of {group_words(self.label)}, which every rank of "
                f"the group entered {waited:.1f} s ago and none left (rank(s) {peers} too, all asleep in it)"
            )
        if self.kind == "desync":
            return (
                f"it waits in {where} in {self.op} #{self.number} of {group_words(self.label)} (for {waited:.1f} s), "
                f"which rank(s) {peers} never entered: they wait in {self.theirs}"
            )
        return (
            f"it is stuck in {where} before {self.op} #{self.number} of {group_words(self.label)}, which rank(s) "
            f"{peers} entered {waited:.1f} s ago and wait in"
        )


SIZED = frozenset(
    {
        "all_reduce",
        "reduce",
        "broadcast",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_single",
        "_all_gather_base",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "reduce_scatter_single",
        "_reduce_scatter_base",
    }
)
"""The collectives whose tensor must have the same size and dtype on every rank (the fingerprint is compared);
an uneven all_to_all, a gather's or scatter's root and the object collectives legitimately differ."""


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
        beat.append([*position_fields(position), seen[1], position.site])
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
    return Summary(below, missing, above, ahead, in_the_step(beats, count, attempt))


def in_the_step(beats: Sequence[bytes | None], count: int, attempt: int) -> dict[int, Outside]:
    """The ranks at ``count`` (of ``attempt``) named inside the step, by their collective positions.

    Only when every rank beat in ``attempt``, none is done and none is below ``count``
    (else the count of marks names who is behind, or a failure is out: no evidence), and
    never a rank with a blind group (a caller bypassed the wrappers: it might be waiting
    where they cannot see): ``desynced`` or ``hung_inside`` for a rank inside a collective,
    ``outside`` for one in none.
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
        if f is None or f[1] != count or not mine or any(p.blind for p in mine):
            continue
        if any(p.inside for p in mine):
            named = desynced(rank, mine, members) or hung_inside(rank, mine, members, fields)
        else:
            named = outside(rank, mine, members)
        if named is not None:
            found[rank] = named
        if len(found) >= OUTSIDE_NAMED:
            break
    return found


def outside(rank: int, mine: list[Seen], members: dict[str, list[tuple[int, Seen]]]) -> Outside | None:
    """``rank``, inside no collective, is stuck outside group G's collective #k when a peer of G is inside #k, which
    it has not entered. The innermost such group is named: Megatron-core's by ``NESTING`` (tensor-parallel before
    data-parallel, whatever their sizes), then the one with the fewest members."""
    for position in sorted(mine, key=lambda p: _outer(p, members)):
        waiting = [
            (peer, p)
            for peer, p in members[position.key]
            if peer != rank and p.inside and not p.blind and p.entered > position.entered
        ]
        if waiting:
            first = min((p for _, p in waiting), key=lambda p: p.entered)
            since = min(p.since for _, p in waiting)
            peers = sorted(peer for peer, _ in waiting)[:PEERS_NAMED]
            return Outside(position.key, position.label, first.op, first.entered, peers, since, sites=called(waiting))
    return None


def desynced(rank: int, mine: list[Seen], members: dict[str, list[tuple[int, Seen]]]) -> Outside | None:
    """``rank``, inside collective #k of group G, is named for a desync when

    - a peer inside #k of G called another op (neither an object collective), or one in
      ``SIZED`` on a tensor of another size or dtype: the minority is named (on a tie, the
      side without the lowest rank);
    - or a peer of G that never entered #k waits inside collective #m of another group H,
      which this rank never entered: each waits for the other. The one waiting in the
      outer group went past the inner one's collective and is named (``NESTING``, then
      the bigger group; on a tie the higher rank).
    """
    for position in (p for p in mine if p.inside):
        level = [(peer, p) for peer, p in members[position.key] if p.inside and p.entered == position.entered]
        classes: dict[tuple[str, int], list[int]] = {}
        for peer, p in level:
            if "_object" in p.op:
                classes = {}
                break
            classes.setdefault((p.op, p.fingerprint if p.op in SIZED else 0), []).append(peer)
        if len(classes) > 1:
            own = next(ranks for ranks in classes.values() if rank in ranks)
            largest = max(len(ranks) for ranks in classes.values())
            if len(own) < largest or (len(own) == largest and min(peer for peer, _ in level) not in own):
                others = sorted(peer for peer, _ in level if peer not in own)[:PEERS_NAMED]
                theirs = ", ".join(sorted({p.op for peer, p in level if peer not in own}))
                number = f"{theirs} #{position.entered} of {group_words(position.label)}, with another op or size"
                return Outside(
                    position.key,
                    position.label,
                    position.op,
                    position.entered,
                    others,
                    position.since,
                    "desync",
                    number,
                    called(level),
                )
        cycle: list[tuple[int, Seen]] = []
        for peer, p in members[position.key]:
            if peer == rank or p.entered >= position.entered:
                continue
            for other in (q for q in _positions(members, peer) if q.inside and q.key != position.key):
                me_there = next((q for r, q in members[other.key] if r == rank), None)
                if me_there is None or me_there.entered >= other.entered:
                    continue
                if (_outer(position, members), rank) > (_outer(other, members), peer):
                    cycle.append((peer, other))
                    break
        if cycle:
            other = cycle[0][1]
            where = f"{other.op} #{other.entered} of {group_words(other.label)}, which it never entered"
            peers = sorted(peer for peer, _ in cycle)[:PEERS_NAMED]
            sites = called([(rank, position), *cycle])
            return Outside(
                position.key, position.label, position.op, position.entered, peers, position.since, "desync", where,
                sites,
            )  # fmt: skip
    return None


def mismatched(rank: int, mine: list[Seen], members: dict[str, list[tuple[int, Seen]]]) -> Outside | None:
    """What ``rank``, which died inside collective #k of group G, was in with peers of G that entered the same #k with
    another op or, for an op in ``SIZED``, on a tensor of another size or dtype: a ``desync`` it died of (gloo aborts
    the rank that receives more than its tensor holds); None when no peer's beat shows one. Object collectives never
    count. Unlike ``desynced``, nobody is picked as the minority: the rank that died is the one named, and the
    words say what each side called."""
    for position in (p for p in mine if p.inside):
        if "_object" in position.op:
            continue
        other = [
            (peer, p)
            for peer, p in members.get(position.key, [])
            if peer != rank
            and p.entered == position.entered
            and "_object" not in p.op
            and (p.op != position.op or (p.op in SIZED and p.fingerprint != position.fingerprint))
        ]
        if other:
            sides: dict[str, list[int]] = {}
            for peer, p in other:
                sides.setdefault(f"{p.op} on {tensor_words(p.fingerprint)}", []).append(peer)
            theirs = "; ".join(
                f"rank(s) {', '.join(map(str, sorted(ranks)[:PEERS_NAMED]))} called {call}"
                for call, ranks in sides.items()
            )
            words = f"{theirs}, this rank {position.op} on {tensor_words(position.fingerprint)}"
            peers = sorted(peer for peer, _ in other)[:PEERS_NAMED]
            return Outside(
                position.key, position.label, position.op, position.entered, peers, position.since, "desync", words,
                called([(rank, position), *other]),
            )  # fmt: skip
    return None


def hung_inside(
    rank: int, mine: list[Seen], members: dict[str, list[tuple[int, Seen]]], fields: Sequence[Sequence[object] | None]
) -> Outside | None:
    """``rank`` is hung inside collective #k of group G when every rank of G (two or more) is inside #k, the same
    op, and asleep in it (``/proc`` ``S`` or ``D``, as each beat says: a stopped or running one is its own monitor's
    to name). Nobody can make progress there: a broken link, a partition, a wedged transport."""
    for position in (p for p in mine if p.inside):
        group = members[position.key]
        if len(group) < 2:
            continue
        asleep = all(_state(fields[peer]) in ("S", "D") for peer, _ in group)
        level = all(p.inside and p.entered == position.entered and p.op == position.op for _, p in group)
        if asleep and level:
            peers = sorted(peer for peer, _ in group if peer != rank)[:PEERS_NAMED]
            since = min(p.since for _, p in group)
            return Outside(
                position.key, position.label, position.op, position.entered, peers, since, "collective_hang", "",
                called(group),
            )  # fmt: skip
    return None


SITES_NAMED = 3
"""How many distinct call sites one verdict names."""


def called(entries: Sequence[tuple[int, Seen]]) -> str:
    """Where the collectives of ``entries`` (rank, its position) were called, one clause per distinct collective and
    site (``all_reduce #101 of the data-parallel group at pretrain.py:398 in train_step by rank(s) 0, 2``), the
    first ``SITES_NAMED``; "" when no rank's site is known."""
    by: dict[tuple[str, int, str, str], list[int]] = {}
    for rank, position in entries:
        if position.site:
            by.setdefault((position.op, position.entered, position.label, position.site), []).append(rank)
    for ranks in by.values():
        ranks.sort()
    clauses = [
        f"{op} #{number} of {group_words(label)} at {site} by rank(s) {', '.join(map(str, ranks[:PEERS_NAMED]))}"
        for (op, number, label, site), ranks in sorted(by.items(), key=lambda item: min(item[1]))
    ]
    return "; ".join(clauses[:SITES_NAMED])


def _state(fields: Sequence[object] | None) -> str:
    """The ``/proc`` state letter a beat carries ("" if none)."""
    return str(fields[7]) if fields is not None and len(fields) > 7 else ""


def _positions(members: dict[str, list[tuple[int, Seen]]], rank: int) -> list[Seen]:
    return [p for group in members.values() for r, p in group if r == rank]


def _outer(position: Seen, members: dict[str, list[tuple[int, Seen]]]) -> tuple[int, int]:
    """How far out ``position``'s group is: its ``NESTING`` place, then its number of members."""
    return _nesting(position.label), len(members[position.key])
