"""The interrupt shield: Ctrl-C and SIGTERM wait while lifecycle tears down; a second one abandons the teardown."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest
from support.internals import teardown as runner_module
from support.internals import worker

from lifecycle import Session, State, TeardownInterrupted
from lifecycle.lowlevel import Handler, Resource, StepKind
from lifecycle.testing import RecordingActions


@pytest.fixture(autouse=True)
def handlers() -> Iterator[None]:
    """Every test starts and ends with the process's own SIGINT/SIGTERM handlers."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    after = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for signum, handler in before.items():
        signal.signal(signum, handler)
    assert after == before  # the shield removed itself


class InterruptingActions(RecordingActions):
    """A double whose releases raise SIGINT in this process as they run (``times`` of them, in order)."""

    def __init__(self, at: tuple[str, ...], signum: int = signal.SIGINT) -> None:
        super().__init__()
        self.at, self.signum = list(at), signum

    def _record(self, name: str) -> None:
        super()._record(name)
        if self.at and self.at[0] == name:
            self.at.pop(0)
            self.second_at = time.monotonic()
            main = threading.main_thread()
            if threading.current_thread() is main:
                signal.raise_signal(self.signum)  # the handler runs here, inside lifecycle's teardown
            else:  # a teardown's worker: the main thread, waiting for it, runs the handler (as for a Ctrl-C)
                assert main.ident is not None
                signal.pthread_kill(main.ident, self.signum)
                time.sleep(0.1)  # two sent at once would reach the handler once: let it run first


def live(session: Session) -> Session:
    """``session`` driven to ``training``."""
    session.init_distributed()
    session.init_globals()
    session.start_training()
    return session


def test_a_ctrl_c_during_the_failure_teardown_waits_until_the_session_is_final() -> None:
    """Every failure step still runs; the deferred KeyboardInterrupt is raised after, from the original error."""
    actions = InterruptingActions(at=("destroy_rerun_state_machine",))
    session = live(Session(actions))
    error = RuntimeError("boom")
    with pytest.raises(KeyboardInterrupt) as info:
        session.fail(error)
    assert type(info.value) is KeyboardInterrupt
    assert session.state is State.FAILED and session.ledger.held() == ()
    assert actions.calls[-4:] == [
        "destroy_microbatch_calculator",
        "abort_model_parallel",
        "abort_process_group",
        "close_store",
    ]


def test_a_second_ctrl_c_abandons_the_rest_of_the_teardown_and_the_session_still_ends_failed() -> None:
    """Escalation: the remaining steps are abandoned and reported, TeardownInterrupted is raised at once."""
    actions = InterruptingActions(at=("destroy_rerun_state_machine", "destroy_microbatch_calculator"))
    session = live(Session(actions))
    with pytest.raises(TeardownInterrupted):
        session.fail(RuntimeError("boom"))
    assert session.state is State.FAILED and session.journal[-1].dest is State.FAILED
    report = session.report
    assert report is not None
    assert [str(step) for step in report.abandoned] == ["abort_model_parallel", "abort_process_group", "close_store"]
    assert "abort_process_group" not in actions.calls
    # The step the second Ctrl-C arrived during returned within the grace; the rest are for the
    # next session to reclaim (the store goes with the group that holds it).
    assert report.left_running == ()
    held = {entry.resource.value for entry in session.ledger.held()}
    assert held == {"model_parallel", "process_group", "rendezvous_store"}


