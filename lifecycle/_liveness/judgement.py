"""Suspicion, then conviction: the monitor's rules for when evidence against a rank is enough to kill it.

Standard library only (the monitor runs as a script and imports it from its own folder).

A rank past its phase's (suspicion) deadline with evidence against it (``/proc`` says
stopped, spinning, or asleep while every peer went on) is *suspected*: journaled
(``suspicion``, with its evidence) and logged, never published as a failure. The
suspicion is *withdrawn* (``withdrawal``) when the rank makes progress or the evidence
stops holding (a stopped rank resumed, a spinning one went to sleep). It is *convicted*
(verdict, failure notice, kill in ``kill`` mode) only when the same evidence still holds
at the conviction deadline, ``max(suspicion deadline, conviction floor)``, re-read from
the marks and ``/proc`` at that moment and once more just before any signal (``holds``).
Proof needs no wait: a rank whose process is gone is convicted at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

if __package__:
    from lifecycle.journal.evidence import VERDICT_PREFIX, Evidence, Kind
else:  # loaded from the monitor's folder; the evidence module's folder is on the path (see monitor.py)
    from evidence import VERDICT_PREFIX, Evidence, Kind  # type: ignore[import-not-found,no-redef]

DUMP_WAIT_S = 0.5
"""The longest the monitor waits for a rank's stack dump."""
STATES = {
    Kind.STOPPED: ("T", "t"),
    Kind.SPINNING: ("R",),
    Kind.HANG: ("S", "D", "I"),
    Kind.STUCK_OUTSIDE: ("S", "D", "I"),
    Kind.DESYNC: ("S", "D", "I"),
    Kind.COLLECTIVE_HANG: ("S", "D", "I"),
}
"""The ``/proc`` state letters that keep each kind of suspicion standing."""


@dataclass
class Suspect:
    """A rank under suspicion: ``kind``, since when (``since``, monotonic), at which ``count`` of marks, ``facts``,
    its ``collectives`` ((entered, left) per group) and ``why`` (the words of the evidence)."""

    kind: Kind
    since: float
    count: int
    facts: Evidence
    collectives: tuple[tuple[int, int], ...] = ()
    why: str = ""


