"""A monitor's watch on its neighbour's monitor (rank + 1): a silent one is suspected, and only confirmed
unresponsive past the group timeout; and what a rank that died inside a collective was in with its peers.

Standard library only (the monitor runs as a script and imports it from its own folder).
"""

from __future__ import annotations

import json
import time
from typing import Any

if __package__:
    from lifecycle._liveness import judgement
    from lifecycle._liveness.page import group_words, read_collectives
    from lifecycle._liveness.summary import Outside, Seen, beat_positions, collectives, done, mismatched
    from lifecycle._liveness.wire import StoreError
    from lifecycle.journal.evidence import Evidence, Kind
else:  # loaded from the monitor's folder; the evidence module's folder is on the path (see monitor.py)
    import judgement  # type: ignore[import-not-found,no-redef]
    from evidence import Evidence, Kind  # type: ignore[import-not-found,no-redef]
    from page import group_words, read_collectives  # type: ignore[import-not-found,no-redef]
    from summary import (  # type: ignore[import-not-found,no-redef]
        Outside,
        Seen,
        beat_positions,
        collectives,
        done,
        mismatched,
    )
    from wire import StoreError  # type: ignore[import-not-found,no-redef]


def watch(monitor: Any, beat: bytes, now: float) -> None:
    """Have ``monitor`` follow its neighbour's ``beat`` (just read): a silent one is suspected unresponsive, never
    a failure.

    Silent past ``max(4 intervals, floor)``: a ``suspicion`` (journaled, logged),
    withdrawn when it beats again. Only a silence that outlasts the group timeout
    (``group_timeout_s``; never when it is 0) is published as the failure notice and
    verdict, by one rank (the one whose ``add`` on the beat comes first), after a
    confirming read: by then every collective waiting for it has timed out, and a
    monitor that merely missed beats is never "failed first" for a later failure.
    """
    key = f"{monitor.s.prefix}/liveness/hb/{monitor.neighbour}"
    fields = json.loads(beat)
    number, _, _, step, phase = fields[:5]
    if beat != monitor.neighbour_beat:
        monitor.neighbour_beat, monitor.neighbour_changed = beat, now
        if monitor.neighbour_suspected:  # every suspicion ends: this one when the neighbour beats, done or not
            monitor.neighbour_suspected = False
            judgement.log(
                f"lifecycle liveness: suspicion of rank {monitor.neighbour} withdrawn: its monitor beats again"
            )
            monitor.append(judgement.withdrawal_line(monitor.s.origin, monitor.neighbour, step, phase))
        return
    if done(fields):
        return
    silent = now - monitor.neighbour_changed
    if silent <= max(4 * monitor.s.interval_s, monitor.s.floor_s):
        return
    where = f"phase {phase}" if step is None else f"step {step}, phase {phase}"
    facts = Evidence(Kind.UNRESPONSIVE.value, monitor.neighbour, step, phase, "", silent, None, "neighbour")
    if not monitor.neighbour_suspected:
        monitor.neighbour_suspected = True
        judgement.log(
            f"lifecycle liveness: rank {monitor.neighbour} suspected unresponsive: its monitor has not beaten for "
            f"{silent:.1f} s (last at {where}); a suspicion only, unless it outlasts the group timeout"
        )
        monitor.append(judgement.suspicion_line(monitor.s.origin, facts, ""))
    if not monitor.s.group_timeout_s or silent <= monitor.s.group_timeout_s:
        return
    try:
        # One confirmer per silent beat: the rank whose add on it comes first.
        if monitor.store.add(f"{monitor.s.prefix}/liveness/confirm/{monitor.neighbour}/{number}", 1) != 1:
            monitor.neighbour_changed = now + 3600.0  # another rank confirms; stop asking
            return
        if monitor.store.get(key) != beat:  # the confirming read: it beat meanwhile after all
            monitor.neighbour_changed = now
            return
    except StoreError:
        return
    note = (
        f"rank {monitor.neighbour} {Kind.UNRESPONSIVE.words}: its monitor has not beaten for {silent:.1f} s "
        f"(last at {where}; its host or monitor is gone, no connection reset)"
    )
    monitor.publish(facts, note, pid=0)
    monitor.record(facts, note)
    monitor.neighbour_changed = now + 3600.0


