"""The signal chain: a handler lifecycle installs delegates to the one it replaced for as long as it can be called.

Each test installs a process-level handler of its own first (a scheduler's preemption
handler for SIGTERM; Python's ``default_int_handler`` for SIGINT), runs sessions that
overlap or are wrapped in code that saves and restores handlers, then sends the real
signal to this process: the handler from before must run, once.
"""

from __future__ import annotations

import gc
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle import LifecycleError, Session, State
from lifecycle._core.signals import Handler, InstalledHandlers
from lifecycle.testing import RecordingActions

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def process_handlers() -> Iterator[None]:
    """Every test starts with Python's own handlers and leaves them as it found them, whatever happened."""
    before = {s: signal.getsignal(s) for s in SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


class Preemption:
    """A scheduler's preemption handler: counts the SIGTERMs it receives."""

    def __init__(self) -> None:
        self.received = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1


@pytest.fixture
def preemption() -> Preemption:
    """A preemption handler installed for SIGTERM before anything else (the fixture above puts back the old one)."""
    handler = Preemption()
    signal.signal(signal.SIGTERM, handler)
    return handler


def start(handlers: bool = True) -> Session:
    """A session in ``training`` on the recording double, with its SIGTERM handler installed if ``handlers``."""
    session = Session(RecordingActions())
    session.init_distributed()
    if handlers:
        session.install_signal_handlers()
    session.init_globals()
    session.start_training()
    return session


def close(session: Session) -> None:
    """``training`` → ``closed``."""
    session.finish()
    session.close()
    assert session.state is State.CLOSED


def sigterm_reaches(preemption: Preemption) -> bool:
    """Send SIGTERM to this process; True if the preemption handler ran exactly once for it."""
    before = preemption.received
    signal.raise_signal(signal.SIGTERM)
    return preemption.received == before + 1


def ctrl_c_raises() -> bool:
    """Send SIGINT to this process; True if it raised ``KeyboardInterrupt`` here."""
    try:
        signal.raise_signal(signal.SIGINT)
    except KeyboardInterrupt:
        return True
    return False


@pytest.mark.parametrize("first_closed", ["outer", "inner"])
@pytest.mark.parametrize("handlers", [True, False], ids=["install_signal_handlers", "shield_only"])
def test_a_preemption_handler_survives_two_overlapping_sessions(
    preemption: Preemption, first_closed: str, handlers: bool
) -> None:
    """A starts, B starts, either closes first: then SIGTERM reaches the handler from before, and Ctrl-C raises."""
    outer = start(handlers)
    inner = start(handlers)
    for session in (outer, inner) if first_closed == "outer" else (inner, outer):
        close(session)
    assert sigterm_reaches(preemption)
    assert ctrl_c_raises()
    assert signal.getsignal(signal.SIGTERM) is preemption
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert outer.exit_requested is None and inner.exit_requested is None  # neither swallowed it


def test_a_sigterm_while_both_overlapping_sessions_live_is_a_requested_exit_of_the_inner() -> None:
    """While both live, SIGTERM is the inner session's requested exit; after the inner closes, the outer's."""
    outer = start()
    inner = start()
    signal.raise_signal(signal.SIGTERM)
    assert inner.exit_requested == "SIGTERM" and outer.exit_requested is None
    close(inner)
    signal.raise_signal(signal.SIGTERM)
    assert outer.exit_requested == "SIGTERM"
    close(outer)


def test_a_session_wrapped_in_code_that_saves_and_restores_the_handler(preemption: Preemption) -> None:
    """Code saves the handler around a session: afterwards SIGTERM reaches the preemption handler, Ctrl-C raises."""
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        close(start())
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    assert sigterm_reaches(preemption)
    assert ctrl_c_raises()


def test_handlers_saved_inside_a_session_and_restored_after_it_delegate_to_the_ones_before(
    preemption: Preemption,
) -> None:
    """The session's own handlers, put back by other code after it closed, pass SIGTERM and Ctrl-C on.

    The worst order: code saves the session's handlers and installs its own above them,
    the session closes (its handlers are not the current ones, so it cannot restore),
    then the code restores what it saved: the closed session's handlers are installed
    again. A SIGTERM must not be swallowed by the closed session (a requested exit no
    loop reads), nor kill the process: it reaches the preemption handler.
    """
    session = start()
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        for signum in SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        close(session)
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    assert sigterm_reaches(preemption)
    assert ctrl_c_raises()
    assert session.exit_requested is None


def test_the_shield_of_a_session_garbage_collected_before_it_was_final_passes_signals_on(
    preemption: Preemption,
) -> None:
    """A session dropped while live leaves its shield installed; it delivers to the handlers from before."""
    start(handlers=False)  # dropped at once, never final
    gc.collect()
    assert sigterm_reaches(preemption)
    assert ctrl_c_raises()


def test_a_handler_installed_above_a_session_is_left_installed(preemption: Preemption) -> None:
    """A handler installed after the session started is left installed when the session ends; SIGTERM reaches it."""
    session = start()
    above = Preemption()
    signal.signal(signal.SIGTERM, above)
    close(session)
    assert signal.getsignal(signal.SIGTERM) is above
    assert sigterm_reaches(above) and preemption.received == 0


def test_a_long_chain_of_ended_handlers_delivers_without_recursion(preemption: Preemption) -> None:
    """3,000 nested handler sets restored outermost first, the innermost put back after: one SIGTERM, one call.

    Each set was installed above the previous one while it was active, so after all are
    restored the innermost sits on a chain of 3,000 inactive handlers: walking it (and
    printing one) must not recurse past Python's recursion limit.
    """
    requests: list[int] = []
    nested = [InstalledHandlers(SIGNALS, lambda signum, frame: requests.append(signum)) for _ in range(3000)]
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    for handlers in nested:
        handlers.restore()
    assert signal.getsignal(signal.SIGTERM) is preemption
    for signum, handler in saved.items():
        signal.signal(signum, handler)
    assert "inactive" in repr(saved[signal.SIGTERM])
    assert sigterm_reaches(preemption)
    assert ctrl_c_raises()
    assert requests == []


def test_installed_handlers_restored_while_another_is_above_keep_delegating_forever(preemption: Preemption) -> None:
    """``InstalledHandlers.restore`` makes its handler pass signals on, even where it cannot uninstall it yet."""
    requests: list[int] = []
    mine = InstalledHandlers((signal.SIGTERM,), lambda signum, frame: requests.append(signum))
    ours = signal.getsignal(signal.SIGTERM)
    above = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    mine.restore()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # not ours to replace
    signal.signal(signal.SIGTERM, above)
    assert signal.getsignal(signal.SIGTERM) is ours
    assert sigterm_reaches(preemption) and requests == []
    mine.restore()  # idempotent: now that ours is current again, the one before goes back
    assert signal.getsignal(signal.SIGTERM) is preemption
    assert sigterm_reaches(preemption) and requests == []


Operation = tuple[str, int]


@st.composite
def interleavings(draw: st.DrawFn) -> list[Operation]:
    """Start up to 4 sessions and close them in any order, with other code's save/restore pairs anywhere between."""
    count = draw(st.integers(min_value=1, max_value=4))
    closes = draw(st.permutations(range(count)))
    ops: list[Operation] = []
    pending = list(closes)
    for index in range(count):
        ops.append(("start", index))
        started = set(range(index + 1))
        while pending and pending[0] in started and draw(st.booleans()):
            ops.append(("close", pending.pop(0)))
    ops += [("close", index) for index in pending]
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        at = draw(st.integers(0, len(ops)))
        until = draw(st.integers(at, len(ops)))
        ops.insert(until, ("restore", 0))
        ops.insert(at, ("save", 0))
    return ops


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(interleavings())
def test_any_interleaving_of_sessions_and_saved_handlers_keeps_the_preemption_handler(ops: list[Operation]) -> None:
    """Whatever the order of starts, closes and other code's save/restore: once all are done, one SIGTERM, one call."""
    preemption = Preemption()
    signal.signal(signal.SIGTERM, preemption)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sessions: dict[int, Session] = {}
    saved: list[dict[int, Handler]] = []  # other code saves and restores in nested blocks
    for op, index in ops:
        if op == "start":
            sessions[index] = start()
        elif op == "close":
            close(sessions[index])
        elif op == "save":
            saved.append({s: signal.signal(s, signal.SIG_IGN) for s in SIGNALS})
        else:
            for signum, handler in saved.pop().items():
                signal.signal(signum, handler)
    assert sigterm_reaches(preemption)
    assert ctrl_c_raises()
    assert all(session.exit_requested is None for session in sessions.values())


def test_installed_handlers_restored_off_the_main_thread_pass_signals_on_and_say_so(preemption: Preemption) -> None:
    """``restore`` on another thread deactivates at once and raises; called again on the main thread, it uninstalls."""
    requests: list[int] = []
    mine = InstalledHandlers((signal.SIGTERM,), lambda signum, frame: requests.append(signum))
    raised: list[BaseException] = []

    def restore() -> None:
        try:
            mine.restore()
        except LifecycleError as exc:
            raised.append(exc)

    thread = threading.Thread(target=restore)
    thread.start()
    thread.join(10)
    assert len(raised) == 1 and "main thread" in str(raised[0])
    assert sigterm_reaches(preemption) and requests == []
    mine.restore()
    assert signal.getsignal(signal.SIGTERM) is preemption
