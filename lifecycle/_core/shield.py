"""The interrupt shield: SIGINT and SIGTERM wait while lifecycle tears down, and a second one cuts it short.

A session installs a ``Shield`` at its first trigger (main thread only) and removes it
once final. While no protected region is open (user code runs) a signal goes at once to
the handler that was there before (Ctrl-C raises ``KeyboardInterrupt``; SIGTERM does
what it did before: the default terminates, a ``pretrain`` run turns it into a requested
exit). While lifecycle's own teardown runs (``protected()``), the first signal is kept
and delivered to that previous handler once the shield is removed; a second one during
the same teardown escalates: ``TeardownInterrupted`` is raised at once, the executor
abandons the remaining steps, and the session still ends final.

No shield is possible off the main thread (Python runs signal handlers there only) or
against asynchronous exceptions (``PyThreadState_SetAsyncExc``, a wrapper's restart
request): there the session still ends final, its report and journal written in a
``finally``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from lifecycle._core.signals import Handler

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
    """SIGINT/SIGTERM handlers that defer while a protected region is open (see the module docstring)."""

    def __init__(self) -> None:
        """Not installed yet."""
        self._previous: dict[int, Handler] = {}
        self._depth = 0
        self._pending: tuple[int, FrameType | None] | None = None
        self._escalated = False

    @property
    def installed(self) -> bool:
        """True between ``install`` and ``remove``."""
        return bool(self._previous)

    @property
    def pending(self) -> int | None:
        """The deferred signal's number, or None."""
        return None if self._pending is None else self._pending[0]

    def install(self) -> bool:
        """Install the handlers; False (and nothing installed) off the main thread or if already installed."""
        if self._previous or threading.current_thread() is not threading.main_thread():
            return False
        try:
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        except (ValueError, OSError):  # an embedding that forbids handlers: run unshielded
            self._restore()
            return False
        return True

    @contextlib.contextmanager
    def protected(self) -> Iterator[None]:
        """A region of lifecycle's own code: signals arriving inside it are deferred (nesting allowed)."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._escalated = False

    def remove(self) -> None:
        """Put back the previous handlers (where ours is still installed), then deliver a deferred signal to them.

        Delivering may raise (``KeyboardInterrupt`` for a deferred Ctrl-C) or end the
        process (a deferred SIGTERM whose previous handler is the default).
        """
        pending, self._pending = self._pending, None
        previous = dict(self._previous)
        self._restore()
        if pending is not None:
            _deliver(pending[0], pending[1], previous.get(pending[0], signal.SIG_DFL))

    def _restore(self) -> None:
        while self._previous:
            signum, previous = self._previous.popitem()
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(signum) == self._handle:
                    signal.signal(signum, signal.SIG_DFL if previous is None else previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._depth == 0:
            _deliver(signum, frame, self._previous.get(signum, signal.SIG_DFL))
        elif self._pending is None:
            self._pending = (signum, frame)
        elif not self._escalated:
            self._escalated = True
            self._pending = None  # the escalation delivers it: never a second time at remove()
            raise TeardownInterrupted(signum)


def _deliver(signum: int, frame: FrameType | None, previous: Handler) -> None:
    """Do what ``previous`` (a handler ``signal.signal`` returned) does for ``signum``."""
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:  # the default action: put it back and let the signal do it
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
