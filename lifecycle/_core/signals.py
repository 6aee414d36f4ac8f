"""Signal handlers that chain to the ones they replaced: installed, made transparent, put back.

Every handler lifecycle installs is a ``Link``. While it is active it runs lifecycle's
behaviour (the interrupt shield's, a session's requested exit); once deactivated (its
session is final, its handlers were restored) it passes every signal to the handler it
replaced, for as long as anything can call it: code that saved it and installs it again
later, an overlapping session whose restore puts it back. Deactivating is one attribute
store and can never be undone, so a signal landing at any bytecode finds either
lifecycle's behaviour or the handler before it.

Uninstalling puts the previous handler back where the link is the one that runs (it is
current, or only inactive links are above it), skipping inactive links below it (they
would only pass the signal on); where another handler was installed above it since, that
one is left as it is, and the link stays in the chain, transparent. Nothing here falls
back to ``SIG_DFL`` for a handler it knew: the only one it cannot put back is a handler
installed from C (``signal.getsignal`` returns None), for which the default is the
closest Python can do.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from lifecycle._core.errors import LifecycleError

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None
"""What ``signal.getsignal`` returns: a callable, ``SIG_DFL`` / ``SIG_IGN``, or None (installed from C)."""

Target = Callable[[int, FrameType | None, Handler], object]
"""What an active link runs: ``(signum, frame, previous)``, ``previous`` being the handler the link replaced."""


class Link:
    """One lifecycle handler for one signal: its ``target`` while active, then the handler it replaced, forever.

    ``previous`` is the handler that was current when it was installed (inactive links
    skipped); it is never forgotten. Callable as a signal handler.
    """

    __slots__ = ("__weakref__", "_target", "previous", "signum")

    def __init__(self, signum: int, target: Target) -> None:
        """Active, not installed yet; ``previous`` is the handler current now until ``install`` reads it again."""
        self.signum = signum
        self._target: Target | None = target
        self.previous: Handler = resolve(signal.getsignal(signum))

    @property
    def active(self) -> bool:
        """True until ``deactivate``: signals run ``target``; afterwards they go to ``previous``."""
        return self._target is not None

    @property
    def target(self) -> Target | None:
        """What the link runs while active; None once inactive (it is dropped, with what it refers to)."""
        return self._target

    def deactivate(self) -> None:
        """From now on pass every signal to ``previous``. Irreversible, idempotent, any thread."""
        self._target = None

    def install(self) -> None:
        """Make this the handler of ``signum``, replacing (and remembering) the current one.

        Raises what ``signal.signal`` raises (off the main thread, a forbidden signal):
        then nothing is installed.
        """
        self.previous = resolve(signal.getsignal(self.signum))
        # Read before, for a signal landing right after the swap; read again, in case a
        # handler that ran in between installed another one.
        self.previous = resolve(signal.signal(self.signum, self))

    def uninstall(self) -> bool:
        """Deactivate; if this link is the one that runs, put ``previous`` back. True if it is no longer installed.

        False where a handler installed since is above it (left as it is), or where the
        handler cannot be set (off the main thread): the link stays installed, passing
        every signal on. Idempotent: call it again once it may be current.
        """
        self.deactivate()
        try:
            if not _runs(self, signal.getsignal(self.signum)):
                return False
            previous = resolve(self.previous)
            signal.signal(self.signum, signal.SIG_DFL if previous is None else previous)
        except (ValueError, OSError):
            return False
        return True

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        """Run ``target`` while active, else deliver to ``previous``."""
        target = self._target
        if target is None:
            deliver(signum, frame, self.previous)
        else:
            target(signum, frame, self.previous)

    def __repr__(self) -> str:
        state = "active" if self.active else "inactive"
        # One level only: a chain of links can be longer than the recursion limit.
        previous = "a link" if isinstance(self.previous, Link) else repr(self.previous)
        return f"<lifecycle signal link for {signal.Signals(self.signum).name}, {state}, after {previous}>"


def resolve(handler: Handler) -> Handler:
    """The handler a signal reaching ``handler`` ends up at: inactive links skipped (a loop, never recursion)."""
    while isinstance(handler, Link) and not handler.active:
        handler = handler.previous
    return handler


def _runs(link: Link, current: Handler) -> bool:
    """True if a signal reaching ``current`` reaches ``link`` first: it is ``current`` or below inactive links only."""
    handler = current
    while isinstance(handler, Link):
        if handler is link:
            return True
        if handler.active:
            return False
        handler = handler.previous
    return False


def deliver(signum: int, frame: FrameType | None, handler: Handler) -> None:
    """Do what ``handler`` (a handler ``signal.getsignal`` returned) does for ``signum``, inactive links skipped.

    A callable is called. ``SIG_IGN``: nothing. The default (or None, a handler installed
    from C): ``KeyboardInterrupt`` for SIGINT, else the default action (the default
    handler is installed and the signal sent again, so the process ends as it would
    have).
    """
    handler = resolve(handler)
    if handler is None:  # installed from C: the default is the closest we can do
        handler = signal.SIG_DFL
    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_IGN:
        return
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


class InstalledHandlers:
    """Handlers installed for some signals, chained to the ones they replaced (see the module docstring)."""

    def __init__(self, signums: tuple[int, ...], handler: Callable[[int, FrameType | None], None]) -> None:
        """Install ``handler`` for each of ``signums``; raise ``LifecycleError`` off the main thread.

        If installing one raises, the ones already installed are restored first.
        """
        if threading.current_thread() is not threading.main_thread():
            raise LifecycleError("signal handlers can only be installed from the main thread")
        self.handler = handler
        """What each signal runs until ``restore``."""
        self._links: list[Link] = []
        self.install(signums)

    def install(self, signums: tuple[int, ...]) -> None:
        """Install ``handler`` for each of ``signums`` too (main thread only).

        Each is known to ``restore`` before it is installed, so a ``restore`` after an
        exception anywhere in here puts back whatever was installed. If installing one
        raises, the ones already installed are restored first.
        """
        try:
            for signum in signums:
                link = Link(signum, self._handle)
                self._links.append(link)
                link.install()
        except BaseException:
            self.restore()
            raise

    def restore(self) -> None:
        """From now on every signal goes to the handler each one replaced; put those back where ours run. Idempotent.

        Deactivating comes first, for every signal, and is never undone: a signal landing
        at any point of this call, or at any later time, goes to the handler from before
        (not to ``handler``, whose session may be gone), even where another handler was
        installed above ours since and so ours cannot be uninstalled yet (it is left in
        the chain, transparent; call ``restore`` again to take it out once it is current).
        Off the main thread it deactivates them, then raises ``LifecycleError``: only the
        main thread can put handlers back (call it again there).
        """
        for link in self._links:
            link.deactivate()
        if threading.current_thread() is not threading.main_thread():
            raise LifecycleError("signal handlers can only be put back from the main thread (they pass signals on)")
        for link in reversed(self._links):
            link.uninstall()

    def _handle(self, signum: int, frame: FrameType | None, previous: Handler) -> None:
        self.handler(signum, frame)
