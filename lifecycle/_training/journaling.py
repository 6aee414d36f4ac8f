"""The journal of one ``pretrain`` call: opened when the call starts, each record written as its event happens.

A journal must never change a run's outcome: the first write error is logged as a
warning and the rest of the call's journal is dropped.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from lifecycle import journal as _journal
from lifecycle._core.errors import describe
from lifecycle._core.events import FailureEvent, ReclaimEvent, ReleaseEvent, SessionEvent, TransitionEvent
from lifecycle._core.executor import Released, Releaser, StepRecord
from lifecycle._core.session import Session
from lifecycle._core.states import State
from lifecycle.journal import Failure, JournalWriter, Left, Origin, Record, RunStart, TeardownStep, Transition
from lifecycle.journal.evidence import Evidence

logger = logging.getLogger("lifecycle.pretrain")

_RELEASED_BY = {
    Releaser.SUCCESS: "",
    Releaser.FAILURE: "",
    Releaser.WRAPPER_ABORT: "released by the restart wrapper's abort (NVRx's monitor thread)",
    Releaser.WRAPPER_FINALIZE: "released by the restart wrapper's finalize",
    Releaser.LATE: "a step left running past its deadline that returned late",
}
"""The ``note`` of a ``teardown`` record of a release outside the session's plans, by who ran it."""