def cut_off(monitor: Any) -> tuple[Kind | None, str]:
    """``(COLLECTIVE_HANG, why)`` when ``monitor``'s rank waits inside a collective of a group its silent neighbour
    is in (its monitor has not beaten for ``max(4 intervals, floor)``: a partition, a lost host), else
    ``(None, "")``.

    The neighbour cannot leave the collective with it, nor ever be judged here: the
    rank is released (convicted and killed) at the conviction deadline, not the group
    timeout. A neighbour whose monitor merely stalls is never in this position: the
    rank would not wait for it inside a collective for the conviction deadline.
    """
    last = collectives(json.loads(monitor.neighbour_beat or b"[]"))
    for mine in (c for c in read_collectives(monitor.page) if c.inside):
        if any(seen.key == mine.key for seen in last):
            group = group_words(mine.label)
            collective = f"{mine.op} #{mine.entered}"
            monitor.about = {"group": group, "collective": collective, "peers": (monitor.neighbour,)}
            silent = time.monotonic() - monitor.neighbour_changed
            return Kind.COLLECTIVE_HANG, (
                f"it waits in {collective} of {group} with rank {monitor.neighbour}, whose monitor has been silent "
                f"for {silent:.1f} s (cut off: a partition or a lost host): no rank can leave it"
            )
    return None, ""


def died_inside(monitor: Any) -> Outside | None:
    """The desync ``monitor``'s rank died of, when it died inside collective #k of a group whose peers entered #k
    with another op or size (``summary.mismatched``; gloo aborts the rank that receives more than its tensor holds);
    None otherwise. Sets ``monitor.about`` (group, collective, peers, call sites) when found.

    Read from the peers' beats: until each shows #k entered, or its rank done (its last
    beat keeps its positions), or its beat is at this rank's step or past it without the
    group (not a member: another tensor-parallel pair), or two intervals passed. A beat from
    before (setup, an earlier step) may lack a group its rank has joined since: waited on.
    Only a rank that died inside a collective waits; one that died anywhere else is named at
    once.
    """
    inside = [c for c in read_collectives(monitor.page) if c.inside]
    if not inside or monitor.s.world_size < 2:
        return None
    mine = collectives([*[None] * 6, beat_positions(inside, monitor.entered_at)])  # as a beat would carry them
    keys = [f"{monitor.s.prefix}/liveness/hb/{rank}" for rank in range(monitor.s.world_size)]
    step = monitor.last.step if monitor.last is not None else None
    deadline = time.monotonic() + 2 * monitor.s.interval_s
    while True:
        try:
            beats = monitor.store.multi_get(keys)
        except StoreError:
            return None
        members: dict[str, list[tuple[int, Seen]]] = {p.key: [(monitor.s.rank, p)] for p in mine}
        settled = True
        for rank, beat in enumerate(beats):
            fields = json.loads(beat) if beat is not None and rank != monitor.s.rank else None
            if fields is None:
                continue
            for seen in collectives(fields):
                if seen.key in members:
                    members[seen.key].append((rank, seen))
            shown = {p.key: p.entered for p in collectives(fields)}
            level = step is not None and isinstance(fields[3], int) and fields[3] >= step  # not a beat from before
            settled &= done(fields) or all(
                shown[p.key] >= p.entered if p.key in shown else level for p in mine
            )  # a group a beat as far on as this rank lacks: the peer is not in it
        found = mismatched(monitor.s.rank, mine, members)
        if found is not None or settled or time.monotonic() >= deadline:
            break
        time.sleep(min(0.05, monitor.s.interval_s / 4))
    if found is not None:
        monitor.about = {
            "group": group_words(found.label),
            "collective": f"{found.op} #{found.number}",
            "peers": tuple(found.peers),
            "sites": found.sites,
        }
    return found
