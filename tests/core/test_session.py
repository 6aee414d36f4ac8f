"""Session: triggers, failure edge, teardown execution, context manager, journal."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from lifecycle import (
    AlreadyHeld,
    InvalidTransition,
    LifecycleError,
    Owner,
    Session,
    SessionFinished,
    State,
    TeardownError,
    Trigger,
)
from lifecycle.lowlevel import LeftReason, Outcome, Resource, RestartMode, StepKind, plan_teardown
from lifecycle.testing import COLLECTIVES, RecordingActions, RecordingCheckpoints


def run_to_training(session: Session, actions: RecordingActions) -> None:
    """Drive ``session`` to ``training`` holding every kind of resource."""
    session.init_distributed()
    session.init_globals()
    session.track_checkpoints(RecordingCheckpoints(calls=actions.calls))
    session.register("a", lambda: actions.calls.append("release:a"))
    session.register("b", lambda: actions.calls.append("release:b"))
    session.start_training()


def test_a_full_run_releases_everything_in_the_canonical_order() -> None:
    """A session-owned run closes with finalize, user resources reversed, globals, barrier, destroy."""
    actions = RecordingActions()
    with Session(actions) as session:
        run_to_training(session, actions)
    assert session.state is State.CLOSED
    assert actions.calls[5:] == [
        "finalize_checkpoints",
        "release:b",
        "release:a",
        "destroy_rerun_state_machine",
        "destroy_microbatch_calculator",
        "destroy_model_parallel",
        "barrier",
        "destroy_process_group",
        "close_store",
    ]
    assert session.ledger.held() == ()


def test_an_invalid_trigger_names_state_and_trigger_and_does_nothing() -> None:
    """A trigger with no edge from the current state raises before any side effect."""
    actions = RecordingActions()
    session = Session(actions)
    with pytest.raises(InvalidTransition, match="'init_globals' is not valid in state 'uninitialized'") as info:
        session.init_globals()
    assert info.value.state is State.UNINITIALIZED and info.value.trigger is Trigger.INIT_GLOBALS
    assert actions.calls == [] and session.state is State.UNINITIALIZED and session.journal == ()


@pytest.mark.parametrize("final", [State.CLOSED, State.FAILED])
def test_final_states_refuse_every_trigger(final: State) -> None:
    """``closed``, ``failed``: every trigger is refused (``InvalidTransition``), every action (``SessionFinished``)."""
    actions = RecordingActions()
    session = Session(actions)
    if final is State.CLOSED:
        run_to_training(session, actions)
        session.finish()
        session.close()
    else:
        session.fail(RuntimeError("x"))
    before = list(actions.calls)
    for trigger in ("init_distributed", "init_globals", "start_training", "finish", "close"):
        with pytest.raises(InvalidTransition, match=final.value):
            getattr(session, trigger)()
    with pytest.raises(InvalidTransition):
        session.fail(RuntimeError("again"))
    for act in (
        lambda: session.register("late", lambda: None),
        lambda: session.install_signal_handlers(),
        lambda: session.track_checkpoints(RecordingCheckpoints()),
    ):
        with pytest.raises(SessionFinished) as info:
            act()
        assert info.value.state is final and not isinstance(info.value, InvalidTransition)
    assert actions.calls == before and session.state is final


def test_the_original_exception_propagates_with_a_note_per_failed_step() -> None:
    """Failed teardown steps never replace the original exception; each adds a note and later steps run."""
    actions = RecordingActions(
        fail_on={"abort_model_parallel": RuntimeError("mp"), "destroy_rerun_state_machine": OSError("rerun")}
    )
    original = ValueError("the real problem")
    with pytest.raises(ValueError) as info, Session(actions) as session:
        run_to_training(session, actions)
        raise original
    assert info.value is original
    assert len(original.__notes__) == 2
    assert "destroy_rerun_state_machine" in original.__notes__[0] and "OSError: rerun" in original.__notes__[0]
    assert "abort_model_parallel" in original.__notes__[1]
    assert actions.calls[-2:] == ["abort_process_group", "close_store"]  # the later steps still ran
    assert session.state is State.FAILED
    assert [f.step.kind for f in session.report.failed] == [  # type: ignore[union-attr]
        StepKind.DESTROY_RERUN_STATE_MACHINE,
        StepKind.ABORT_MODEL_PARALLEL,
    ]
    # What failed to release is still held: nothing pretends it is gone.
    assert {e.resource for e in session.ledger.held()} == {Resource.MODEL_PARALLEL, Resource.RERUN_STATE_MACHINE}


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt(), SystemExit(3)])
def test_interrupts_take_the_failure_path_and_propagate(interrupt: BaseException) -> None:
    """KeyboardInterrupt and SystemExit inside the block release everything, without a barrier, and propagate."""
    actions = RecordingActions()
    with pytest.raises(type(interrupt)) as info, Session(actions) as session:
        run_to_training(session, actions)
        raise interrupt
    assert info.value is interrupt
    assert session.state is State.FAILED
    assert not set(actions.calls) & COLLECTIVES
    assert actions.calls[-2:] == ["abort_process_group", "close_store"]


def test_a_failing_success_step_switches_to_the_failure_plan() -> None:
    """From the first failed success step on, the failure plan runs: no barrier, abort not destroy; all reported."""
    actions = RecordingActions(
        fail_on={"destroy_model_parallel": RuntimeError("mp"), "abort_model_parallel": RuntimeError("mp abort")}
    )
    session = Session(actions)
    run_to_training(session, actions)
    session.finish()
    with pytest.raises(TeardownError) as info:
        session.close()
    # The success plan's failure, then the failure plan's release of what was still held.
    kinds = [f.step.kind for f in info.value.failures]
    assert kinds == [StepKind.DESTROY_MODEL_PARALLEL, StepKind.ABORT_MODEL_PARALLEL]
    assert session.state is State.FAILED
    assert actions.calls[-4:] == [
        "destroy_model_parallel",
        "abort_model_parallel",
        "abort_process_group",
        "close_store",
    ]
    assert "barrier" not in actions.calls and "destroy_process_group" not in actions.calls
    assert session.ledger.held() == (session.ledger.entry(Resource.MODEL_PARALLEL),)
    report = session.report
    assert report is not None and report.outcome is Outcome.FAILURE
    assert [(str(r.step), r.outcome.value) for r in report.records][-5:] == [
        ("destroy_microbatch_calculator", "success"),
        ("destroy_model_parallel", "success"),
        ("abort_model_parallel", "failure"),
        ("abort_process_group", "failure"),
        ("close_store", "failure"),
    ]


def test_a_user_release_that_raised_in_close_is_not_run_again() -> None:
    """A user release runs at most once per session: after it raised, the failure plan leaves it alone."""
    calls: list[str] = []

    def broken() -> None:
        calls.append("broken")
        raise ValueError("release went wrong")

    actions = RecordingActions()
    session = Session(actions)
    run_to_training(session, actions)
    session.register("broken", broken)
    session.finish()
    with pytest.raises(TeardownError):
        session.close()
    assert calls == ["broken"] and session.state is State.FAILED
    assert session.report is not None
    assert [why for entry, why in session.report.left if entry.name == "broken"] == [LeftReason.RELEASE_FAILED]
    assert "abort_process_group" in actions.calls and "barrier" not in actions.calls


def test_a_failure_during_acquisition_keeps_what_was_acquired_before_it() -> None:
    """If the second global fails to initialize, the first is released by the failure plan."""
    actions = RecordingActions(fail_on={"init_microbatch_calculator": RuntimeError("calc")})
    with pytest.raises(RuntimeError, match="calc"), Session(actions) as session:
        session.init_distributed()
        session.init_globals()
    assert session.state is State.FAILED
    assert actions.calls[4:] == ["abort_model_parallel", "abort_process_group", "close_store"]


def test_caller_owned_resources_are_used_and_never_released() -> None:
    """Resources found at acquisition are recorded as the caller's and get no teardown step."""
    actions = RecordingActions(caller_owns=[Resource.PROCESS_GROUP, Resource.MODEL_PARALLEL])
    with pytest.raises(RuntimeError), Session(actions) as session:
        run_to_training(session, actions)
        raise RuntimeError("x")
    assert session.ledger.owner(Resource.PROCESS_GROUP) is Owner.CALLER
    assert "abort_process_group" not in actions.calls and "abort_model_parallel" not in actions.calls
    assert LeftReason.CALLER in {why for _, why in session.report.left}  # type: ignore[union-attr]