class RunJournal:
    """One call's records, appended to ``<directory>/rank<R>.jsonl``; does nothing when ``directory`` is None.

    ``origin`` labels every record. Opening writes the ``RunStart`` (``start`` = now);
    ``observe`` is the session observer that writes transitions, teardown steps, the
    ``Failure`` record when the session takes its failure edge (before any teardown step)
    and, once the session is final, what its teardown left alone. On the move to ``dist_ready`` the
    session's actions' ``attempt`` and ``store_prefix`` (read with
    ``getattr``, None when they have none, as ``TorchActions`` has) are recorded as the
    transition's ``agreed_attempt`` and ``store_prefix``. No method raises ``Exception``.

    A release of the session's entries outside its plans (``ReleaseEvent``: the restart
    wrapper's abort on NVRx's monitor thread, its finalize, a step that returned late) is a
    ``teardown`` record whose ``outcome`` names who ran it (``Releaser`` value) and whose
    ``note`` says it in words, written as it happens from whatever thread ran it: writes
    are serialised. On the move into a final state, those the holdings recorded and no
    event wrote yet (``report.released_elsewhere``) are written first: an entry released
    before the session's teardown is never missing from it. One released after the journal
    closed is not written (the ``left`` record then said what it was left to).
    """

    def __init__(
        self, directory: str | None, origin: Origin, world_size: int, session: Session, liveness: str = ""
    ) -> None:
        """Open the journal (if ``directory`` is set) and write the run's start (``liveness``: its deadlines, words)."""
        self.origin = origin
        self._session = session
        self._writer: JournalWriter | None = None
        self._lock = threading.RLock()  # the restart wrapper's abort writes from NVRx's monitor thread
        self._written: set[object] = set()  # the ``StepRecord`` of each release outside the plans, once written
        if directory is None:
            return
        first = RunStart(
            origin=origin,
            world_size=world_size,
            pid=os.getpid(),
            host=socket.gethostname(),
            start=time.time(),
            liveness=liveness,
        )
        try:
            self._writer = JournalWriter(_journal.journal_path(directory, origin.rank), first)
        except Exception as exc:  # noqa: BLE001 - a journal must never replace the run's own outcome
            logger.warning("could not open the journal in %s: %s; not journaling this run", directory, exc)

    @property
    def enabled(self) -> bool:
        """True while records are being written."""
        return self._writer is not None

    def write(self, record: Record) -> None:
        """Append ``record``; on an error, warn once and stop journaling."""
        with self._lock:
            writer = self._writer
            if writer is None:
                return
            try:
                writer.write(record)
            except Exception as exc:  # noqa: BLE001 - a journal must never replace the run's own outcome
                logger.warning(
                    "could not write the journal %s: %s; not journaling the rest of this run", writer.path, exc
                )
                self.close()

    def observe(self, event: SessionEvent) -> None:
        """Session observer: write the transition, teardown step or failure ``event`` describes."""
        if self._writer is None:
            return
        origin = self.origin
        if isinstance(event, ReleaseEvent):
            self._released(Released(event.by, event.record))
            return
        if isinstance(event, FailureEvent):
            told = event.announcement
            self.write(
                Failure(
                    origin=origin,
                    phase=event.phase,
                    step=event.step,
                    error=event.error,
                    time=event.time,
                    seq=told.seq,
                    unpublished=told.unpublished,
                    first_rank=told.first_rank,
                    note=told.note,
                    evidence=Evidence(event.kind, origin.rank, event.step, event.phase),
                    first=told.first,
                )
            )
            return
        if isinstance(event, TransitionEvent):
            entry = event.entry
            agreed, prefix = self._group_identity() if entry.dest is State.DIST_READY else (None, None)
            self.write(
                Transition(
                    origin=origin,
                    source=entry.source.value,
                    dest=entry.dest.value,
                    trigger=entry.trigger.value,
                    start=event.start,
                    end=event.end,
                    detail=entry.detail,
                    agreed_attempt=agreed,
                    store_prefix=prefix,
                )
            )
            report = self._session.report
            if entry.dest.is_final and report is not None:
                for done in report.released_elsewhere:
                    self._released(done)
                for step in report.abandoned:  # cut off by an escalated interrupt: they never ran
                    self.write(
                        TeardownStep(
                            origin=origin,
                            outcome="abandoned",
                            step=step.kind.value,
                            resource=step.entry.resource.value,
                            name=step.entry.name,
                            owner=step.entry.owner.value,
                            start=event.end,
                            end=event.end,
                        )
                    )
                for held, reason in report.left:
                    self.write(
                        Left(
                            origin=origin,
                            resource=held.resource.value,
                            name=held.name,
                            owner=held.owner.value,
                            reason=reason.value,
                            site=held.site,
                        )
                    )
            return
        record = event.record
        held = record.step.entry
        note = f"left by {event.left_by}, acquired at {held.site or '?'}" if isinstance(event, ReclaimEvent) else ""
        self.write(_teardown_step(origin, "reclaim" if note else record.outcome.value, record, note))

    def _released(self, done: Released) -> None:
        """Write the ``teardown`` record of a release outside the session's plans, unless written already."""
        record = done.record
        with self._lock:
            if record in self._written:
                return
            self._written.add(record)
            self.write(_teardown_step(self.origin, done.by.value, record, _RELEASED_BY[done.by]))

    def _group_identity(self) -> tuple[int | None, str | None]:
        """The actions' agreed ``attempt`` and ``store_prefix``, each None unless the actions hold one of its type."""
        try:
            attempt = getattr(self._session.actions, "attempt", None)
            prefix = getattr(self._session.actions, "store_prefix", None)
        except Exception:  # noqa: BLE001 - a journal must never replace the run's own outcome
            return None, None
        return (
            attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
            prefix if isinstance(prefix, str) else None,
        )

    def close(self) -> None:
        """Close the file; later writes do nothing."""
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception as exc:  # noqa: BLE001 - a journal must never replace the run's own outcome
                logger.warning("could not close the journal %s: %s", writer.path, exc)


def _teardown_step(origin: Origin, outcome: str, record: StepRecord, note: str) -> TeardownStep:
    """The ``teardown`` record of one step that ran (``record``), run as ``outcome`` says, with ``note``."""
    held = record.step.entry
    return TeardownStep(
        origin=origin,
        outcome=outcome,
        step=record.step.kind.value,
        resource=held.resource.value,
        name=held.name,
        owner=held.owner.value,
        start=record.start,
        end=record.end,
        error=None if record.error is None else describe(record.error),
        note=note,
    )
