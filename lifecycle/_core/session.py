"""The session: one training run's life, driven along the declared table."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

from lifecycle._core.errors import InvalidTransition, LifecycleError
from lifecycle._core.executor import StepFailure, StepRecord, TeardownError, TeardownReport, execute
from lifecycle._core.machine import TriggerModel, build_machine
from lifecycle._core.ownership import GLOBALS, Ledger, LedgerEntry, Owner, Resource
from lifecycle._core.plans import Outcome, RestartMode, Step, StepKind, left_alone, plan_teardown
from lifecycle._core.seams import CheckpointWriter, DistributedActions
from lifecycle._core.signals import InstalledHandlers
from lifecycle._core.states import State, Trigger
from lifecycle._core.table import find_edge


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One transition taken: from, to, by which trigger, when (monotonic s) and how long it took."""

    source: State
    dest: State
    trigger: Trigger
    at: float
    duration_s: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class TransitionEvent:
    """A transition just taken (``entry``); its work ran from ``start`` to ``end`` (wall-clock, ``time.time()``)."""

    entry: JournalEntry
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class TeardownEvent:
    """A step of a teardown plan of ``outcome`` just ran (``record``); from ``start`` to ``end``, wall-clock seconds."""

    outcome: Outcome
    record: StepRecord
    start: float
    end: float


SessionEvent = TransitionEvent | TeardownEvent
"""What a session observer is called with (see ``Session.add_observer``)."""

logger = logging.getLogger("lifecycle.session")