def test_inprocess_refuses_a_caller_created_group_before_acquiring_anything() -> None:
    """Under in-process restart a group that already exists is refused; the session holds nothing of its own."""
    # A group that exists needs no rendezvous: the store is the caller's too (as TorchActions reports it).
    actions = RecordingActions(caller_owns=[Resource.RENDEZVOUS_STORE, Resource.PROCESS_GROUP])
    session = Session(actions, restart_mode=RestartMode.INPROCESS)
    with pytest.raises(LifecycleError, match="in-process restart"):
        session.init_distributed()
    assert [e.resource for e in session.ledger.entries] == [Resource.RENDEZVOUS_STORE]
    assert session.ledger.owner(Resource.RENDEZVOUS_STORE) is Owner.CALLER
    assert session.state is State.UNINITIALIZED


def test_a_first_trigger_refused_before_acquiring_anything_leaves_no_signal_handler() -> None:
    """A refused first trigger removes the interrupt shield it installed (it used to stay until the session ended)."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    session = Session(
        RecordingActions(caller_owns=[Resource.RENDEZVOUS_STORE, Resource.PROCESS_GROUP]),
        restart_mode=RestartMode.INPROCESS,
    )
    with pytest.raises(LifecycleError):
        session.init_distributed()
    assert {signum: signal.getsignal(signum) for signum in before} == before
    session.fail(RuntimeError("given up"))  # the failure edge still works, and leaves nothing installed either
    assert session.state is State.FAILED
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_inprocess_failure_defers_group_and_globals_to_the_wrapper() -> None:
    """Under in-process restart a failure releases neither group nor globals, and the report says so."""
    actions = RecordingActions()
    session = Session(actions, restart_mode=RestartMode.INPROCESS, iteration=2)
    run_to_training(session, actions)
    assert session.ledger.owner(Resource.PROCESS_GROUP) is Owner.RESTART_WRAPPER
    report = session.fail(RuntimeError("x"))
    assert actions.calls[5:] == ["abort_checkpoints", "release:b", "release:a", "close_store"]
    assert report.deferred_to_wrapper
    assert "iteration=2" in session.journal[0].detail and "inprocess" in session.journal[0].detail


def test_a_block_that_ends_early_fails_loudly() -> None:
    """Leaving the block in ``globals_ready`` without an exception releases everything and raises."""
    actions = RecordingActions()
    with pytest.raises(LifecycleError, match="ended in state 'globals_ready'"), Session(actions) as session:
        session.init_distributed()
        session.init_globals()
    assert session.state is State.FAILED and session.ledger.held() == ()


def test_the_journal_records_every_transition() -> None:
    """Each transition is journaled with source, destination, trigger, time and duration."""
    actions = RecordingActions()
    with Session(actions) as session:
        run_to_training(session, actions)
    journal = session.journal
    assert [(j.source, j.trigger, j.dest) for j in journal] == [
        (State.UNINITIALIZED, Trigger.INIT_DISTRIBUTED, State.DIST_READY),
        (State.DIST_READY, Trigger.INIT_GLOBALS, State.GLOBALS_READY),
        (State.GLOBALS_READY, Trigger.START_TRAINING, State.TRAINING),
        (State.TRAINING, Trigger.FINISH, State.FINALIZING),
        (State.FINALIZING, Trigger.CLOSE, State.CLOSED),
    ]
    assert all(j.duration_s >= 0 for j in journal)
    assert [j.at for j in journal] == sorted(j.at for j in journal)


def test_sigterm_becomes_a_requested_exit_and_the_handler_is_restored() -> None:
    """The installed SIGTERM handler records a requested exit; teardown puts the previous handler back."""
    previous = signal.getsignal(signal.SIGTERM)
    actions = RecordingActions()
    with Session(actions) as session:
        run_to_training(session, actions)
        session.install_signal_handlers()
        signal.raise_signal(signal.SIGTERM)
        assert session.exit_requested == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is previous
    assert session.state is State.CLOSED


def test_on_signal_replaces_the_requested_exit() -> None:
    """With ``on_signal`` a SIGTERM calls it instead of requesting an exit; what it raises takes the failure edge."""

    class Stop(Exception):
        pass

    seen: list[int] = []

    def on_signal(signum: int) -> None:
        seen.append(signum)
        raise Stop

    with pytest.raises(Stop), Session(RecordingActions()) as session:
        run_to_training(session, RecordingActions())
        session.install_signal_handlers(on_signal=on_signal)
        signal.raise_signal(signal.SIGTERM)
    assert seen == [signal.SIGTERM] and session.exit_requested is None and session.state is State.FAILED


def test_a_second_session_runs_after_a_failed_one() -> None:
    """A session is used once; a retry is a new session that can reach ``closed``."""
    actions = RecordingActions()
    with pytest.raises(RuntimeError), Session(actions) as first:
        first.init_distributed()
        raise RuntimeError("x")
    with Session(actions) as second:
        run_to_training(second, actions)
    assert (first.state, second.state) == (State.FAILED, State.CLOSED)


def test_an_interruption_during_teardown_is_raised_after_every_step_ran() -> None:
    """A Ctrl-C inside a teardown step does not cut teardown short; it is raised afterwards, chained."""
    interrupt = KeyboardInterrupt()
    actions = RecordingActions(fail_on={"abort_model_parallel": interrupt})
    session = Session(actions)
    run_to_training(session, actions)
    original = RuntimeError("x")
    with pytest.raises(KeyboardInterrupt) as info:
        session.fail(original)
    assert info.value is interrupt and interrupt.__cause__ is original
    assert actions.calls[-2:] == ["abort_process_group", "close_store"] and session.state is State.FAILED


def test_an_interruption_during_success_teardown_is_raised_after_the_failure_edge() -> None:
    """A Ctrl-C in a success step: every step runs, the session fails, and the same interrupt propagates."""
    interrupt = KeyboardInterrupt()
    actions = RecordingActions(fail_on={"barrier": interrupt})
    session = Session(actions)
    run_to_training(session, actions)
    session.finish()
    with pytest.raises(KeyboardInterrupt) as info:
        session.close()
    assert info.value is interrupt
    assert interrupt.__cause__ is None  # no step raised an Exception: there is no group to chain to
    assert any("teardown step barrier" in note for note in interrupt.__notes__)
    assert session.state is State.FAILED and session.ledger.held() == ()


def test_an_interrupt_inside_a_step_is_raised_after_teardown_from_the_group_of_the_other_failures() -> None:
    """Ctrl-C in one step, an error in another: every step runs, then the interrupt propagates from the group."""
    interrupt = KeyboardInterrupt()
    actions = RecordingActions(
        fail_on={"destroy_microbatch_calculator": interrupt, "destroy_rerun_state_machine": OSError("rerun")}
    )
    session = Session(actions)
    run_to_training(session, actions)
    session.register("user", lambda: actions.calls.append("user released"))
    session.finish()
    with pytest.raises(KeyboardInterrupt) as info:
        session.close()
    assert info.value is interrupt
    group = interrupt.__cause__
    assert isinstance(group, TeardownError) and isinstance(group, ExceptionGroup)
    assert [type(e) for e in group.exceptions] == [OSError, OSError]  # success step, then the failure plan's
    assert actions.calls.count("user released") == 1
    # The failure plan ran on past the interrupted step: model-parallel state and the group were released.
    assert actions.calls.index("abort_model_parallel") > actions.calls.index("destroy_microbatch_calculator")
    assert actions.calls[-2:] == ["abort_process_group", "close_store"] and "barrier" not in actions.calls
    held = {entry.resource for entry in session.ledger.held()}
    assert session.state is State.FAILED and held == {Resource.RERUN_STATE_MACHINE, Resource.MICROBATCH_CALCULATOR}


def test_except_star_on_a_teardown_error_keeps_its_type_and_its_steps() -> None:
    """``except*`` splits a ``TeardownError`` into ``TeardownError``s, each with the steps of its errors."""
    actions = RecordingActions(
        fail_on={
            "destroy_model_parallel": RuntimeError("mp"),
            "abort_model_parallel": RuntimeError("mp abort"),
            "abort_process_group": TimeoutError("b"),
        }
    )
    session = Session(actions)
    run_to_training(session, actions)
    session.finish()
    caught: dict[str, BaseExceptionGroup[BaseException]] = {}
    try:
        session.close()
    except* TimeoutError as timeouts:
        caught["timeout"] = timeouts
    except* RuntimeError as others:
        caught["runtime"] = others
    timeouts, others = caught["timeout"], caught["runtime"]
    assert isinstance(timeouts, TeardownError) and isinstance(others, TeardownError)
    assert [f.step.kind for f in timeouts.failures] == [StepKind.ABORT_PROCESS_GROUP]
    assert [f.step.kind for f in others.failures] == [StepKind.DESTROY_MODEL_PARALLEL, StepKind.ABORT_MODEL_PARALLEL]
    assert [f.error for f in others.failures] == list(others.exceptions)


def test_a_teardown_error_prints_every_failures_traceback() -> None:
    """Each step's error appears in the printed group with its own traceback and the step that raised it."""
    import traceback

    def broken() -> None:
        raise ValueError("release went wrong")

    session = Session(RecordingActions())
    run_to_training(session, RecordingActions())
    session.register("broken", broken)
    session.finish()
    with pytest.raises(TeardownError) as info:
        session.close()
    printed = "".join(traceback.format_exception(info.value))
    assert "in broken" in printed and "ValueError: release went wrong" in printed
    assert "teardown step release_user_resource:broken" in printed
    assert "test_session.py" in printed  # where the resource was acquired


