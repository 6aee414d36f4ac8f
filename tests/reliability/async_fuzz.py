"""The asynchronous-exception fuzzer's machinery: an exception raised into the main thread at a chosen line event.

NVRx's in-process restart raises ``RankShouldRestart`` into the main thread with
``PyThreadState_SetAsyncExc``, on whatever bytecode it runs. A *case* picks one line
event (``sys.settrace``) of lifecycle's own files while a session runs as a caller drives
it: the triggers, a ``register``, ``track_checkpoints`` and ``install_signal_handlers``
inside ``with session:``, then the failure edge (an error in the block) or the success
plan (the block ends). At that event the exception lands: raised by the tracer where the
main thread runs the line; sent with ``PyThreadState_SetAsyncExc`` where a teardown's
worker runs it (the main thread is waiting then, and gets it where it waits).

Not a target: the first line event of a call the caller makes (``init_distributed``,
``__exit__`` …): an exception landing there is indistinguishable from one landing in the
caller's own code just before the call, which no library can intercept.

``run_case`` returns what the checks need; each check is ``Run -> list[str]``.
"""

from __future__ import annotations

import ctypes
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from types import CodeType, FrameType
from typing import Any

from reliability.fuzz import PACKAGE_DIR, POOL, POOL_KIND, drain_leftovers, kept_handlers, with_exits
from support.internals import LEFTOVERS, WORKERS, serve_code, worker

from lifecycle import Session, State
from lifecycle.testing import RecordingActions, RecordingCheckpoints

MAIN = threading.main_thread()
_SKIPPED_FILES = frozenset({worker.__file__})
_SKIPPED_CODES = frozenset({serve_code})


class Landed(BaseException):
    """The asynchronous exception: a ``BaseException``, like ``RankShouldRestart``."""


class Scenario(StrEnum):
    """How the ``with session:`` block ends."""

    FAIL = "fail"
    """An error in the block: the failure edge."""
    CLOSE = "close"
    """The block ends: finish and close (the success plan)."""


@dataclass(frozen=True)
class Case:
    """One run: the scenario, and the index of the line event the exception lands at."""

    scenario: Scenario
    at: int

    def __str__(self) -> str:
        return f"{self.scenario}@{self.at}"


class Tracer:
    """Counts line events of lifecycle's frames (main thread and idle workers); lands ``Landed`` at ``at``."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.index = 0
        self.events: list[str] = []
        self.where = ""
        self.due = False
        self.fired = False

    def start(self) -> None:
        """Trace the idle workers (those a session starts are started first) and this thread."""
        WORKERS.prepare()
        WORKERS.on_idle_workers(lambda: sys.settrace(self._call))
        sys.settrace(self._call)

    def stop(self) -> None:
        """Stop tracing."""
        sys.settrace(None)
        WORKERS.on_idle_workers(lambda: sys.settrace(None))

    def _call(self, frame: FrameType, event: str, arg: object) -> Any:
        code = frame.f_code
        if not code.co_filename.startswith(PACKAGE_DIR) or code.co_filename in _SKIPPED_FILES or code in _SKIPPED_CODES:
            return None
        back = frame.f_back
        entry = back is None or not back.f_code.co_filename.startswith(PACKAGE_DIR)
        return _Local(self, entry, code)

    def line(self, frame: FrameType) -> None:
        """One counted line event: land here if it is the planned one."""
        index = self.index
        self.index += 1
        self.events.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
        if index == self.at:
            self.due = True
        if not self.due or self.fired or (threading.current_thread() is MAIN and _at_with_exit(frame)):
            return  # CPython lands nothing where a with statement's __exit__ is about to run: the next line then
        self.fired = True
        self.where = f"{frame.f_code.co_qualname}:{frame.f_lineno} on {threading.current_thread().name}"
        self.land()

    def land(self) -> None:
        """Land the exception: raised here on the main thread; from a worker, sent to the main thread."""
        if threading.current_thread() is MAIN:
            raise Landed(self.where)
        assert MAIN.ident is not None
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(MAIN.ident), ctypes.py_object(Landed))


def _at_with_exit(frame: FrameType) -> bool:
    """True where a ``with`` statement's ``__exit__`` is about to be called (a ``return`` inside one: a SWAP first)."""
    exits = with_exits(frame.f_code)
    return frame.f_lasti in exits or frame.f_lasti + 2 in exits


