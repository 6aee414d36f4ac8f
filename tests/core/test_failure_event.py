"""The failure edge announces the failure (``AnnouncesFailures``) and tells observers, before any release. Torch-free.

Before issue 14 the session had no ``FailureEvent``, no ``progress`` and called no
``announce_failure``: each test below fails on that code.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.internals import AnnouncesFailures, RunJournal

from lifecycle import Session, State
from lifecycle.journal import Failure, Origin, TeardownStep, read
from lifecycle.lowlevel import Announcement, FailureEvent, SessionEvent
from lifecycle.testing import RecordingActions, RecordingCheckpoints

PEER_FIRST = Announcement(2, "", 1, "lifecycle: rank 1 failed first (step 30, phase step): InjectedFault: boom")


def events_of(session: Session) -> list[SessionEvent]:
    """Every event ``session`` notifies from now on."""
    events: list[SessionEvent] = []
    session.add_observer(events.append)
    return events


def failures(events: list[SessionEvent]) -> list[FailureEvent]:
    """The failure events among ``events``."""
    return [e for e in events if isinstance(e, FailureEvent)]


def test_a_failure_is_announced_and_observed_once_before_anything_is_released() -> None:
    """One FailureEvent, after the announcement and before the first teardown step; the state names the phase."""
    actions = RecordingActions()
    session = Session(actions)
    events = events_of(session)
    session.init_distributed()
    error = RuntimeError("boom")
    session.fail(error)
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("FailureEvent") < kinds.index("TeardownEvent") and kinds.count("FailureEvent") == 1
    (event,) = failures(events)
    assert (event.phase, event.step, event.error) == ("dist_ready", None, "RuntimeError: boom")
    assert actions.announced == [(error, "dist_ready", None)]
    assert event.announcement == actions.announcement and event.announcement.seq is None


def test_progress_sends_each_mark_to_the_sink_set_with_the_step_it_keeps() -> None:
    """Every ``progress`` call reaches ``progress_sink`` (the liveness seam) with the phase and the kept step."""
    session = Session(RecordingActions())
    session.progress("setup")  # no sink yet: nowhere
    marks: list[tuple[str, int | None]] = []
    session.progress_sink = lambda phase, step: marks.append((phase, step))
    session.progress("setup")
    session.progress("step", 3)
    session.progress("callback")  # no step: keeps 3
    session.progress_sink = None
    session.progress("step", 4)
    assert marks == [("setup", None), ("step", 3), ("callback", 3)]


def test_progress_names_phase_and_step_until_the_next_transition_then_the_state_is_the_phase() -> None:
    """The phase given holds in its state only; the step holds until another is given."""
    session = Session(RecordingActions())
    events = events_of(session)
    session.init_distributed()
    session.init_globals()
    session.start_training()
    session.progress("step", 30)
    session.progress("callback")  # no step: keeps 30
    with pytest.raises(RuntimeError), session:
        raise RuntimeError("in a callback")
    assert [(e.phase, e.step) for e in failures(events)] == [("callback", 30)]

    later = Session(RecordingActions())
    events = events_of(later)
    later.init_distributed()
    later.init_globals()
    later.start_training()
    later.progress("step", 7)
    later.finish()  # a transition since: the phase is the state's name again, the step stays
    later.fail(RuntimeError("in finalize"))
    assert [(e.phase, e.step) for e in failures(events)] == [("finalizing", 7)]


def test_a_peers_earlier_failure_is_noted_on_the_error_before_the_teardown_notes() -> None:
    """The announcement's note is the error's first note; teardown-step notes follow it."""
    actions = RecordingActions(announcement=PEER_FIRST, fail_on={"abort_process_group": OSError("abort")})
    session = Session(actions)
    events = events_of(session)
    session.init_distributed()
    error = RuntimeError("Connection closed by peer")
    session.fail(error)
    assert error.__notes__[0] == PEER_FIRST.note
    assert any("teardown step abort_process_group also failed" in n for n in error.__notes__[1:])
    assert failures(events)[0].announcement == PEER_FIRST


def test_an_announcement_that_raises_changes_nothing_but_says_so() -> None:
    """Actions whose announce_failure raises: the plan still runs, the event says the notice was not published."""
    actions = RecordingActions(fail_on={"announce_failure": ConnectionError("store gone")})
    session = Session(actions)
    events = events_of(session)
    session.init_distributed()
    error = RuntimeError("boom")
    session.fail(error)
    assert session.state is State.FAILED and actions.calls[-2:] == ["abort_process_group", "close_store"]
    told = failures(events)[0].announcement
    assert told.seq is None and "ConnectionError: store gone" in told.unpublished
    assert not getattr(error, "__notes__", [])


class _Mute:
    """Actions that cannot announce: every ``DistributedActions`` method, delegated; no ``announce_failure``."""

    def __init__(self) -> None:
        self.inner = RecordingActions()

    def __getattr__(self, name: str) -> object:
        if name == "announce_failure":
            raise AttributeError(name)
        return getattr(self.inner, name)


def test_actions_that_cannot_announce_still_give_a_failure_event() -> None:
    """Without announce_failure, the failure is observed all the same, unpublished and saying why."""
    actions = _Mute()
    assert not isinstance(actions, AnnouncesFailures)
    session = Session(actions)  # type: ignore[arg-type]  # a structural double
    events = events_of(session)
    session.init_distributed()
    session.fail(RuntimeError("boom"))
    (event,) = failures(events)
    assert event.announcement.seq is None and "cannot announce" in event.announcement.unpublished


def test_a_failed_success_teardown_is_announced_with_the_failing_steps_error() -> None:
    """close() whose barrier raises takes the failure edge: one FailureEvent, naming that error, in finalizing."""
    barrier = RuntimeError("barrier timed out")
    actions = RecordingActions(fail_on={"barrier": barrier}, announcement=PEER_FIRST)
    session = Session(actions)
    events = events_of(session)
    session.init_distributed()
    session.init_globals()
    session.start_training()
    session.finish()
    with pytest.raises(Exception):  # noqa: B017 - the TeardownError grouping the barrier's error
        session.close()
    (event,) = failures(events)
    assert (event.phase, event.error) == ("finalizing", "RuntimeError: barrier timed out")
    assert actions.announced == [(barrier, "finalizing", None)] and PEER_FIRST.note in barrier.__notes__


def test_a_session_that_closes_announces_nothing() -> None:
    """No failure: no announcement, no FailureEvent."""
    actions = RecordingActions()
    with Session(actions) as session:
        events = events_of(session)
        session.init_distributed()
        session.init_globals()
        session.track_checkpoints(RecordingCheckpoints(calls=actions.calls))
        session.start_training()
        session.progress("step", 1)
    assert session.state is State.CLOSED and actions.announced == [] and failures(events) == []


def test_the_journal_holds_the_failure_record_before_the_first_teardown_step(tmp_path: Path) -> None:
    """RunJournal writes one Failure record (phase, step, error, seq, first rank, note) ahead of the teardown."""
    origin = Origin(run_id="job", rank=0, attempt=0, restart_mode="ordinary", iteration=0)
    session = Session(RecordingActions(announcement=PEER_FIRST))
    journal = RunJournal(str(tmp_path), origin, 2, session)
    session.add_observer(journal.observe)
    session.init_distributed()
    session.progress("step", 30)
    session.fail(RuntimeError("Connection closed by peer"))
    journal.close()
    records = read([tmp_path])
    kinds = [type(r) for r in records]
    assert kinds.count(Failure) == 1 and kinds.index(Failure) < kinds.index(TeardownStep)
    failure = next(r for r in records if isinstance(r, Failure))
    assert (failure.phase, failure.step, failure.error) == ("step", 30, "RuntimeError: Connection closed by peer")
    assert (failure.seq, failure.first_rank, failure.note, failure.unpublished) == (2, 1, PEER_FIRST.note, "")