def test_the_library_errors_survive_copy_and_pickle() -> None:
    """Errors rebuild from their fields with their notes (NVRx's Wrapper copies a failed iteration's exception)."""
    import copy
    import pickle

    from lifecycle import ConfigError, InjectedFault, Phase, StepFailure

    session = Session(RecordingActions())
    session.init_distributed()
    step = plan_teardown(session.ledger, RestartMode.ORDINARY, Outcome.SUCCESS)[0]
    errors: list[BaseException] = [
        InvalidTransition(State.DIST_READY, Trigger.CLOSE),
        ConfigError("world_size", "must be positive"),
        TeardownError((StepFailure(step, RuntimeError("x")),)),
        InjectedFault(Phase.STEP, 1, 3),
    ]
    for error in errors:
        error.add_note("a note")
        for clone in (copy.deepcopy(error), pickle.loads(pickle.dumps(error))):
            assert type(clone) is type(error) and str(clone) == str(error)
            assert clone.__notes__ == ["a note"] and clone.__dict__.keys() == error.__dict__.keys()
    session.fail(RuntimeError("end"))


def test_installing_signal_handlers_twice_is_refused_before_anything_is_installed() -> None:
    """A second ``install_signal_handlers`` raises ``AlreadyHeld`` and the original handler survives teardown."""
    original = signal.getsignal(signal.SIGTERM)
    session = Session(RecordingActions())
    run_to_training(session, RecordingActions())
    session.install_signal_handlers()
    ours = signal.getsignal(signal.SIGTERM)
    with pytest.raises(AlreadyHeld) as info:
        session.install_signal_handlers()
    assert info.value.resource == "signal_handlers" and signal.getsignal(signal.SIGTERM) is ours
    session.fail(RuntimeError("x"))
    assert signal.getsignal(signal.SIGTERM) is original


