"""A monitor's watch on the rendezvous store itself: silent too long, its host is named and the rank told.

Standard library only (the monitor runs as a script and imports it from its own folder).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

if __package__:
    from lifecycle._liveness import judgement
    from lifecycle._liveness.page import group_words, process_state, read_collectives, read_marks, write_verdict
    from lifecycle.journal.evidence import Kind
else:  # loaded from the monitor's folder (see monitor.py)
    import judgement  # type: ignore[import-not-found,no-redef]
    from evidence import Kind  # type: ignore[import-not-found,no-redef]
    from page import (  # type: ignore[import-not-found,no-redef]
        group_words,
        process_state,
        read_collectives,
        read_marks,
        write_verdict,
    )

STORE_MARGIN = 4
"""Intervals past the phase's conviction deadline before a silent store's host is reported (``check``)."""
RELEASE_MARGIN = 2
"""Intervals past it before a rank asleep inside a collective, its store silent, is released (``release``): sooner
than the report, as a partition's other side is released at its conviction deadline; after its own store-hosting
peer's monitor, if that peer is stopped, has convicted it (at the conviction deadline) and reset the connections."""


def check(monitor: Any, position: Any, now: float) -> None:
    """Once the store has not answered for the phase's conviction deadline plus ``STORE_MARGIN`` intervals, say so.

    The verdict goes to the log and the page (kind ``store``, no rank); in ``kill``
    mode the rank gets ``lost_signal`` (its handler raises ``StoreHostLost`` while it
    trains). The margin leaves a stopped rank that hosts the store to its own monitor,
    which names it, and whose kill resets the peers' connections first.

    A rank asleep inside a collective cannot run that handler (it waits in C++): in
    ``kill`` mode its monitor convicts it, ``collective_hang``, and kills it already
    ``RELEASE_MARGIN`` intervals past the conviction deadline (``release``): the far side
    of a partition, where no verdict can be read; its verdict is kept in its journal.
    """
    phase_s = judgement.conviction_deadline(monitor.deadlines.of(position.phase)[0], monitor.s.conviction_floor_s)
    deadline = phase_s + STORE_MARGIN * monitor.s.interval_s
    silent = now - monitor.answered
    host = f"{monitor.s.host}:{monitor.s.port}"
    host = f"{monitor.s.store_host} ({host})" if monitor.s.store_host else host
    if silent > phase_s + RELEASE_MARGIN * monitor.s.interval_s:
        release(monitor, position, now, phase_s, host)
    if silent <= deadline or monitor.lost:
        return
    monitor.lost = True
    note = (
        f"the store's host, {host}, has not answered rank {monitor.s.rank}'s monitor for {silent:.1f} s "
        f"at {position.where()} (deadline {deadline:.1f} s: the phase's conviction {phase_s:.1f} s and "
        f"{STORE_MARGIN} intervals); no failure can be announced nor a restart agreed through it"
    )
    judgement.log(f"lifecycle liveness: {note}")
    if not monitor.seen:
        write_verdict(monitor.page, json.dumps({"rank": None, "kind": "store", "host": host, "note": note}).encode())
    # Only to a rank that has a handler (lost_signal 0: none), and not once it is done (its handler may be gone).
    if monitor.s.mode == "kill" and monitor.s.lost_signal and not read_marks(monitor.page).done:
        with contextlib.suppress(ProcessLookupError):
            os.kill(monitor.s.pid, monitor.s.lost_signal)


def release(monitor: Any, position: Any, now: float, phase_s: float, host: str) -> None:
    """In ``kill`` mode, convict and kill ``monitor``'s rank if it waits asleep inside a collective, its marks still
    past the conviction deadline ``phase_s`` (``collective_hang``): cut off from the store, it can neither read a
    peer's verdict nor run its handler there (it waits in C++). A rank that trains on without the store is left to
    ``lost_signal``."""
    if monitor.s.mode != "kill" or monitor.judged or read_marks(monitor.page).done:
        return
    if now - monitor.changed <= phase_s:  # it trains on without the store (its marks move): nothing to release
        return
    state = process_state(monitor.s.pid)
    inside = [c for c in read_collectives(monitor.page) if c.inside]
    if inside and state in ("S", "D"):
        waiting = inside[0]
        group = group_words(waiting.label)
        monitor.about = {"group": group, "collective": f"{waiting.op} #{waiting.entered}", "peers": ()}
        why = (
            f"it waits in {waiting.op} #{waiting.entered} of {group} and the store's host, {host}, is unreachable: "
            "no peer's verdict can reach it, and its handler cannot run inside the collective; killed to release it"
        )
        monitor.judge(Kind.COLLECTIVE_HANG, position, now - monitor.changed, phase_s, why, state)
