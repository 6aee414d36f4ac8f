"""A rank's liveness monitor: its own process, standard library only, that tells a wedged rank apart and ends it.

Runs as ``python -S -E -s monitor.py '<json settings>' <marks page>``, started by the rank
it watches (``lifecycle._liveness.rank``; the settings: ``lifecycle._liveness.settings``).
It imports nothing of lifecycle, torch or site-packages, so it starts fast and small (see
docs/benchmarks.md, monitor-cost). It reads the rank's progress marks from a shared page
(``Marks``; its layout: ``lifecycle._liveness.page``), speaks the ``TCPStore`` wire
protocol itself (``StoreClient``: every call bounded by a socket timeout), and dies with
its rank (``PR_SET_PDEATHSIG``, after which it reports the death).

Every ``interval_s`` it

- reads the marks; the position is *stale* when its count has not changed for longer
  than the phase's deadline, on this process's monotonic clock;
- beats: sets ``<prefix>/liveness/hb/<rank>`` to its beat count and the position (one
  store write per interval, none per step);
- reads, in one request (``look``), its neighbour's beat and, until it has seen one,
  the attempt's first verdict;
- watches one neighbour (rank + 1) by its beat count; a neighbour silent for
  ``max(4 intervals, floor)`` is suspected (journaled, withdrawn when it beats); one silent
  past the group timeout (a monitor whose rank is done says so in its last beat) is
  confirmed by one rank, the one whose store ``add`` on
  ``<prefix>/liveness/confirm/<rank>/<beat>`` returns 1, which reads it once more and
  publishes it as unresponsive;
- classifies its own rank when stale, from ``/proc/<pid>/stat``: ``T`` stopped, ``R``
  spinning (two ticks in a row), ``S``/``D`` waiting in its phase, but only when its
  count of marks is the lowest of all ranks and below another's (behind: a rank waiting
  in a collective for a peer is ahead of it, or level with it, never named), no rank is
  done (a peer that failed first is no evidence), and no verdict is out yet (the ranks
  a culprit leaves waiting are its victims); one rank per count reads all positions
  (``behind``), never all ranks; level, it may be *stuck outside* a collective or in a
  *desync*, by the collective positions its rank writes in the page (``summary.in_the_step``);
- watches the store itself: silent (every read failing or timing out) for longer than
  the phase's conviction deadline plus ``store_watch.STORE_MARGIN`` intervals, its host is named and, in
  ``kill`` mode, the rank is told (``check_store``).

Past the deadline the rank is only suspected; the verdict waits for the conviction
deadline with the evidence re-read (``lifecycle._liveness.judgement``).
A verdict on its own rank (kind ``stopped``, ``spinning``, ``hang``, or ``died`` when
the rank's process is gone without saying it was done) is published as the rank's
failure notice (``<prefix>/failures/<seq>``, the format of ``lifecycle._torch.notice``)
and as ``<prefix>/liveness/verdict/<n>``; then, unless ``mode`` is ``report``, the
monitor has the rank dump its Python stacks (the signal lifecycle registered with
``faulthandler``; sent before SIGCONT to a stopped rank, where it stays pending) into
the side file, and kills it (SIGCONT, SIGKILL), so its gloo peers get a connection reset.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import select
import signal
import sys
import time
from typing import Any

if __package__:
    from lifecycle._liveness import judgement, neighbour, store_watch
    from lifecycle._liveness.deadlines import LOOP_PHASES, Deadlines
    from lifecycle._liveness.page import (
        PAGE_SIZE,
        Position,
        group_words,
        process_state,
        read_collectives,
        read_marks,
        write_verdict,
    )
    from lifecycle._liveness.parking import next_attempt, start_watching
    from lifecycle._liveness.settings import Settings
    from lifecycle._liveness.summary import Outside, Summary, beat_positions, summarize
    from lifecycle._liveness.wire import StoreClient, StoreError
    from lifecycle.journal.evidence import Evidence, Kind
else:  # run as a script (python -S -E -s monitor.py): its folder is on the path; never import the package (torch)
    # The evidence module is standard library only, like this folder's: loaded from its file, not its package.
    sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "journal"))
    import judgement  # type: ignore[import-not-found,no-redef]
    import neighbour  # type: ignore[import-not-found,no-redef]
    import store_watch  # type: ignore[import-not-found,no-redef]
    from deadlines import LOOP_PHASES, Deadlines  # type: ignore[import-not-found,no-redef]
    from evidence import Evidence, Kind  # type: ignore[import-not-found,no-redef]
    from page import (  # type: ignore[import-not-found,no-redef]
        PAGE_SIZE,
        Position,
        group_words,
        process_state,
        read_collectives,
        read_marks,
        write_verdict,
    )
    from parking import next_attempt, start_watching  # type: ignore[import-not-found,no-redef]
    from settings import Settings  # type: ignore[import-not-found,no-redef]
    from summary import Outside, Summary, beat_positions, summarize  # type: ignore[import-not-found,no-redef]
    from wire import StoreClient, StoreError  # type: ignore[import-not-found,no-redef]

JOURNAL_VERSION = 4
"""The ``lifecycle.journal`` schema version of the verdict records this monitor writes (a test keeps it equal)."""

# -- the monitor -------------------------------------------------------------------------

NO_VERDICT = b"-"
"""What ``<prefix>/liveness/verdict/1`` holds until the attempt's first verdict is published."""
_log = judgement.log
INSIDE = (
    Kind.STUCK_OUTSIDE,
    Kind.DESYNC,
    Kind.COLLECTIVE_HANG,
)  # named by collective positions: the evidence names group and collective
RESUME_WAIT = 2
"""Intervals a stopped rank's monitor retries its verdict through the store it hosts, once resumed."""