def log(line: str) -> None:
    """Write ``line`` to the monitor's standard error (the rank's log); never raises."""
    with contextlib.suppress(OSError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def conviction_deadline(suspicion_s: float, floor_s: float) -> float:
    """How long a position must stand still before a suspicion on it may convict: ``max(suspicion_s, floor_s)``."""
    return max(suspicion_s, floor_s)


def holds(
    suspect: Suspect, count: int, done: bool, state: str | None, collectives: tuple[tuple[int, int], ...] = ()
) -> bool:
    """Whether ``suspect``'s evidence still holds on a fresh read: same count of marks and collective positions
    (``collectives``, as ``Suspect.collectives``), not done, a matching state.

    ``state``: the rank's ``/proc`` state letter now (None: its process is gone, which
    is other evidence: the ``died`` verdict, not this one).
    """
    return (
        not done
        and count == suspect.count
        and collectives == suspect.collectives
        and state is not None
        and state in STATES.get(suspect.kind, ())
    )


def verdict_line(
    origin: dict[str, object], facts: Evidence, note: str, seq: int | None, stacks: str, killed: bool
) -> dict[str, Any]:
    """A ``lifecycle.journal`` ``verdict`` record (its JSON object, without ``version``)."""
    return {
        "kind": "verdict",
        **origin,
        "culprit": facts.rank,
        "verdict": facts.kind,
        "phase": facts.phase,
        "step": facts.step,
        "note": note,
        "time": time.time(),
        "seq": seq,
        "stacks": stacks,
        "evidence": facts.to_json(),
        "killed": killed,
    }


def suspicion_line(origin: dict[str, object], facts: Evidence, stacks: str) -> dict[str, Any]:
    """A ``lifecycle.journal`` ``suspicion`` record (its JSON object, without ``version``)."""
    return {
        "kind": "suspicion",
        **origin,
        "culprit": facts.rank,
        "evidence": facts.to_json(),
        "time": time.time(),
        "stacks": stacks,
    }


def withdrawal_line(origin: dict[str, object], culprit: int, step: int | None, phase: str) -> dict[str, Any]:
    """A ``lifecycle.journal`` ``withdrawal`` record (its JSON object, without ``version``)."""
    return {"kind": "withdrawal", **origin, "culprit": culprit, "time": time.time(), "step": step, "phase": phase}


def append_line(path: str, data: bytes) -> None:
    """Append ``data`` (one journal line) to ``path`` in one ``write`` on a file opened for appending.

    The monitor's records and the rank's, each appended so, never interleave; after a
    torn line (a writer killed mid-line) ``data`` starts a line of its own. Raises
    ``OSError`` when the file cannot be opened or written.
    """
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        os.write(fd, data)
    finally:
        os.close(fd)


def append(path: str, version: int, line: dict[str, Any]) -> str:
    """Append ``line`` (with ``version`` first) to the journal at ``path`` (``append_line``); "" or why it failed.

    Never raises; an empty ``path`` (no journal) appends nothing.
    """
    if not path:
        return ""
    try:
        append_line(path, (json.dumps({"version": version, **line}) + "\n").encode())
    except OSError as exc:
        return str(exc)
    return ""


def open_pidfd(pid: int) -> int:
    """A pidfd on ``pid`` (signals through it cannot reach a process that reused the id), or -1 where none."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return -1
    try:
        return int(opener(pid))
    except OSError:
        return -1


def send(pid: int, pidfd: int, signum: int) -> bool:
    """Send ``signum`` to the rank (through ``pidfd`` when there is one); False if it is gone."""
    try:
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def publish(store: Any, prefix: str, facts: Evidence, note: str, pid: int) -> tuple[int, int, bytes]:
    """Publish the failure notice of the rank ``facts`` name and the verdict through ``store`` (the monitor's client).

    Both carry the evidence as typed fields (``kind``, ``evidence``) beside the words.
    Returns the notice's sequence number, the verdict's number (1: the attempt's first)
    and the verdict as stored; the store's error propagates.
    """
    now = time.time()
    rank, phase, step = facts.rank, facts.phase, facts.step
    seq = int(store.add(f"{prefix}/failures/count", 1))
    notice = {
        "rank": rank,
        "host": socket.gethostname(),
        "pid": pid,
        "phase": phase,
        "step": step,
        "error": f"{VERDICT_PREFIX}{note}"[:300],
        "time": now,
        "seq": seq,
        "kind": facts.kind,
        "evidence": facts.to_json(),
    }
    store.set(f"{prefix}/failures/{seq}", json.dumps(notice).encode())
    n = int(store.add(f"{prefix}/liveness/verdicts", 1))
    verdict = {"rank": rank, "kind": facts.kind, "phase": phase, "step": step, "note": note, "time": now}
    text = json.dumps({**verdict, "evidence": facts.to_json()}).encode()
    store.set(f"{prefix}/liveness/verdict/{n}", text)
    return seq, n, text


def stopped_after_a_peer(monitor: Any, position: Any, age: float, deadline: float, state: str | None) -> None:
    """Convict ``monitor``'s rank, stopped (``T``) for two intervals or more, once a peer's failure notice is out.

    A stopped rank can neither fail on its own nor act on the launcher's SIGTERM: after a
    peer failed (its collective or store wait ran into this rank, or it failed of its
    own), waiting for the phase's deadline (``default_deadline_s`` before calibration)
    holds every rank for the launcher's whole stop grace (torchrun: 30 s more). The
    peer's notice is the corroboration the deadline stands for; the conviction goes
    through ``monitor.judge`` (the re-read before any signal). Kill mode only; one store
    request a tick, and only while the rank is stopped; a store that fails judges nothing.
    """
    s = monitor.s
    if s.mode != "kill" or monitor.judged or state not in STATES[Kind.STOPPED] or age < 2 * s.interval_s:
        return
    try:
        if int(monitor.store.add(f"{s.prefix}/failures/count", 0)) < 1:
            return
        notice = json.loads(monitor.store.get(f"{s.prefix}/failures/1") or b"{}")
    except Exception:  # noqa: BLE001 - a store that fails or a notice not written yet: the next tick
        return
    peer = notice.get("rank")
    if not isinstance(peer, int) or peer == s.rank:
        return
    why = (
        f"its process is stopped (state {state}) and rank {peer} failed meanwhile "
        f"({str(notice.get('error', ''))[:120]}): convicted before its deadline, corroborated, killed without "
        "resuming it for its stacks (it would act on the launcher's pending SIGTERM first)"
    )
    monitor.corroborated = True
    monitor.judge(Kind.STOPPED, position, age, deadline, why, state)


def publish_resumed(publish: Callable[[bool], bool | None], seconds: float, pause: float) -> bool | None:
    """``publish(quiet)`` tried for ``seconds`` through a store its host (the rank, just resumed) froze.

    The server first serves the connections queued while it was stopped: a call may time
    out meanwhile, so the publish is tried again (each try bounded by the store timeout,
    ``quiet`` until the last) until it goes through (True/False) or the time is up (None).
    """
    deadline = time.monotonic() + seconds
    while True:
        first = publish(time.monotonic() < deadline)
        if first is not None or time.monotonic() >= deadline:
            return first
        time.sleep(pause)


def dump(pid: int, pidfd: int, signum: int, stacks: str, *, resume: bool) -> None:
    """Have the rank write its stacks into ``stacks`` (``signum``: its ``faulthandler``'s); wait for the file.

    ``resume``: the rank is stopped: the signal stays pending until SIGCONT, sent next.
    The handler writes the dump at once, from C; this returns as soon as the file stops
    growing (at most ``DUMP_WAIT_S``), before a resumed rank's code runs far.
    """
    before = _size(stacks)
    if not send(pid, pidfd, signum) or (resume and not send(pid, pidfd, signal.SIGCONT)):
        return
    deadline = time.monotonic() + DUMP_WAIT_S
    size, steady = before, 0
    while time.monotonic() < deadline and steady < 2:
        time.sleep(0.002)
        now = _size(stacks)
        steady = steady + 1 if now > before and now == size else 0
        size = now


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