def test_a_second_ctrl_c_leaves_a_hung_step_running_and_returns_within_a_second() -> None:
    """A release that hangs: the second Ctrl-C ends the session at once, the step reported as left running."""
    release = threading.Event()
    actions = InterruptingActions(at=("destroy_rerun_state_machine", "destroy_microbatch_calculator"))
    hung = actions.handler

    def handler(resource: Resource) -> Handler:
        made = hung(resource)
        if resource is not Resource.MICROBATCH_CALCULATOR:
            return made
        step = StepKind.DESTROY_MICROBATCH_CALCULATOR

        def stuck() -> None:
            made.releases[step]()  # sends the second SIGINT
            release.wait(10)

        return Handler(made.acquire, {step: stuck})

    actions.handler = handler  # type: ignore[method-assign]
    session = live(Session(actions))
    try:
        with pytest.raises(TeardownInterrupted):
            session.fail(RuntimeError("boom"))
        returned = time.monotonic()
        assert session.state is State.FAILED
        report = session.report
        assert report is not None
        assert [str(step) for step in report.left_running] == ["destroy_microbatch_calculator"]
        assert [str(step) for step in report.abandoned] == [
            "abort_model_parallel",
            "abort_process_group",
            "close_store",
        ]
        assert signal.getsignal(signal.SIGINT) is not None
    finally:
        release.set()
    assert returned - actions.second_at < 1.0, f"the caller waited {returned - actions.second_at:.2f} s"


def test_a_ctrl_c_during_close_waits_and_a_second_abandons_it() -> None:
    """The success plan is shielded too: one Ctrl-C waits for ``closed``; two abandon it and end ``failed``."""
    once = InterruptingActions(at=("destroy_rerun_state_machine",))
    session = live(Session(once))
    session.finish()
    with pytest.raises(KeyboardInterrupt):
        session.close()
    assert session.state is State.CLOSED and once.calls[-2:] == ["destroy_process_group", "close_store"]
    twice = InterruptingActions(at=("destroy_rerun_state_machine", "destroy_model_parallel"))
    session = live(Session(twice))
    session.finish()
    with pytest.raises(TeardownInterrupted):
        session.close()
    assert session.state is State.FAILED and "barrier" not in twice.calls
    assert session.report is not None and session.report.left_running == ()
    assert [str(s) for s in session.report.abandoned] == ["barrier", "destroy_process_group", "close_store"]


def test_a_ctrl_c_while_user_code_runs_is_raised_at_once() -> None:
    """Outside lifecycle's teardown the shield passes Ctrl-C straight through (then the failure edge runs)."""
    actions = RecordingActions()
    ran_after = []
    with pytest.raises(KeyboardInterrupt), Session(actions) as session:
        live(session)
        signal.raise_signal(signal.SIGINT)
        ran_after.append(True)
    assert (
        ran_after == []
        and session.state is State.FAILED
        and actions.calls[-2:] == ["abort_process_group", "close_store"]
    )


def test_a_deferred_sigterm_reaches_the_previous_handler_once_final() -> None:
    """A SIGTERM during teardown is handed to the handler installed before the session, after the session is final."""
    seen: list[tuple[int, State]] = []
    original = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append((signum, session.state)))
    try:
        session = live(Session(InterruptingActions(at=("abort_model_parallel",), signum=signal.SIGTERM)))
        session.fail(RuntimeError("boom"))
        assert seen == [(signal.SIGTERM, State.FAILED)]
    finally:
        signal.signal(signal.SIGTERM, original)


def test_an_abandon_while_the_worker_restores_the_handlers_reports_every_step_it_skipped() -> None:
    """Abandoned while the worker is in its last step (the handlers), every abandonable entry still held is reported."""
    previous = signal.getsignal(signal.SIGTERM)
    session = live(Session(RecordingActions()))
    session.install_signal_handlers((signal.SIGTERM,))
    runner = session._teardowns  # the worker skipped every abandonable step, then posted the handlers' restore
    planned = runner_module.teardown(session.ledger, session.restart_mode, runner_module.Outcome.FAILURE)
    (restore,) = [step for step in planned.plan if step.kind is StepKind.RESTORE_SIGNAL_HANDLERS]
    escalation = TeardownInterrupted(signal.SIGINT)
    with pytest.raises(TeardownInterrupted):
        runner._abandon(worker.Job(lambda: None), restore, escalation, runner_module.Outcome.FAILURE)
    session.final_landings(escalation)  # what the caller's fail() does once final: the shield goes
    report = session.report
    assert session.state is State.FAILED and report is not None
    accounted = {step.entry.key for step in report.abandoned + report.left_running}
    held = {entry.key for entry in session.ledger.held()}
    assert held and held <= accounted, (held - accounted, report)
    assert signal.getsignal(signal.SIGTERM) is previous  # the step that must not be skipped ran here
