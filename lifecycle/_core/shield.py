"""The interrupt shield: SIGINT and SIGTERM wait while lifecycle tears down, and a second one cuts it short.

A session installs a ``Shield`` at its first trigger (main thread only) and removes it
once final. While user code runs a signal goes at once to the handler that was there
before (Ctrl-C raises ``KeyboardInterrupt``; SIGTERM does what it did before: the
default terminates, a ``pretrain`` run turns it into a requested exit). While
lifecycle's own teardown runs (``Session.fail`` or ``Session.close`` is on the
interrupted stack), the first signal is kept and delivered to that previous handler once
the shield is removed; a second one during the same teardown escalates: the executor
abandons the steps not yet run (``TeardownInterrupted`` is raised at once inside a step,
so a hung release is left), and the session ends final, then raises it.

No shield is possible off the main thread (Python runs signal handlers there only) or
against asynchronous exceptions (``PyThreadState_SetAsyncExc``, a wrapper's restart
request): there the session still ends final, its report and journal written in a
``finally``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import weakref
from collections.abc import Iterator
from types import CodeType, FrameType

from lifecycle._core.signals import Handler, Link, deliver

SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
"""The signals the shield holds back."""


class TeardownInterrupted(KeyboardInterrupt):
    """A second interrupt arrived while a teardown ran: its remaining steps were abandoned.

    ``signum`` is the signal that escalated. A ``KeyboardInterrupt``, so code that stops
    on Ctrl-C stops on it too.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"{signal.Signals(signum).name} during teardown, after an earlier one: teardown abandoned")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.signum,), self.__dict__)


class Shield:
    """SIGINT/SIGTERM handlers that defer while lifecycle's teardown runs (see the module docstring).

    Where the signal landed decides, not a flag set and cleared around the teardown (a
    signal can land between any two lines): it is deferred if a frame of one of
    ``protected`` (the code objects of ``Session.fail`` and ``Session.close``) is on the
    interrupted stack. An escalation (the second deferred signal) is raised at once only
    inside a teardown step (a frame of one of ``steps`` on the stack), where a hung
    release must be left; in lifecycle's bookkeeping it is recorded (``escalation``), the
    executor abandons the steps not yet run, and the session raises it once final.
    """

    def __init__(self, protected: frozenset[CodeType], steps: frozenset[CodeType], owner: object) -> None:
        """Not installed yet; ``protected`` and ``steps`` are the code objects described above.

        Only frames whose ``self`` is ``owner`` (the session, held weakly) count: another
        session's teardown is not this shield's. Once ``owner`` is gone, or a session
        dropped before it was final left this shield installed, the shield passes every
        signal through. Each ``install`` makes new handlers (``lifecycle._core.signals.Link``);
        ``remove`` deactivates them for good: wherever they are installed later, they pass
        every signal to the handler they replaced.
        """
        self._protected, self._steps = protected, steps
        self._owner = weakref.ref(owner)
        self._links: dict[int, Link] = {}
        self._pending: tuple[int, FrameType | None] | None = None
        self._deferred = 0  # signals deferred since install: the second escalates
        self.escalation: TeardownInterrupted | None = None
        """The escalated interrupt of the current teardown, until ``remove``; None if none."""

    @property
    def owner(self) -> object | None:
        """The session this shield protects; None once it is gone (the shield then passes every signal through)."""
        return self._owner()

    def install(self) -> bool:
        """Install the handlers; False (and nothing installed) off the main thread or if already installed."""
        if self._links or threading.current_thread() is not threading.main_thread():
            return False
        # Known before ours are installed: a signal landing in between finds its link.
        self._links = {signum: Link(signum, self._handle) for signum in SIGNALS}
        try:
            for link in self._links.values():
                link.install()
        except (ValueError, OSError):  # an embedding that forbids handlers: run unshielded
            self._restore()
            self._links = {}
            return False
        return True

    @property
    def installed(self) -> bool:
        """True from ``install`` until a ``remove`` ran to its end (one an exception cut short leaves it True)."""
        return bool(self._links)

    def remove(self, cause: BaseException | None = None) -> TeardownInterrupted | None:
        """Deactivate the handlers and put back the previous ones (where ours run); return the escalation, if any.

        Without an escalation, a deferred signal is then delivered to its previous handler:
        that may raise (``KeyboardInterrupt`` for a deferred Ctrl-C, raised from ``cause``)
        or end the process (a deferred SIGTERM whose previous handler is the default).
        SIGINT and SIGTERM are blocked while the handlers are swapped (where the platform
        allows), so none lands half way; one that arrives meanwhile is delivered right
        after, to the previous handler: the session is final by then. Where another
        handler was installed above ours since, ours stays below it, passing every signal on.

        An exception landing in it before the handlers are back leaves ``installed`` True and
        the state as it was: calling ``remove`` again finishes it and loses nothing.
        """
        try:
            with _blocked(SIGNALS):
                escalation, links, pending = self.escalation, dict(self._links), self._pending
                self._restore()
                self.escalation, self._pending, self._deferred, self._links = None, None, 0, {}
            if escalation is not None or pending is None:
                return escalation
            deliver(pending[0], pending[1], links[pending[0]])  # inactive now: its previous handler
        except KeyboardInterrupt as deferred:  # deferred, or arrived while the handlers were swapped
            if cause is not None and deferred.__cause__ is None:
                raise deferred from cause
            raise
        return None

    def _restore(self) -> None:
        # Deactivate every link before putting any back: from here on a signal reaches its previous handler.
        for link in self._links.values():
            link.deactivate()
        for link in self._links.values():
            link.uninstall()

    def _handle(self, signum: int, frame: FrameType | None, previous: Handler) -> None:
        owner = self._owner()
        if owner is None or not _on_stack(frame, self._protected, owner):
            deliver(signum, frame, previous)
            return
        # Counted in one line, first: a signal whose handler runs nested inside this one (it
        # arrives between two of its lines) counts apart, so two never merge into one.
        self._deferred += 1
        if self._deferred == 1:
            self._pending = (signum, frame)
            return
        if self.escalation is None:
            self.escalation = TeardownInterrupted(signum)
        self._pending = None  # the escalation delivers it: never a second time at remove()
        if _on_stack(frame, self._steps, None):
            raise self.escalation


@contextlib.contextmanager
def _blocked(signums: tuple[signal.Signals, ...]) -> Iterator[None]:
    """Hold ``signums`` back at the OS level for the block (a no-op where ``pthread_sigmask`` is missing).

    An asynchronous exception landing anywhere in here never leaves them blocked: what
    was blocked already is read before anything is blocked, and the block's own signals
    are unblocked in a ``finally`` that is entered before they are blocked.
    """
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None:
        yield
        return
    ours = set(signums) - mask(signal.SIG_BLOCK, ())  # blocked here, not before: what to unblock
    try:
        mask(signal.SIG_BLOCK, ours)
        yield
    finally:
        mask(signal.SIG_UNBLOCK, ours)


def _on_stack(frame: FrameType | None, codes: frozenset[CodeType], owner: object | None) -> bool:
    """True if a frame running one of ``codes`` (with ``self`` being ``owner``, unless None) is on the stack."""
    while frame is not None:
        if frame.f_code in codes and (owner is None or frame.f_locals.get("self") is owner):
            return True
        frame = frame.f_back
    return False
