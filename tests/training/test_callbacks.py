"""Callbacks get a ``SessionHandle``: register, request_exit, state and iteration; never the session's triggers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.configs import config_of_one
from support.probes import alive
from support.session import drive

from lifecycle import (
    Callback,
    CheckpointConfig,
    ExitReason,
    FaultInjection,
    InjectedFault,
    InvalidTransition,
    Phase,
    Session,
    SessionFinished,
    SessionHandle,
    State,
    TorchActions,
    TrainContext,
    Trigger,
    pretrain,
)
from lifecycle.testing import RecordingActions

NOTHING_LIVE = dict.fromkeys(alive(), False)
HANDLE_API = {"register", "request_exit", "state", "iteration"}
NOT_ON_THE_HANDLE = (
    "init_distributed",
    "init_globals",
    "start_training",
    "finish",
    "close",
    "fail",
    "install_signal_handlers",
    "track_checkpoints",
    "add_observer",
    "ledger",
    "journal",
    "report",
    "exit_requested",
    "restart_mode",
    "session",
)


@dataclass
class Seen:
    """What a ``Recorder`` saw: per hook, the argument it got, the state and iteration it read."""

    handles: list[object] = field(default_factory=list)
    events: list[str] = field(default_factory=list)


class Recorder(Callback):
    """Records every hook's first argument and what it reads; registers a resource in ``on_setup_end``."""

    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    def note(self, session: SessionHandle, event: str) -> None:
        self.seen.handles.append(session)
        self.seen.events.append(f"{event}:{session.state.value}:{session.iteration}")

    def on_setup_end(self, session: SessionHandle, ctx: TrainContext) -> None:
        self.note(session, "setup")
        session.register("recorder", lambda: self.seen.events.append(f"released:{session.state.value}"))

    def on_train_start(self, session: SessionHandle, ctx: TrainContext) -> None:
        self.note(session, "start")

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        self.note(session, f"step{step}")

    def on_eval_end(self, session: SessionHandle, step: int, loss: float) -> None:
        self.note(session, f"eval{step}")

    def on_checkpoint_saved(self, session: SessionHandle, step: int, directory: Path) -> None:
        self.note(session, f"save{step}")

    def on_train_end(self, session: SessionHandle, step: int, reason: ExitReason) -> None:
        self.note(session, f"end{step}")