class Session:
    """One distributed training session: use it once, then start a new one.

    Triggers (``init_distributed`` … ``close``, ``fail``) raise ``InvalidTransition``
    before any side effect when the current state declares no edge for them. As a
    context manager, an exception inside the block (``KeyboardInterrupt`` and
    ``SystemExit`` too) takes the failure edge and propagates unchanged; a block that
    ends normally in ``training`` or ``finalizing`` is finished and closed, and one
    that ends in an earlier live state takes the failure edge and raises
    ``LifecycleError``.
    """

    def __init__(
        self,
        actions: DistributedActions,
        *,
        restart_mode: RestartMode = RestartMode.ORDINARY,
        iteration: int = 0,
    ) -> None:
        """Bind a new session, in ``uninitialized``, to ``actions`` (what it does to torch/Megatron)."""
        self._actions = actions
        self.restart_mode = restart_mode
        self.iteration = iteration
        self._model = TriggerModel()
        self._machine = build_machine(self._model)
        self._ledger = Ledger()
        self._journal: list[JournalEntry] = []
        self._report: TeardownReport | None = None
        self._checkpoints: CheckpointWriter | None = None
        self._user: dict[str, Callable[[], object]] = {}
        self._signals: InstalledHandlers | None = None
        self._exit_request: str | None = None
        self._observers: list[Callable[[SessionEvent], object]] = []

    # -- what can be read -------------------------------------------------------------

    @property
    def state(self) -> State:
        """The current state."""
        return State(self._model.state)

    @property
    def ledger(self) -> Ledger:
        """The ownership ledger (an immutable snapshot): which ``Owner`` holds each acquired ``Resource``."""
        return self._ledger

    @property
    def journal(self) -> tuple[JournalEntry, ...]:
        """Every transition taken, in order."""
        return tuple(self._journal)

    @property
    def report(self) -> TeardownReport | None:
        """The report of the last teardown, or None before any teardown ran."""
        return self._report

    @property
    def exit_requested(self) -> str | None:
        """Why a graceful exit was requested (e.g. ``"SIGTERM"``), or None."""
        return self._exit_request

    # -- triggers ---------------------------------------------------------------------

    def init_distributed(self) -> None:
        """``uninitialized`` → ``dist_ready``: create (or find) the default process group."""
        start = self._check(Trigger.INIT_DISTRIBUTED)
        self._acquire(Resource.PROCESS_GROUP, self._actions.init_process_group)
        detail = f"restart_mode={self.restart_mode.value} iteration={self.iteration}"
        self._move(Trigger.INIT_DISTRIBUTED, start, detail)

    def init_globals(self) -> None:
        """``dist_ready`` → ``globals_ready``: model-parallel state, microbatch calculator, rerun state machine."""
        start = self._check(Trigger.INIT_GLOBALS)
        self._acquire(Resource.MODEL_PARALLEL, self._actions.init_model_parallel)
        self._acquire(Resource.MICROBATCH_CALCULATOR, self._actions.init_microbatch_calculator)
        self._acquire(Resource.RERUN_STATE_MACHINE, self._actions.init_rerun_state_machine)
        self._move(Trigger.INIT_GLOBALS, start)

    def start_training(self) -> None:
        """``globals_ready`` → ``training``."""
        self._move(Trigger.START_TRAINING, self._check(Trigger.START_TRAINING))

    def finish(self) -> None:
        """``training`` → ``finalizing``: the loop ended normally or by a requested exit."""
        self._move(Trigger.FINISH, self._check(Trigger.FINISH))

    def close(self) -> TeardownReport:
        """``finalizing`` → ``closed``: run the success plan, and return its report.

        If a step raises, every later step still runs, then the session takes the
        failure edge (releasing only what is still held) and raises ``TeardownError``
        carrying every step's failure; if a step was interrupted (Ctrl-C, ``SystemExit``),
        that interruption is raised instead, from the ``TeardownError``.
        """
        start = self._check(Trigger.CLOSE)
        report = self._teardown(Outcome.SUCCESS)
        if report.failed:
            error = TeardownError(report.failed)
            self._fail_after(start, error)
            interruption = _first_interruption(report.failed)
            if interruption is not None:
                raise interruption from error
            raise error
        self._move(Trigger.CLOSE, start)
        return report

    def fail(self, error: BaseException) -> TeardownReport:
        """Any live state → ``failed``: run the failure plan because of ``error``, and return the report.

        ``error`` is not raised here: re-raise it yourself (the context manager does).
        Each failed step adds a note to ``error``. If a step was interrupted by a
        ``BaseException`` that is not an ``Exception`` (Ctrl-C, a restart request), the
        remaining steps still run and that interruption is raised afterwards.
        """
        return self._fail_after(self._check(Trigger.FAIL), error)

    # -- resources acquired while live ------------------------------------------------

    def track_checkpoints(self, writer: CheckpointWriter) -> None:
        """Record ``writer``'s in-flight saves: finalized on success, aborted on failure."""
        self._check_live("track_checkpoints")
        self._ledger = self._ledger.acquire(LedgerEntry(Resource.ASYNC_CHECKPOINT, Owner.SESSION))
        self._checkpoints = writer

    def register(self, name: str, release: Callable[[], object]) -> None:
        """Record a user resource ``name``; ``release()`` runs at teardown, in reverse registration order."""
        self._check_live("register")
        self._ledger = self._ledger.acquire(LedgerEntry(Resource.USER, Owner.SESSION, name))
        self._user[name] = release

    def install_signal_handlers(self, signums: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        """Turn each of ``signums`` into a requested exit (see ``exit_requested``); restored at teardown."""
        self._check_live("install_signal_handlers")

        def request(signum: int, frame: FrameType | None) -> None:
            self.request_exit(signal.Signals(signum).name)

        self._signals = InstalledHandlers(signums, request)
        self._ledger = self._ledger.acquire(LedgerEntry(Resource.SIGNAL_HANDLERS, Owner.SESSION))

    def request_exit(self, reason: str) -> None:
        """Ask the training loop to stop gracefully; the first reason given is kept."""
        if self._exit_request is None:
            self._exit_request = reason

    def add_observer(self, observer: Callable[[SessionEvent], object]) -> None:
        """Call ``observer`` right after each transition and each teardown step, with what happened.

        Observers run on the thread that drives the session, in the order added; ``end``
        times are taken when the event happens and ``start`` is ``end`` less its duration.
        An ``Exception`` an observer raises is logged as a warning and otherwise ignored:
        it never changes what the session does or how it ends.
        """
        self._observers.append(observer)

    # -- context manager --------------------------------------------------------------

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            if not self.state.is_final:
                self.fail(exc)
            return
        if self.state is State.TRAINING:
            self.finish()
        if self.state is State.FINALIZING:
            self.close()
        elif not self.state.is_final:
            error = LifecycleError(f"the session block ended in state {self.state.value!r} without finishing")
            self.fail(error)
            raise error

    # -- internals --------------------------------------------------------------------

    def _check(self, trigger: Trigger) -> float:
        if find_edge(self.state, trigger) is None:
            raise InvalidTransition(self.state, trigger.value)
        return time.monotonic()

    def _check_live(self, what: str) -> None:
        if self.state.is_final:
            raise InvalidTransition(self.state, what)

    def _move(self, trigger: Trigger, start: float, detail: str = "") -> None:
        source = self.state
        getattr(self._model, trigger.value)()
        now = time.monotonic()
        entry = JournalEntry(source, self.state, trigger, now, now - start, detail)
        self._journal.append(entry)
        if self._observers:
            end = time.time()
            self._notify(TransitionEvent(entry, end - entry.duration_s, end))

    def _notify(self, event: SessionEvent) -> None:
        for observer in self._observers:
            try:
                observer(event)
            except Exception:  # an observer must never change the session's outcome
                logger.warning("session observer %r failed on %s; ignored", observer, event, exc_info=True)

    def _acquire(self, resource: Resource, acquire: Callable[[], Owner]) -> None:
        owner = acquire()
        wrapped = resource is Resource.PROCESS_GROUP or resource in GLOBALS
        if self.restart_mode is RestartMode.INPROCESS and wrapped:
            if owner is Owner.CALLER:
                raise LifecycleError(
                    f"{resource.value} already exists, created by the caller; under in-process restart "
                    "the session must create it (the restart wrapper releases it on failure)"
                )
            owner = Owner.RESTART_WRAPPER
        self._ledger = self._ledger.acquire(LedgerEntry(resource, owner))

    def _teardown(self, outcome: Outcome) -> TeardownReport:
        plan = plan_teardown(self._ledger, self.restart_mode, outcome)
        left = left_alone(self._ledger, self.restart_mode, outcome)

        def observed(record: StepRecord) -> None:
            end = time.time()
            self._notify(TeardownEvent(outcome, record, end - record.duration_s, end))

        report, self._ledger = execute(
            plan,
            self._perform,
            self._ledger,
            outcome=outcome,
            restart_mode=self.restart_mode,
            left=left,
            on_step=observed if self._observers else None,
        )
        self._report = report
        return report

    def _fail_after(self, start: float, error: BaseException) -> TeardownReport:
        report = self._teardown(Outcome.FAILURE)
        for failure in report.failed:
            error.add_note(f"lifecycle: teardown step {failure.step} also failed: {failure.error!r}")
        self._move(Trigger.FAIL, start, f"{type(error).__name__}: {error}")
        interruption = _first_interruption(report.failed)
        if interruption is not None and interruption is not error:
            raise interruption from error
        return report

    def _perform(self, step: Step) -> None:
        kind = step.kind
        if kind is StepKind.FINALIZE_CHECKPOINTS:
            assert self._checkpoints is not None  # set together with its ledger entry
            self._checkpoints.finalize()
        elif kind is StepKind.ABORT_CHECKPOINTS:
            assert self._checkpoints is not None
            self._checkpoints.abort()
        elif kind is StepKind.RELEASE_USER_RESOURCE:
            self._user[step.entry.name]()
        elif kind is StepKind.RESTORE_SIGNAL_HANDLERS:
            assert self._signals is not None  # set together with its ledger entry
            self._signals.restore()
        else:
            action: Callable[[], Any] = getattr(self._actions, kind.value)
            action()


def _first_interruption(failures: tuple[StepFailure, ...]) -> BaseException | None:
    for failure in failures:
        if not isinstance(failure.error, Exception):
            return failure.error
    return None