class _Local:
    """The local trace function of one frame; the first line of a caller's call is not a target."""

    def __init__(self, tracer: Tracer, entry: bool, code: CodeType) -> None:
        self.tracer, self.skip_first = tracer, entry

    def __call__(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "line":
            if self.skip_first:
                self.skip_first = False
            else:
                self.tracer.line(frame)
        return self


@dataclass
class Run:
    """What one case left to check."""

    case: Case
    where: str
    fired: bool
    session: Session
    raised: BaseException | None
    handlers_restored: bool
    held: tuple[str, ...]
    pool_open_after: bool
    next_state: State | None
    next_error: BaseException | None = None
    leftovers_after: tuple[str, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        return f"{self.case} [{self.where or 'not fired'}] → {self.session.state}, raised {self.raised!r}"


def drive(scenario: Scenario, actions: RecordingActions) -> Session:
    """A session driven as a caller would, in ``with session:``; raises what reaches the caller."""
    calls = actions.calls
    session = Session(actions, label="fuzzed")
    with session:
        session.init_distributed()
        session.init_globals()
        session.start_training()
        session.register("user", lambda: calls.append("release:user"))
        session.track_checkpoints(RecordingCheckpoints(calls=calls))
        session.install_signal_handlers()
        if scenario is Scenario.FAIL:
            raise RuntimeError("injected")
    return session


def count(scenario: Scenario) -> int:
    """How many line events a clean run of ``scenario`` has (the cases are 0 .. count - 1)."""
    return len(lines(scenario))


def lines(scenario: Scenario) -> list[str]:
    """The line events of a clean run of ``scenario``, in order: ``qualname:lineno`` (case ``i`` lands at the i-th)."""
    drain_leftovers()
    tracer = Tracer(None)
    actions = RecordingActions()
    with kept_handlers():
        tracer.start()
        try:
            drive(scenario, actions)
        except RuntimeError:
            pass
        finally:
            tracer.stop()
    POOL.close()
    return list(tracer.events)


def run_case(case: Case, session_box: Callable[[], Session | None] | None = None) -> Run:
    """Run ``case``, then a fresh session to ``closed``; handlers restored whatever happens."""
    drain_leftovers()
    with kept_handlers():
        before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        blocked_before = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        tracer = Tracer(case.at)
        actions = RecordingActions()
        made: list[Session] = []
        original_init = Session.__init__

        def remember(self: Session, *args: Any, **kwargs: Any) -> None:
            made.append(self)
            original_init(self, *args, **kwargs)

        Session.__init__ = remember  # type: ignore[method-assign]
        raised: BaseException | None = None
        try:
            tracer.start()
            try:
                drive(case.scenario, actions)
            finally:
                tracer.stop()
        except BaseException as exc:  # noqa: BLE001 - what reached the caller is the result
            raised = exc
        finally:
            Session.__init__ = original_init  # type: ignore[method-assign]
        # An exception sent to the main thread just as the run ended may still be pending: let it land here.
        try:
            for _ in range(3):
                threading.Event().wait(0.001)
        except Landed as late:
            raised = raised if raised is not None else late
        session = made[0]
        restored = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == before
        blocked_after = signal.pthread_sigmask(signal.SIG_SETMASK, blocked_before)  # put back for what follows
        restored = restored and blocked_after == blocked_before
        held = tuple(str(entry) for entry in session.ledger.held()) if hasattr(session, "_holdings") else ()
        pool_open = POOL.is_open()
        nxt = Session(RecordingActions(), label="next")
        next_error: BaseException | None = None
        try:
            with nxt:
                nxt.init_distributed()
                nxt.init_globals()
                nxt.start_training()
        except BaseException as exc:  # noqa: BLE001 - recorded: a check names it
            next_error = exc
        left = tuple(str(item.entry) for item in LEFTOVERS.peek() if item.entry.resource is POOL_KIND)
        return Run(
            case, tracer.where, tracer.fired, session, raised, restored, held, pool_open, nxt.state, next_error, left
        )


# -- checks --------------------------------------------------------------------------------


def check_final(run: Run) -> list[str]:
    """The session is final, and owns nothing it did not report left running or failed.

    A session whose constructor the exception cut short never started: it must hold nothing.
    """
    session = run.session
    if getattr(session, "_driver", None) is None:
        return []  # constructed only in part: it acquired nothing (nothing can be asked of it)
    if session.state is State.UNINITIALIZED and not run.held:
        return []
    if not session.state.is_final:
        return [f"left live in {session.state}"]
    report = session.report
    running = {str(step.entry) for step in report.left_running} if report is not None else set()
    failed = {str(entry) for entry in session.ledger.entries if entry.key in session.ledger.failed}
    return [f"still holds {entry}" for entry in run.held if entry not in running and entry not in failed]


def check_landed_once(run: Run) -> list[str]:
    """The exception reaches the caller, exactly once: raised as itself (NVRx must get its request)."""
    if not run.fired:
        return ["the case's line event never came"]
    if not isinstance(run.raised, Landed):
        return [f"the caller got {run.raised!r}, not the landed exception"]
    seen, chain, error = 0, set(), run.raised
    while error is not None and id(error) not in chain:
        chain.add(id(error))
        seen += isinstance(error, Landed)
        error = error.__cause__ or error.__context__
    return [] if seen == 1 else [f"the landed exception reaches the caller {seen} times in one chain"]


def check_handlers(run: Run) -> list[str]:
    """SIGINT and SIGTERM have the handlers they had before the session, and are blocked (or not) as before."""
    if run.handlers_restored:
        return []
    return ["a SIGINT/SIGTERM handler, or the main thread's signal mask, is not what it was before the session"]


def check_next(run: Run) -> list[str]:
    """A fresh session then reaches ``closed``; nothing of the pool is left on record or open."""
    problems = []
    if run.next_state is not State.CLOSED:
        problems.append(f"the next session ended {run.next_state}: {run.next_error!r}")
    if run.leftovers_after:
        problems.append(f"leftovers still on record after the next session: {run.leftovers_after}")
    if POOL.is_open():
        problems.append("the pool is still open after the next session")
    return problems


CHECKS = (check_final, check_landed_once, check_handlers, check_next)


def problems_of(run: Run) -> dict[str, list[str]]:
    """Every check's problems for ``run`` (only the checks that found some)."""
    found = {check.__name__: check(run) for check in CHECKS}
    return {name: problems for name, problems in found.items() if problems}