def test_restoring_handlers_leaves_a_handler_installed_later_alone() -> None:
    """Teardown puts the previous handler back only if ours is still the installed one."""
    original = signal.getsignal(signal.SIGTERM)

    def later(signum: int, frame: object) -> None:
        """A handler the caller installed after the session's."""

    session = Session(RecordingActions())
    run_to_training(session, RecordingActions())
    session.install_signal_handlers()
    try:
        signal.signal(signal.SIGTERM, later)
        session.fail(RuntimeError("x"))
        assert signal.getsignal(signal.SIGTERM) is later
    finally:
        signal.signal(signal.SIGTERM, original)


def test_registering_a_user_name_twice_is_refused() -> None:
    """A user resource name is recorded once per session; the second ``register`` raises ``AlreadyHeld``."""
    session = Session(RecordingActions())
    run_to_training(session, RecordingActions())
    session.register("file", lambda: None)
    with pytest.raises(AlreadyHeld, match="user:file"):
        session.register("file", lambda: None)
    session.fail(RuntimeError("x"))


def test_a_requested_exit_during_a_failure_is_carried_by_the_exception() -> None:
    """A SIGTERM recorded before the failure is torn down reaches the caller: ``requested_exit`` and a note."""
    original = signal.getsignal(signal.SIGTERM)
    error = RuntimeError("peer gone")
    with pytest.raises(RuntimeError) as info, Session(RecordingActions()) as session:
        run_to_training(session, RecordingActions())
        session.install_signal_handlers()
        signal.raise_signal(signal.SIGTERM)
        raise error
    assert info.value is error and error.requested_exit == "SIGTERM"  # type: ignore[attr-defined]
    assert any("do not retry" in note for note in error.__notes__)
    assert signal.getsignal(signal.SIGTERM) is original