@pytest.fixture(scope="module")
def one_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Seen, Session]:
    """One successful 2-step run on a session of iteration 2 (given by the caller), recorded by a ``Recorder``."""
    tmp_path = tmp_path_factory.mktemp("one_run")
    config = config_of_one(tmp_path, iterations=2, checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt"), interval=2))
    session = Session(TorchActions(config.distributed, config.parallel), iteration=2)
    seen = Seen()
    pretrain(config, callbacks=[Recorder(seen)], session=session)
    return seen, session


def test_every_hook_receives_one_session_handle_not_the_session(one_run: tuple[Seen, Session]) -> None:
    """Every hook of a run gets the same SessionHandle object, never the Session it wraps."""
    seen, session = one_run
    assert len(seen.handles) == 7  # setup, start, step1, step2, eval2, save2, end2
    assert all(type(h) is SessionHandle for h in seen.handles)
    assert len({id(h) for h in seen.handles}) == 1
    assert all(h is not session for h in seen.handles)


def test_state_and_iteration_are_read_live_through_the_handle(one_run: tuple[Seen, Session]) -> None:
    """Each hook reads the session's current state and its iteration (2, as the caller built it) via the handle."""
    seen, session = one_run
    assert seen.events[:-1] == [
        "setup:globals_ready:2",
        "start:training:2",
        "step1:training:2",
        "step2:training:2",
        "eval2:training:2",
        "save2:training:2",
        "end2:finalizing:2",
    ]
    handle = seen.handles[0]
    assert isinstance(handle, SessionHandle)
    assert (handle.state, handle.iteration) == (session.state, 2) == (State.CLOSED, 2)


def test_register_through_the_handle_runs_at_teardown_on_success(one_run: tuple[Seen, Session]) -> None:
    """A resource registered through the handle is released by the success plan, after on_train_end."""
    seen, session = one_run
    assert type(seen.handles[0]) is SessionHandle  # on_setup_end registered through it
    assert seen.events[-2:] == ["end2:finalizing:2", "released:finalizing"]
    assert session.journal[-1].dest is State.CLOSED


def test_register_through_the_handle_runs_at_teardown_on_failure(tmp_path: Path) -> None:
    """A resource registered through the handle is released by the failure plan when step 2 fails."""
    seen = Seen()
    config = config_of_one(tmp_path, fault=FaultInjection(Phase.STEP, rank=0, step=2))
    with pytest.raises(InjectedFault):
        pretrain(config, callbacks=[Recorder(seen)])
    assert all(type(h) is SessionHandle for h in seen.handles)
    assert seen.events[-2:] == ["step1:training:0", "released:training"]  # no hook after the failure
    assert alive() == NOTHING_LIVE


def test_request_exit_through_the_handle_stops_the_run_gracefully(tmp_path: Path) -> None:
    """request_exit on the handle in step 2's hook ends the loop after step 3 as a requested exit, closed."""

    class StopAt2(Callback):
        def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
            assert type(session) is SessionHandle
            if step == 2:
                session.request_exit("enough")

    config = config_of_one(tmp_path, iterations=20, checkpoint=CheckpointConfig())
    result = pretrain(config, callbacks=[StopAt2()])
    assert (result.final_step, result.exit_reason, result.exit_detail) == (3, ExitReason.REQUESTED, "enough")
    assert result.journal[-1].dest is State.CLOSED


def test_the_handle_offers_nothing_but_its_api() -> None:
    """Triggers, ledger, journal and the session itself raise AttributeError; no attribute can be added."""
    session = Session(RecordingActions(), iteration=4)
    handle = SessionHandle(session)
    assert {name for name in dir(handle) if not name.startswith("_")} == HANDLE_API
    for name in NOT_ON_THE_HANDLE:
        with pytest.raises(AttributeError):
            getattr(handle, name)
    with pytest.raises(AttributeError):
        handle.session = session  # type: ignore[attr-defined]
    assert not hasattr(handle, "__dict__")
    assert (handle.state, handle.iteration) == (State.UNINITIALIZED, 4)
    assert repr(handle) == "<SessionHandle state=uninitialized restart_mode=ordinary iteration=4 exit_requested=None>"
    handle.request_exit("first")
    handle.request_exit("second")
    assert session.exit_requested == "first"


def test_register_through_the_handle_forwards_to_the_session() -> None:
    """register on the handle records a user resource the session releases; after close it raises SessionFinished."""
    session = Session(RecordingActions())
    handle = SessionHandle(session)
    released: list[str] = []
    drive(session, State.TRAINING)
    handle.register("mine", lambda: released.append("mine"))
    assert handle.state is State.TRAINING
    session.finish()
    session.close()
    assert released == ["mine"]
    with pytest.raises(SessionFinished):
        handle.register("late", lambda: None)


def test_pretrain_refuses_a_finished_session(tmp_path: Path) -> None:
    """A closed session given to pretrain raises SessionFinished(closed, "pretrain"); nothing runs."""
    session = Session(RecordingActions())
    drive(session, State.FINALIZING)
    session.close()
    with pytest.raises(SessionFinished) as caught:
        pretrain(config_of_one(tmp_path), session=session)
    assert (caught.value.state, caught.value.action) == (State.CLOSED, "pretrain")


def test_pretrain_refuses_a_live_session_past_uninitialized(tmp_path: Path) -> None:
    """A session already in dist_ready raises InvalidTransition(dist_ready, init_distributed); it is left as it was."""
    session = Session(RecordingActions())
    drive(session, State.DIST_READY)
    with pytest.raises(InvalidTransition) as caught:
        pretrain(config_of_one(tmp_path), session=session)
    assert (caught.value.state, caught.value.trigger) == (State.DIST_READY, Trigger.INIT_DISTRIBUTED)
    assert session.state is State.DIST_READY
    session.fail(RuntimeError("test over"))  # the live session's own shield goes with it
