"""A bare ``Session.fail()``: an asynchronous exception landing before its teardown is protected still ends it final.

The teardown is protected once the main thread waits for it on a worker (``run_waiting``'s
loop, where each wait slice is ``_serve``): what lands there is recorded and raised once
the session is final. Before that, ``fail`` runs ordinary bytecode on the main thread: its
own, the shield's ``install``, the job's creation, the hand-over to a worker. The gate here
(``sys.settrace`` with ``f_trace_opcodes``) lands a ``KeyboardInterrupt`` at each bytecode
boundary of that stretch where CPython lands one (a function's entry, after each call, a
backward jump: ``breaker_checks``), one per run, in every frame the main thread runs (the
standard library's included): every run must end ``failed``, holding nothing, with the handlers as
they were, and the exception raised to the caller once, from the failure.

Not a target: ``fail``'s own entry before its first instruction that does anything
(``RESUME``, a ``try``'s ``NOP``): an exception landing there is one landing in the
caller's code just before the call, which no library can intercept (as in
``reliability.async_fuzz``); nor a ``with`` statement's exit up to its ``__exit__`` call,
where CPython lands nothing (``with_exit_calls``). On the old ``fail`` (no recovery before the wait) 1 run in
400 of the seeded async fuzzer left the session in ``training`` holding everything.
"""

from __future__ import annotations

import contextlib
import dis
import itertools
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

import pytest
from reliability.fuzz import declare_pool, drain_leftovers, kept_handlers, with_exits

from lifecycle import Session, State
from lifecycle.testing import RecordingActions, RecordingCheckpoints

MAIN = threading.main_thread()
FAIL = Session.fail.__code__
INERT = frozenset({"RESUME", "NOP"})
"""Instructions that do nothing: before ``fail``'s first other one, a landing is the caller's."""
_INERT_OFFSETS = frozenset(i.offset for i in dis.get_instructions(FAIL) if i.opname in INERT)


def with_exit_calls(code: CodeType) -> frozenset[int]:
    """The offsets of each ``with`` statement's normal exit in ``code``, up to the ``__exit__`` call (included).

    CPython lands nothing there (see ``reliability.fuzz.with_exits``): the first boundary
    after them, once ``__exit__`` returned, is the target. A tracer that raised there would
    skip ``__exit__`` and leave a lock held, which no asynchronous exception does.
    """
    found = _EXIT_CALLS.get(code)
    if found is None:
        ops = list(dis.get_instructions(code))
        starts = with_exits(code)
        offsets = set()
        for i, op in enumerate(ops):
            if op.offset in starts:
                offsets.update(o.offset for o in ops[i : i + 5])  # 3 x LOAD_CONST None, PRECALL, CALL
                if i and ops[i - 1].opname == "SWAP":  # a return inside the with
                    offsets.add(ops[i - 1].offset)
        found = _EXIT_CALLS[code] = frozenset(offsets)
    return found


_EXIT_CALLS: dict[CodeType, frozenset[int]] = {}

CALLS = frozenset({"CALL", "CALL_FUNCTION_EX"})


def breaker_checks(code: CodeType) -> frozenset[int]:
    """The offsets in ``code`` where CPython 3.11 lands an asynchronous exception: after a call, at a backward jump.

    CPython looks for pending signals and asynchronous exceptions only at its eval
    breaker: on a function's entry (the gate's ``call`` boundary), once a call returned
    (so before the instruction after a ``CALL``) and at a ``JUMP_BACKWARD``. A tracer that
    raised anywhere else (between a ``PRECALL`` and its ``CALL``, say) would put the
    interpreter in a state no real landing reaches: it crashed CPython here (a
    segmentation fault in ``threading.Condition.__enter__``, 1 run in 4).
    """
    found = _BREAKER.get(code)
    if found is None:
        ops = [op for op in dis.get_instructions(code) if op.opname != "CACHE"]
        after_call = {b.offset for a, b in itertools.pairwise(ops) if a.opname in CALLS}
        found = _BREAKER[code] = frozenset(after_call | {op.offset for op in ops if op.opname == "JUMP_BACKWARD"})
    return found


_BREAKER: dict[CodeType, frozenset[int]] = {}


