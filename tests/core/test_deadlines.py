"""Every release step has a deadline, and a release left running never touches the next session (issue 23).

Without torch: ``RecordingActions`` with one release made to hang on an event. A step
past ``release_timeout_s`` is recorded as failed with ``StepTimedOut`` and left running
on its thread; the plan goes on (an abort still follows a hung graceful destroy, and
runs alongside it); the session ends final. A later session that would acquire the
kind waits for the late release within a bound, or is refused naming it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from support.internals import acquiring as acquiring_module

from lifecycle import Session, StaleResource, State, StepTimedOut, TeardownError
from lifecycle.lowlevel import Handler, Resource, StepKind
from lifecycle.testing import RecordingActions

DEADLINE_S = 0.3


def run_to_training(session: Session, actions: RecordingActions) -> None:
    """Drive ``session`` to ``training`` (the store, the group, Megatron's globals)."""
    session.init_distributed()
    session.init_globals()
    session.start_training()


class HangingActions(RecordingActions):
    """Recording actions whose release of kind ``hang`` waits for ``released`` (at most 10 s), logging its end."""

    def __init__(self, hang: StepKind, *, unblocked_by: StepKind | None = None) -> None:
        """``unblocked_by``: a step kind whose release sets ``released`` (an abort that unblocks a hung destroy)."""
        super().__init__()
        self.hang = hang
        self.unblocked_by = unblocked_by
        self.released = threading.Event()

    def handler(self, resource: Resource) -> Handler:
        """The recording handler, with the hanging (and the unblocking) release swapped in."""
        made = super().handler(resource)
        releases: dict[StepKind, Callable[[], object]] = dict(made.releases)
        if self.hang in releases:
            record = releases[self.hang]

            def hung() -> None:
                self.released.wait(10)
                record()  # logged when it returns, late

            releases[self.hang] = hung
        if self.unblocked_by in releases:
            unblock = releases[self.unblocked_by]

            def unblocking() -> None:
                unblock()
                self.released.set()

            releases[self.unblocked_by] = unblocking  # type: ignore[index]
        return Handler(made.acquire, releases, made.check)


@pytest.fixture
def hanging() -> Iterator[list[HangingActions]]:
    """Hanging actions made by a test; every one's release is let go at the end (no thread left waiting)."""
    made: list[HangingActions] = []
    yield made
    for actions in made:
        actions.released.set()


def test_a_release_past_its_deadline_is_left_running_and_the_failure_plan_goes_on(
    hanging: list[HangingActions],
) -> None:
    """A hung failure step: fail() returns after the deadline, StepTimedOut recorded, the later steps all ran."""
    actions = HangingActions(StepKind.DESTROY_MICROBATCH_CALCULATOR)
    hanging.append(actions)
    session = Session(actions, release_timeout_s=DEADLINE_S)
    run_to_training(session, actions)
    error = RuntimeError("boom")
    start = time.monotonic()
    report = session.fail(error)
    took = time.monotonic() - start
    assert DEADLINE_S <= took < DEADLINE_S + 1.0, took
    assert session.state is State.FAILED
    assert [(str(f.step), type(f.error)) for f in report.failed] == [("destroy_microbatch_calculator", StepTimedOut)]
    assert [str(step) for step in report.left_running] == ["destroy_microbatch_calculator"]
    assert actions.calls[-3:] == ["abort_model_parallel", "abort_process_group", "close_store"]
    assert "destroy_microbatch_calculator" not in actions.calls  # still inside it
    assert any("StepTimedOut" in note for note in error.__notes__), error.__notes__
    actions.released.set()
    deadline = time.monotonic() + 5
    while "destroy_microbatch_calculator" not in actions.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "destroy_microbatch_calculator" in actions.calls  # it finished late, on its own thread
    assert Resource.MICROBATCH_CALCULATOR in {resource for resource, _ in session.ledger.released}


def test_an_abort_runs_alongside_a_hung_graceful_destroy_and_unblocks_it(hanging: list[HangingActions]) -> None:
    """close(): destroy_process_group hangs past its deadline; the failure plan's abort runs and releases the group."""
    actions = HangingActions(StepKind.DESTROY_PROCESS_GROUP, unblocked_by=StepKind.ABORT_PROCESS_GROUP)
    hanging.append(actions)
    session = Session(actions, release_timeout_s=DEADLINE_S)
    run_to_training(session, actions)
    session.finish()
    with pytest.raises(TeardownError) as raised:
        session.close()
    assert [type(error) for error in raised.value.exceptions] == [StepTimedOut]
    assert session.state is State.FAILED
    report = session.report
    assert report is not None
    assert [(str(f.step), type(f.error)) for f in report.failed] == [("destroy_process_group", StepTimedOut)]
    assert "abort_process_group" in [str(step) for step in report.ran]
    assert Resource.PROCESS_GROUP in {resource for resource, _ in session.ledger.released}


def test_the_next_session_waits_for_a_late_release_then_acquires(hanging: list[HangingActions]) -> None:
    """A release left running ends while the next session waits: it acquires after it, and it ran once."""
    actions = HangingActions(StepKind.DESTROY_MICROBATCH_CALCULATOR)
    hanging.append(actions)
    first = Session(actions, release_timeout_s=DEADLINE_S, label="first")
    run_to_training(first, actions)
    first.fail(RuntimeError("boom"))
    threading.Timer(0.3, actions.released.set).start()
    second = Session(actions, label="second")
    with second:
        run_to_training(second, actions)
    assert second.state is State.CLOSED
    calls = actions.calls
    assert calls.count("destroy_microbatch_calculator") == 2  # the late one, then second's own close
    late = calls.index("destroy_microbatch_calculator")
    assert late < calls.index("init_microbatch_calculator", calls.index("abort_process_group"))
    assert second.reclaimed == ()  # it was released by its own late step: nothing to reclaim


def test_the_next_session_is_refused_while_a_late_release_still_runs(
    hanging: list[HangingActions], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release left running past the next session's wait: StaleResource names it; that kind is not acquired."""
    monkeypatch.setattr(acquiring_module, "LATE_RELEASE_WAIT_S", 0.2)
    actions = HangingActions(StepKind.DESTROY_MICROBATCH_CALCULATOR)
    hanging.append(actions)
    first = Session(actions, release_timeout_s=DEADLINE_S, label="first")
    run_to_training(first, actions)
    first.fail(RuntimeError("boom"))
    after_first = len(actions.calls)
    second = Session(actions, label="second")
    try:
        with pytest.raises(StaleResource) as refused:
            run_to_training(second, actions)
        assert refused.value.resource == "microbatch_calculator"
        assert "first" in str(refused.value) and "still runs" in str(refused.value)
        assert "init_microbatch_calculator" not in actions.calls[after_first:]
    finally:
        actions.released.set()
        if not second.state.is_final:
            second.fail(RuntimeError("end"))


def test_a_release_timeout_must_be_positive() -> None:
    """release_timeout_s of 0 or below is refused when the session is made."""
    with pytest.raises(ValueError, match="release_timeout_s"):
        Session(RecordingActions(), release_timeout_s=0)
