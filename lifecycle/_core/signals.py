"""Installing signal handlers and putting the previous ones back."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from lifecycle._core.errors import LifecycleError

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class InstalledHandlers:
    """Handlers installed for some signals, with the ones they replaced."""

    def __init__(self, signums: tuple[int, ...], handler: Callable[[int, FrameType | None], None]) -> None:
        """Install ``handler`` for each of ``signums``; raise ``LifecycleError`` off the main thread.

        If installing one raises, the ones already installed are put back first.
        """
        if threading.current_thread() is not threading.main_thread():
            raise LifecycleError("signal handlers can only be installed from the main thread")
        self._handler = handler
        self._previous: dict[int, Handler] = {}
        try:
            for signum in signums:
                self._previous[signum] = signal.signal(signum, handler)
        except BaseException:
            self.restore()
            raise

    def restore(self) -> None:
        """Put back the handlers that were in place before, in reverse order. Idempotent.

        A signal whose handler is no longer ours (someone installed another since) is
        left as it is: restoring would overwrite a handler installed later.
        """
        for signum, previous in reversed(self._previous.items()):
            if signal.getsignal(signum) is self._handler:
                signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous = {}
