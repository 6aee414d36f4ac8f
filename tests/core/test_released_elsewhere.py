"""Releases outside a session's own plans: the restart wrapper's abort and finalize, a step that returns late.

Whoever runs a release of a session's entry, the holdings record it (who, when), the
session's observers hear of it on the thread that ran it, ``session.report`` lists it,
and the journal writes it as a ``teardown`` record whose ``outcome`` names the runner.
"""

from __future__ import annotations

import threading
from pathlib import Path

from support.internals import Attempt, RunJournal

from lifecycle import Session
from lifecycle.journal import Left, Origin, TeardownStep, read
from lifecycle.lowlevel import ReleaseEvent, Resource, RestartMode, SessionEvent, Step, StepKind
from lifecycle.lowlevel import Releaser as By
from lifecycle.testing import RecordingActions

ORIGIN = Origin(run_id="job", rank=0, attempt=0, restart_mode="inprocess", iteration=0, restart_count=0)


def _training(tmp_path: Path) -> tuple[Session, RunJournal, list[tuple[SessionEvent, str]]]:
    """An ``inprocess`` session in ``training`` with a journal in ``tmp_path``; every event seen, with its thread."""
    session = Session(RecordingActions(), restart_mode=RestartMode.INPROCESS)
    journal = RunJournal(str(tmp_path), ORIGIN, 2, session)
    seen: list[tuple[SessionEvent, str]] = []
    session.add_observer(journal.observe)
    session.add_observer(lambda event: seen.append((event, threading.current_thread().name)))
    session.init_distributed()
    session.init_globals()
    session.start_training()
    return session, journal, seen


def _abort_on_a_monitor_thread(session: Session) -> None:
    """Run the Wrapper's abort for ``session`` as NVRx does: on a thread of its own."""
    thread = threading.Thread(target=Attempt(session).release, kwargs={"unblocking_only": True}, name="monitor")
    thread.start()
    thread.join(10)
    assert not thread.is_alive()


def test_an_abort_before_the_failure_teardown_is_journaled_reported_and_observed(tmp_path: Path) -> None:
    """The Wrapper's abort that released the group before the failure plan: a wrapper_abort record, never silence."""
    session, journal, seen = _training(tmp_path)
    _abort_on_a_monitor_thread(session)
    session.fail(RuntimeError("a peer failed"))
    journal.close()
    steps = [r for r in read([tmp_path]) if isinstance(r, TeardownStep)]
    aborted = [r for r in steps if r.resource == Resource.PROCESS_GROUP.value]
    assert [(r.outcome, r.step, r.owner) for r in aborted] == [
        ("wrapper_abort", "abort_process_group", "restart_wrapper")
    ]
    assert aborted[0].start <= aborted[0].end and "restart wrapper's abort" in aborted[0].note
    assert not [r for r in read([tmp_path]) if isinstance(r, Left) and r.resource == Resource.PROCESS_GROUP.value]
    assert session.report is not None
    assert [(r.by, r.record.step.kind) for r in session.report.released_by_wrapper] == [
        (By.WRAPPER_ABORT, StepKind.ABORT_PROCESS_GROUP)
    ]
    told = [(event.by, thread) for event, thread in seen if isinstance(event, ReleaseEvent)]
    assert told == [(By.WRAPPER_ABORT, "monitor")]


def test_an_abort_after_the_session_is_final_is_in_the_report_read_later(tmp_path: Path) -> None:
    """The failing rank defers the group; the Wrapper's later abort shows in ``session.report`` when it is read."""
    session, journal, _ = _training(tmp_path)
    session.fail(RuntimeError("this rank failed"))
    assert session.report is not None and session.report.released_by_wrapper == ()
    assert Resource.PROCESS_GROUP in {e.resource for e in session.report.deferred_to_wrapper}
    _abort_on_a_monitor_thread(session)
    journal.close()
    assert [r.record.step.kind for r in session.report.released_by_wrapper] == [StepKind.ABORT_PROCESS_GROUP]
    lefts = [r for r in read([tmp_path]) if isinstance(r, Left) and r.resource == Resource.PROCESS_GROUP.value]
    assert [r.reason for r in lefts] == ["deferred to the restart wrapper"]


def test_the_journal_writes_a_release_once_though_told_twice(tmp_path: Path) -> None:
    """A release the observer wrote is not written again by the sweep of the final move (and vice versa)."""
    session, journal, _ = _training(tmp_path)
    _abort_on_a_monitor_thread(session)
    session.fail(RuntimeError("a peer failed"))
    assert session.report is not None
    for done in session.report.released_elsewhere:
        journal.observe(ReleaseEvent(done.by, done.record))
    journal.close()
    outcomes = [r.outcome for r in read([tmp_path]) if isinstance(r, TeardownStep)]
    assert outcomes.count("wrapper_abort") == len(session.report.released_elsewhere) == 1


def test_a_step_left_running_past_its_deadline_is_recorded_late_when_it_returns() -> None:
    """A release whose claim was marked stuck while it ran is recorded as ``late``, not as its plan's."""
    session = Session(RecordingActions())
    session.init_distributed()
    holdings = session.holdings
    entry = session.ledger.entry(Resource.PROCESS_GROUP, "")
    assert entry is not None
    inside, go = threading.Event(), threading.Event()

    def slow(release: object) -> None:
        inside.set()
        go.wait(10)

    step = Step(StepKind.DESTROY_PROCESS_GROUP, entry)
    thread = threading.Thread(target=holdings.run, args=(step, slow), kwargs={"by": By.SUCCESS})
    thread.start()
    assert inside.wait(10)
    holdings.stuck(entry.key)
    go.set()
    thread.join(10)
    assert [(r.by, r.record.step.kind) for r in holdings.released()] == [(By.LATE, StepKind.DESTROY_PROCESS_GROUP)]
    session.fail(RuntimeError("done"))