class Monitor:
    """One rank's monitor; ``run`` loops until the rank says it is done, dies, or is judged."""

    def __init__(self, settings: Settings, page: mmap.mmap, wake: int) -> None:
        self.s = settings
        self.page = page
        self.wake = wake
        self.store = StoreClient(settings.host, settings.port, settings.store_timeout_s)
        self.deadlines = Deadlines(
            settings.floor_s,
            settings.default_deadline_s,
            dict(settings.deadlines),
            uncalibrated_s=settings.conviction_floor_s,
        )
        self.beats = 0
        self.last: Position | None = None
        self.changed = time.monotonic()
        self.step_changed = self.changed
        self.step_seen: int | None = None
        self.running_ticks = 0
        self.neighbour = (settings.rank + 1) % settings.world_size
        self.neighbour_beat: bytes | None = None
        self.neighbour_changed = self.changed
        self.judged = False
        self.seen = False
        self.parent_died = False
        self.seq: int | None = None  # the sequence number of the last notice published
        self.answered = self.changed  # when the store last answered a read
        self.lost = False  # the store's host was found silent past its deadline
        self.placed = False  # the attempt's first verdict key is known to be set (NO_VERDICT until one is)
        self.gather_round_s = max(2 * settings.interval_s, 0.5)
        self.asked: tuple[int, int] | None = None  # the (count, round) this rank last asked about
        self.lowest: tuple[tuple[int, int], Summary] | None = None  # and the summary it got
        self.suspect: judgement.Suspect | None = None  # this rank, suspected and not (yet) convicted
        self.neighbour_suspected = False  # the neighbour's monitor is silent: suspected unresponsive
        self.pidfd = judgement.open_pidfd(settings.pid)
        self.corroborated = False  # convicted stopped after a peer's failure (judgement.stopped_after_a_peer)
        self.entered_at: dict[str, tuple[int, float]] = {}  # per group: the entered number, first seen when (wall)
        self.about: dict[str, Any] = {}  # the group, collective and peers of an INSIDE suspicion (behind)
        self.outside: Outside | None = None  # and what the summary said of it

    def close(self) -> None:
        """Release what this attempt's watch holds: the store connection, the pidfd, the marks page."""
        self.store.close()
        with contextlib.suppress(OSError):  # -1 (no pidfd here): EBADF
            os.close(self.pidfd)
        self.page.close()

    def run(self) -> int:
        """The loop; returns the exit code."""
        try:
            self.store.connect()
        except StoreError as exc:
            _log(f"rank {self.s.rank}: the store is unreachable for now: {exc}")
        while True:
            now = time.monotonic()
            position = read_marks(self.page)
            if position.done:
                if self.suspect is not None and not self.judged:  # every suspicion ends: convicted or withdrawn
                    self.withdraw(position, "it is done (finished, or failing on its own)")
                self.beat(position, done=True)  # a last beat that says so: the neighbour stops watching
                return 0
            self.observe(position, now)
            if self.parent_died or process_state(self.s.pid) is None:
                if not self.judged and not read_marks(self.page).done:
                    self.judge(Kind.DIED, position, now - self.changed, None, "its process is gone")
                return 0
            if not self.judged:  # first, from /proc: a frozen store must not delay it
                self.classify(position, now)
            # The store's part of the tick, one write and one read: after a call fails (or times out), none more.
            if self.beat(position) and self.look(now):
                self.answered = now
            elif not self.lost:
                self.check_store(position, now)
            left = now + self.s.interval_s - time.monotonic()
            ready, _, _ = select.select([self.wake], [], [], max(0.0, left))
            if ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake, 64)

    def observe(self, position: Position, now: float) -> None:
        """Note a change of position (and calibrate on how long the previous one lasted)."""
        last = self.last
        if last is None or position.count != last.count or position.attempt != last.attempt:
            if last is not None and last.phase not in LOOP_PHASES:
                self.deadlines.sample(last.phase, now - self.changed)
            if last is not None and position.step != last.step and position.phase in LOOP_PHASES:
                if last.phase in LOOP_PHASES and position.step is not None and self.step_seen is not None:
                    # Steps shorter than an interval: the mean over the steps made since the last look.
                    steps = max(1, position.step - self.step_seen)
                    self.deadlines.sample("step", (now - self.step_changed) / steps, steps)
                self.step_changed, self.step_seen = now, position.step
            if position.phase in LOOP_PHASES:  # steps made between two looks (all of them, steps this short) count
                self.deadlines.reached(position.phase, position.steps)
            self.last = position
            self.changed = now
            self.running_ticks = 0
            if self.suspect is not None:
                self.withdraw(position, "it made progress")

    def beat(self, position: Position, *, done: bool = False) -> bool:
        """Publish this monitor's beat and its rank's position (one store write); False if the store failed.

        ``done``: the rank is done (finished, or failing on its own): its watcher stops watching.
        """
        self.beats += 1
        fields: list[object] = [self.beats, position.count, position.attempt, position.step, position.phase]
        positions = beat_positions(read_collectives(self.page), self.entered_at)
        if done or positions:  # and the rank's /proc state: asleep, stopped or running (summary.hung_inside)
            fields += ["done" if done else "", positions, process_state(self.s.pid) or ""]
        text = json.dumps(fields)
        try:
            self.store.set(f"{self.s.prefix}/liveness/hb/{self.s.rank}", text.encode())
        except StoreError:
            return False
        return True

    def look(self, now: float) -> bool:
        """The tick's read, one request: the neighbour's beat and, until one is seen, the attempt's first verdict.

        False if the store failed (or did not answer in time).

        A verdict seen is copied into the page (where the rank's failure path reads it,
        also when the store has died since) and acknowledged. The verdict's key is created
        empty first (``NO_VERDICT``, once): a server older than libuv drops a ``multi_get``
        of a key that is not set, so the neighbour's beat, too, is read alone until it is set.
        """
        prefix = self.s.prefix
        beat_key, verdict_key = f"{prefix}/liveness/hb/{self.neighbour}", f"{prefix}/liveness/verdict/1"
        watching = self.s.world_size > 1 and not self.judged
        beat = verdict = None
        try:
            if not self.seen and not self.placed:  # once: an extra request
                self.store.create(verdict_key, NO_VERDICT)
                self.placed = True
            if watching and not self.seen and self.neighbour_beat is not None:
                beat, verdict = self.store.multi_get([beat_key, verdict_key])
            else:  # two requests only until the neighbour's first beat
                beat = self.store.get(beat_key) if watching else None
                verdict = None if self.seen else self.store.get(verdict_key)
            if verdict not in (None, NO_VERDICT):
                self.take(verdict)
        except StoreError:
            return False
        if watching and beat is not None:
            self.watch(beat, now)
        return True

    def check_store(self, position: Position, now: float) -> None:
        """Say so once the store has been silent too long (``store_watch.check``)."""
        store_watch.check(self, position, now)

    def classify(self, position: Position, now: float) -> None:
        """Suspect this rank past its phase's deadline with evidence against it; convict past the conviction deadline.

        Evidence, from ``/proc``: ``T`` stopped, ``R`` spinning (two ticks in a row),
        ``S``/``D`` asleep while it is the one behind (``behind``; never once a verdict
        is out: the ranks a culprit leaves waiting are its victims). A suspicion whose
        evidence no longer holds is withdrawn; one that still holds, re-read, at
        ``max(deadline, conviction_floor_s)`` is convicted (``judgement``).
        """
        age = now - self.changed
        deadline, _ = self.deadlines.of(position.phase)
        if age <= deadline:  # a rank stopped while a peer failed is convicted before its deadline (judgement)
            return judgement.stopped_after_a_peer(self, position, age, deadline, process_state(self.s.pid))
        state = process_state(self.s.pid)
        if state is None:
            return  # the next tick reports the death
        kind: Kind | None = None
        why = ""
        if state in ("T", "t"):
            kind, why = Kind.STOPPED, f"its process is stopped (state {state})"
        elif state == "R":
            self.running_ticks += 1
            if self.running_ticks >= 2:
                kind, why = Kind.SPINNING, "its process runs without progress"
        else:
            self.running_ticks = 0
            suspect = self.suspect
            if suspect is not None and (suspect.kind is Kind.HANG or suspect.kind in INSIDE):
                if suspect.collectives != self.signature():
                    return self.withdraw(position, "it entered or left a collective")
                kind = suspect.kind  # held: the same evidence, not gathered again
                outside = self.outside if kind is not Kind.HANG else None
                why = outside.why(position.where(), time.time()) if outside is not None else suspect.why
            elif not self.seen:
                kind, why = self.behind(position, age)
                if kind is None and self.neighbour_suspected:
                    kind, why = neighbour.cut_off(self)
            if kind is not None and self.verdict_out():
                kind = None
        if self.suspect is not None and self.suspect.kind is not kind:
            if kind is None and self.suspect.kind is Kind.SPINNING and state == "R":
                return  # one tick asleep between two spinning: still the same evidence
            self.withdraw(position, f"its process state is {state} now")
        if kind is None:
            return
        if self.suspect is None:
            self.suspicious(kind, position, age, deadline, state, why)
        if age > judgement.conviction_deadline(deadline, self.s.conviction_floor_s):
            self.convict(position, age, deadline, why)

    def facts(self, kind: Kind, position: Position, state: str, age: float, deadline: float | None) -> Evidence:
        """The evidence on this rank: with the group, collective and peers ``behind`` found for a kind ``INSIDE``."""
        about = self.about if kind in INSIDE or kind is Kind.DIED else {}
        return Evidence(
            kind.value, self.s.rank, position.step, position.phase, state, age, deadline, "monitor", **about
        )

    def signature(self) -> tuple[tuple[int, int], ...]:
        """The rank's collective positions, as (entered, left) per group: a change is progress inside the step."""
        return tuple((c.entered, c.left) for c in read_collectives(self.page))

    def suspicious(self, kind: Kind, position: Position, age: float, deadline: float, state: str, why: str) -> None:
        """Suspect this rank: journal the suspicion (its evidence; its stacks unless stopped) and log it."""
        facts = self.facts(kind, position, state, age, deadline)
        self.suspect = judgement.Suspect(kind, time.monotonic(), position.count, facts, self.signature(), why)
        stacks = ""
        if self.s.mode == "kill" and kind is not Kind.STOPPED:  # a stopped rank cannot dump without being resumed
            self.dump(kind.value)
            stacks = self.s.stacks
        _log(
            f"lifecycle liveness: rank {self.s.rank} suspected: {kind.words} at {position.where()}, no progress for "
            f"{age:.1f} s (deadline {deadline:.1f} s); {why}; convicted only if it still holds at "
            f"{judgement.conviction_deadline(deadline, self.s.conviction_floor_s):.1f} s"
        )
        self.append(judgement.suspicion_line(self.s.origin, facts, stacks))

    def withdraw(self, position: Position, why: str) -> None:
        """Withdraw the suspicion of this rank (``why``: what changed): journaled and logged."""
        suspect, self.suspect = self.suspect, None
        if suspect is None:
            return
        _log(f"lifecycle liveness: suspicion of rank {self.s.rank} withdrawn at {position.where()}: {why}")
        self.append(judgement.withdrawal_line(self.s.origin, self.s.rank, position.step, position.phase))

    def convict(self, position: Position, age: float, deadline: float, why: str) -> None:
        """Convict the suspect if its evidence still holds on a fresh read of the marks and ``/proc``; else withdraw."""
        suspect = self.suspect
        assert suspect is not None
        fresh = read_marks(self.page)
        if not judgement.holds(suspect, fresh.count, fresh.done, process_state(self.s.pid), self.signature()):
            self.withdraw(fresh, "it moved on the conviction's fresh read")
            return
        self.judge(suspect.kind, position, age, deadline, why, suspect.facts.process_state)

    def verdict_out(self) -> bool:
        """Whether the attempt has a verdict already (then copied to the page and acknowledged, as ``look`` does).

        Asked before judging this rank *waiting*: once a culprit is named (and maybe
        killed), the ranks waiting for it fall behind the peers that fail first, and this
        rank is one of its victims, not a second culprit. A store that fails: True (judge
        nothing on what cannot be checked).
        """
        try:
            verdict = self.store.get(f"{self.s.prefix}/liveness/verdict/1")
            if verdict in (None, NO_VERDICT):
                return False
            self.take(verdict)
        except StoreError:
            pass
        return True

    def take(self, verdict: bytes) -> None:
        """Copy the attempt's first ``verdict`` into the page (the rank's failure path reads it) and acknowledge it."""
        write_verdict(self.page, verdict)
        self.seen = True
        self.store.add(f"{self.s.prefix}/liveness/seen/1", 1)

    def behind(self, position: Position, age: float) -> tuple[Kind | None, str]:
        """Why this rank is behind every other: ``(HANG, why)`` by its count of marks, ``(STUCK_OUTSIDE or DESYNC,
        why)`` by its collective positions (``summary.in_the_step``; ``about`` then holds the evidence's group,
        collective and peers); ``(None, "")`` when it is not (or not known yet).

        All positions are read by one rank, never by all: per count of marks and round of
        ``gather_round_s`` (by the age of the position), the rank whose ``add`` on
        ``<prefix>/liveness/lowest/<count>/<round>/ask`` returns 1 reads every beat in one
        ``multi_get`` and publishes a summary under ``…/lowest/<count>/<round>``; the other
        ranks at that count read the summary (a few hundred bytes) once it is there, once
        a round. A rank is behind when no rank is below its count, none is missing, done or in
        another attempt, and one is above it. A done rank (finished, or failing on its own:
        its count moved one past its last mark) is no evidence: when a culprit is killed,
        the first peer to fail would put the peers still waiting for it behind it. Nor is
        anything once a verdict is out (``verdict_out``).
        """
        key = (position.count, int(age // self.gather_round_s))
        if self.lowest is None or self.lowest[0] != key:
            base = f"{self.s.prefix}/liveness/lowest/{key[0]}/{key[1]}"
            summary: bytes | None
            try:
                if key != self.asked:
                    self.asked = key
                    if self.store.add(f"{base}/ask", 1) == 1:
                        summary = self.gather(position)
                        self.store.set(base, summary)
                    else:
                        summary = self.store.get(base)
                else:
                    summary = self.store.get(base)
            except StoreError:
                return None, ""
            if summary is None:
                return None, ""  # the gathering rank has not published it yet: next tick
            self.lowest = key, Summary.decode(summary)
        found = self.lowest[1]
        reason = found.reason()
        if reason:
            return Kind.HANG, f"it sleeps in {position.where()}; {reason}"
        outside = found.outside.get(self.s.rank)
        if outside is None:
            return None, ""
        if not outside.stands(read_collectives(self.page)):
            return None, ""  # it entered or left a collective since the beats were read
        self.outside = outside
        self.about = {
            "group": group_words(outside.label),
            "collective": f"{outside.op} #{outside.number}",
            "peers": tuple(outside.peers),
            "sites": outside.sites,
        }
        return Kind(outside.kind), outside.why(position.where(), time.time())

    def gather(self, position: Position) -> bytes:
        """Every rank's beat, read in one request, summed up against ``position``'s count (``summarize``)."""
        keys = [f"{self.s.prefix}/liveness/hb/{rank}" for rank in range(self.s.world_size)]
        return summarize(self.store.multi_get(keys), self.s.rank, position.count, position.attempt).encode()

    def watch(self, beat: bytes, now: float) -> None:
        """Follow the neighbour's ``beat`` (just read): ``neighbour.watch``."""
        neighbour.watch(self, beat, now)

    def judge(
        self, kind: Kind, position: Position, age: float, deadline: float | None, why: str, state: str = ""
    ) -> None:
        """Publish the verdict on this rank (its ``/proc`` ``state``); then (``kill`` mode) dump its stacks, kill it.

        After the acknowledgement wait the marks and ``/proc`` are read once more: a rank
        that moved, resumed or finished since is signalled nothing (the verdict stands
        published; a withdrawal is journaled). The signals go through a pidfd where the
        kernel has one (never to a process that reused the id); between that last read and
        the signal the rank may still move: a window of one ``/proc`` read.
        """
        self.judged = True
        if kind is Kind.DIED:
            self.about = {}  # not a withdrawn suspicion's: only what it died inside (died_inside)
        desync = neighbour.died_inside(self) if kind is Kind.DIED else None
        facts = self.facts(kind, position, state, age, deadline)
        if kind is Kind.DIED:
            note = f"rank {self.s.rank} died at {position.where()} ({why}; it reported no failure of its own)"
            if desync is not None:
                note += (
                    f"; it died inside {desync.op} #{desync.number} of {group_words(desync.label)}, a desync: "
                    f"{desync.theirs}" + (f"; called: {desync.sites}" if desync.sites else "")
                )
        else:
            note = (
                f"rank {self.s.rank} {kind.words} at {position.where()}: no progress for {age:.1f} s "
                f"(deadline {deadline:.1f} s); {why}"
            )
            if self.s.mode == "kill" and not self.corroborated:
                note += f"; its Python stacks are in {self.s.stacks}"
        first = self.publish(facts, note, pid=self.s.pid)
        _log(f"lifecycle liveness: {note}")
        stacks = self.s.stacks if self.s.mode == "kill" and kind is not Kind.DIED and not self.corroborated else ""
        self.record(facts, note, stacks=stacks, killed=self.s.mode == "kill" and kind is not Kind.DIED)
        if kind is Kind.DIED or self.s.mode != "kill" or read_marks(self.page).done:
            return  # a rank done since (finished, or failing on its own) is signalled nothing: its handlers may be gone
        if first:
            self.wait_until_seen()
        suspect = self.suspect or judgement.Suspect(kind, 0.0, position.count, facts, self.signature())
        fresh = read_marks(self.page)
        if not judgement.holds(suspect, fresh.count, fresh.done, process_state(self.s.pid), self.signature()):
            self.withdraw(fresh, "it moved, resumed or finished before any signal: not signalled")
            return
        self.dump(kind.value)
        if first is None and kind is Kind.STOPPED:
            # A stopped rank that hosts the store froze the store too: it answers again now that it is resumed.
            pause = min(0.02, self.s.interval_s / 4)
            publish = lambda quiet: self.publish(facts, note, pid=self.s.pid, quiet=quiet)  # noqa: E731
            first = judgement.publish_resumed(publish, RESUME_WAIT * self.s.interval_s, pause)
            if first:
                self.wait_until_seen()
        judgement.send(self.s.pid, self.pidfd, signal.SIGCONT)
        judgement.send(self.s.pid, self.pidfd, signal.SIGKILL)

    def wait_until_seen(self) -> None:
        """Wait (at most two intervals) until every other monitor has copied the verdict to its rank's page.

        The kill may take the store with it (when this rank hosts it): the survivors'
        failure path then reads the verdict from its own page.
        """
        deadline = time.monotonic() + 2 * self.s.interval_s
        while time.monotonic() < deadline:
            try:
                if self.store.add(f"{self.s.prefix}/liveness/seen/1", 0) >= self.s.world_size - 1:
                    return
            except StoreError:
                return
            time.sleep(min(0.02, self.s.interval_s / 4))

    def record(self, facts: Evidence, note: str, *, stacks: str = "", killed: bool = False) -> None:
        """Append the verdict to the rank's journal (a ``lifecycle.journal`` ``verdict`` record); never raises.

        ``facts`` is the verdict's evidence (typed fields of the record); ``killed``: this
        monitor kills the culprit (its own rank) right after.
        """
        self.append(judgement.verdict_line(self.s.origin, facts, note, self.seq, stacks, killed))

    def append(self, line: dict[str, object]) -> None:
        """Append one record to the rank's journal (``judgement.append``); a failure is logged, never raised."""
        failed = judgement.append(self.s.journal, JOURNAL_VERSION, line)
        if failed:
            _log(f"lifecycle liveness: could not write a {line['kind']} record to {self.s.journal}: {failed}")

    def publish(self, facts: Evidence, note: str, *, pid: int, quiet: bool = False) -> bool | None:
        """The failure notice of the rank ``facts`` name and the verdict, in the store (best effort, bounded).

        Both carry the evidence as typed fields (``kind``, ``evidence``) beside the words.

        True if this is the attempt's first verdict (the one every monitor copies to its
        page), False if another came first, None if the store failed (logged unless ``quiet``: tried again).
        """
        self.seq = None
        try:
            self.seq, n, text = judgement.publish(self.store, self.s.prefix, facts, note, pid)
        except StoreError as exc:
            if quiet:
                return None
            _log(f"lifecycle liveness: publishing the verdict on rank {facts.rank} failed: {exc}")
            return None
        if n == 1:
            write_verdict(self.page, text)
            self.seen = True
        return n == 1

    def dump(self, kind: str) -> None:
        """Have the rank write its stacks into the side file and wait for them (``judgement.dump``); not a rank stopped
        after a peer's failure: resumed, it would act on the launcher's pending SIGTERM before the kill."""
        if not (kind == "stopped" and self.corroborated):
            judgement.dump(self.s.pid, self.pidfd, self.s.dump_signal, self.s.stacks, resume=kind == "stopped")


def main(argv: list[str]) -> int:
    """Run the monitor with the JSON settings in ``argv[1]`` on the marks page ``argv[2]`` (the descriptor the rank
    passed, as ``/proc/self/fd/<n>``: the page has no name to remove), then each next attempt its rank parks it for
    (``parking.next_attempt``); exit code 0."""
    settings, marks = Settings.from_json(argv[1]), argv[2]
    wake_read = start_watching()
    while os.getppid() == settings.pid:  # else the rank died (before prctl took effect, or while parked)
        code = _watch(settings, marks, wake_read)
        told = next_attempt(settings.pid)
        if told is None:
            return code
        settings, marks = Settings.from_json(told[0]), told[1]
    return 0


def _watch(settings: Settings, marks: str, wake_read: int) -> int:
    """Watch the rank's attempt until it is done or gone (``Monitor.run``); its exit code."""
    monitor: Monitor | None = None

    def parent_died(signum: int, frame: object) -> None:
        if monitor is not None:
            monitor.parent_died = True

    signal.signal(signal.SIGUSR1, parent_died)
    # SIGTERM (the rank's stop()) wakes the loop, which sees the rank done and says so before it exits.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the rank's to handle
    with open(marks, "r+b") as file:
        page = mmap.mmap(file.fileno(), PAGE_SIZE)
    monitor = Monitor(settings, page, wake_read)
    try:
        if os.getppid() != settings.pid:
            monitor.parent_died = True
        return monitor.run()
    finally:
        monitor.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