def test_an_error_whose_str_and_repr_raise_is_still_reraised_as_the_same_object() -> None:
    """A broken ``__str__``/``__repr__`` never replaces the original error nor leaves the session live."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str")

        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    error = Unprintable()
    actions = RecordingActions(fail_on={"abort_model_parallel": Unprintable()})
    with pytest.raises(Unprintable) as info, Session(actions) as session:
        run_to_training(session, actions)
        raise error
    assert info.value is error and session.state is State.FAILED
    assert session.journal[-1].detail.startswith("Unprintable")
    assert "Unprintable" in error.__notes__[0]


def test_the_error_is_logged_with_the_label_before_anything_is_released(caplog: pytest.LogCaptureFixture) -> None:
    """The cause reaches the log before teardown begins, so a teardown that hangs cannot hide it."""
    seen_at_release: list[int] = []
    session = Session(RecordingActions(), label="rank 3")
    run_to_training(session, RecordingActions())
    session.register("probe", lambda: seen_at_release.append(len(caplog.records)))
    with caplog.at_level("ERROR", logger="lifecycle.session"):
        session.fail(ValueError("bad batch"))
    first = caplog.records[0].getMessage()
    assert "rank 3" in first and "ValueError: bad batch" in first and "training" in first
    assert seen_at_release == [1]  # logged, then released


def test_the_callers_frames_keep_their_locals_after_a_failure() -> None:
    """Teardown never clears the caller's frames: a post-mortem debugger still reads their locals."""

    def training_step() -> None:
        batch_id = 41
        raise ValueError(f"bad batch {batch_id}")

    with pytest.raises(ValueError) as info, Session(RecordingActions()) as session:
        run_to_training(session, RecordingActions())
        training_step()
    frames = [tb.tb_frame for tb in _walk(info.value.__traceback__)]
    step_frame = next(f for f in frames if f.f_code.co_name == "training_step")
    assert step_frame.f_locals["batch_id"] == 41


def _walk(tb: object) -> list[Any]:
    """The traceback entries of ``tb``, outermost first."""
    out = []
    while tb is not None:
        out.append(tb)
        tb = tb.tb_next  # type: ignore[attr-defined]
    return out