class Gate:
    """Counts the main thread's bytecode boundaries from ``fail``'s entry to its first wait slice; lands at ``at``."""

    def __init__(self, session: Session, at: int | None) -> None:
        self.session, self.at = session, at
        self.events: list[str] = []
        self.open = False  # inside the stretch: fail entered, no wait slice yet
        self.where = ""

    def _global(self, frame: FrameType, event: str, arg: object) -> Any:
        code = frame.f_code
        if not self.open:
            if code is FAIL and frame.f_locals.get("self") is self.session and not self.events:
                self.open = True
                frame.f_trace_opcodes = True
                return self._local
            return None
        if code.co_name == "_serve" and code.co_filename.endswith("teardown.py"):
            self.open = False  # the first wait slice: from here on, what lands is recorded
            return None
        self._boundary(frame, "call")
        frame.f_trace_opcodes = True
        return self._local

    def _local(self, frame: FrameType, event: str, arg: object) -> Any:
        if not self.open or threading.current_thread() is not MAIN:
            return None
        code, at = frame.f_code, frame.f_lasti
        if (
            event == "opcode"
            and at in breaker_checks(code)
            and not (code is FAIL and at in _INERT_OFFSETS)
            and at not in with_exit_calls(code)
        ):
            self._boundary(frame, f"@{at}")
        return self._local

    def _boundary(self, frame: FrameType, what: str) -> None:
        index = len(self.events)
        self.events.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}{what}")
        if index == self.at:
            self.open = False
            self.where = self.events[-1]
            raise KeyboardInterrupt(f"landed at {self.where}")

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """Trace the main thread inside the block."""
        sys.settrace(self._global)
        try:
            yield
        finally:
            sys.settrace(None)


@dataclass
class Result:
    """One run: where it landed, the session's end, what reached the caller."""

    where: str
    state: State
    held: tuple[str, ...]
    raised: BaseException | None
    error: BaseException
    handlers_restored: bool

    def problems(self) -> list[str]:
        """What is wrong with this run (empty: nothing)."""
        found = []
        if self.state is not State.FAILED:
            found.append(f"left {self.state}")
        if self.held:
            found.append(f"still holds {', '.join(self.held)}")
        if not isinstance(self.raised, KeyboardInterrupt):
            found.append(f"the caller got {self.raised!r}, not the landed KeyboardInterrupt")
        elif self.raised.__cause__ is not self.error:
            found.append(f"the landed exception is not raised from the failure: {self.raised.__cause__!r}")
        if not self.handlers_restored:
            found.append("SIGINT/SIGTERM handlers not as before the session")
        return found


def run(at: int | None) -> tuple[Gate, Result]:
    """A session driven to ``training`` with every kind of holding, then a bare ``fail``, the gate landing at ``at``."""
    drain_leftovers()
    with kept_handlers():
        before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        actions = RecordingActions()
        session = Session(actions, label="gated")
        session.init_distributed()
        session.init_globals()
        session.start_training()
        session.register("user", lambda: actions.calls.append("release:user"))
        session.track_checkpoints(RecordingCheckpoints(calls=actions.calls))
        error = RuntimeError("injected")
        gate = Gate(session, at)
        raised: BaseException | None = None
        try:
            with gate.armed():
                session.fail(error)
        except BaseException as exc:  # noqa: BLE001 - what reached the caller is the result
            raised = exc
        state = session.state
        held = tuple(str(entry) for entry in session.ledger.held())
        if not state.is_final:  # the old fail: clean up for the next run (a worker may be at it already)
            with contextlib.suppress(BaseException):
                session.fail(error)
        restored = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} == before
    return gate, Result(gate.where, state, held, raised, error, restored)


@pytest.fixture
def pool() -> Iterator[None]:
    """The fuzzers' process-wide pool kind is declared: the session holds one more kind of thing."""
    with declare_pool():
        yield None


@pytest.mark.timeout(120)
def test_an_interrupt_at_any_bytecode_before_the_wait_still_ends_a_bare_fail_final(pool: None) -> None:
    """Each bytecode boundary from fail's first instruction to its wait: failed, nothing held, the interrupt raised."""
    clean, result = run(None)
    assert result.problems() == ["the caller got None, not the landed KeyboardInterrupt"], result
    boundaries = len(clean.events)
    assert boundaries > 40, clean.events  # the shield's install, the job, the hand-over: dozens of calls
    failures = []
    for at in range(boundaries):
        gate, result = run(at)
        if not gate.where:
            failures.append(f"{at}: never landed ({len(gate.events)} boundaries)")
        elif problems := result.problems():
            failures.append(f"{at} at {gate.where}: {problems}")
    assert not failures, f"{len(failures)} of {boundaries} landings:\n" + "\n".join(failures[:25])
