"""The rank's side of liveness: its progress marks, its monitor process, the stack dump it can ask for.

``start_monitor`` (``pretrain`` calls it once the default group exists) creates the
marks page, registers the stack-dump signal with ``faulthandler``, and starts the
monitor (``lifecycle._liveness.monitor``, standard library only) with ``subprocess``
(no fork of the training process). From then on ``Marks.mark`` writes the position into
the page: a few hundred nanoseconds, no system call, no store call (``pretrain`` makes it
its session's ``progress_sink``, so every ``Session.progress`` marks). ``RankMonitor.stop``
tells the monitor the rank is done and to end, without waiting: the monitor beats once
more and exits by itself; ``reap`` collects it (at the next start, or at interpreter
exit, bounded).
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from lifecycle._liveness import monitor as _monitor
from lifecycle._liveness import page as _page
from lifecycle._liveness.settings import Settings

STOP_WAIT_S = 1.0
"""How long a stopped monitor has to exit, at interpreter exit, before it is killed (``reap``)."""

_PHASE_BYTES = 48


class Marks:
    """This rank's position in a page shared with its monitor; ``mark`` never raises and makes no system call."""

    def __init__(self) -> None:
        """Create the page: a file in memory that no folder names (``memfd_create``), so no death leaves it behind.

        ``fd`` stays open while the marks live: a monitor (the first, or one started again
        after a loss) maps it through ``path`` (``/proc/<pid>/fd/<fd>``, or its own
        ``/proc/self/fd/<fd>`` when the descriptor is passed to it). Where ``memfd_create``
        is missing, a file made in ``/dev/shm`` (or the temp folder) is unlinked at once.
        """
        try:
            fd = os.memfd_create("lifecycle-marks", os.MFD_CLOEXEC)
        except (AttributeError, OSError):
            folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
            fd, name = tempfile.mkstemp(prefix="lifecycle-marks-", dir=folder)
            os.unlink(name)
        try:
            os.ftruncate(fd, _page.PAGE_SIZE)
            self._page = mmap.mmap(fd, _page.PAGE_SIZE)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.path = f"/proc/{os.getpid()}/fd/{fd}"
        self._count = 0
        self._lock = threading.Lock()
        self.attempt = 0
        self._write(0, _page.NO_STEP, b"")

    def mark(self, phase: str, step: int | None) -> None:
        """Record that the rank is at ``step`` (None: none yet) in ``phase``."""
        try:
            encoded = phase.encode()[:_PHASE_BYTES]
            with self._lock:
                self._write(0, _page.NO_STEP if step is None else step, encoded)
        except (ValueError, struct.error):  # a closed page, a step out of range: never raise into training
            pass

    def done(self) -> None:
        """Tell the monitor the rank no longer trains (finished, or failing on its own): it stops judging."""
        try:
            with self._lock:
                count, _, attempt, step, phase = struct.unpack_from(_page.MARKS_FORMAT, self._page, 0)
                struct.pack_into(_page.MARKS_FORMAT, self._page, 0, count + 2, 1, attempt, step, phase)
        except ValueError:
            pass

    def _write(self, done: int, step: int, phase: bytes) -> None:
        count = self._count
        page = self._page
        struct.pack_into("<Q", page, 0, count + 1)  # odd: being written
        struct.pack_into(_page.MARKS_FORMAT, page, 0, count + 1, done, self.attempt, step, phase)
        self._count = count + 2
        struct.pack_into("<Q", page, 0, count + 2)

    @property
    def is_done(self) -> bool:
        """Whether ``done`` was called (or the page is closed)."""
        try:
            return _page.read_marks(self._page).done
        except ValueError:
            return True

    def verdict(self) -> dict[str, object] | None:
        """The first liveness verdict of the attempt, as this rank's monitor copied it here (None: none seen)."""
        try:
            return _page.read_verdict(self._page)
        except ValueError:  # closed
            return None

    def close(self) -> None:
        """Unmap the page and close its file (idempotent): the memory is freed once the monitor has unmapped it too."""
        self._page.close()
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


class RankMonitor:
    """A running monitor of this rank: its marks, its process, the stacks file; ``stop`` ends it."""

    def __init__(self, marks: Marks, process: subprocess.Popen[bytes], stacks: IO[str], settings: Settings) -> None:
        """Hold what ``start_monitor`` made, and the settings it was started with."""
        self.marks, self.process, self.stacks, self.settings = marks, process, stacks, settings
        self.on_stop: list[Callable[[], object]] = []
        """Called by ``stop``, last first, before the page is closed (e.g. to put a signal handler back)."""

    def stop(self) -> None:
        """Tell the monitor the rank is done and to end (SIGTERM); idempotent. Returns at once.

        The monitor beats once more (saying the rank is done) and exits on its own; it is
        reaped by the next ``start_monitor`` or at interpreter exit, killed if it has not
        exited within ``STOP_WAIT_S`` then. Waiting for it here cost every ``pretrain``
        call 10-30 ms.
        """
        global _CURRENT
        if _CURRENT is self:
            _CURRENT = None
        self.marks.done()
        if self.process.poll() is None:
            self.process.terminate()
            _EXITING.append(self.process)
        faulthandler.unregister(self.settings.dump_signal)
        while self.on_stop:
            self.on_stop.pop()()
        self.stacks.close()
        self.marks.close()


_CURRENT: RankMonitor | None = None

_EXITING: list[subprocess.Popen[bytes]] = []
"""Monitors told to stop that had not exited yet."""


@atexit.register
def reap(wait_s: float = STOP_WAIT_S) -> None:
    """Reap the monitors told to stop: each gets what is left of ``wait_s`` to exit, then is killed."""
    deadline = time.monotonic() + wait_s
    while _EXITING:
        process = _EXITING.pop()
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def current() -> RankMonitor | None:
    """The monitor running for this process, if any."""
    return _CURRENT


def start_monitor(settings: Settings) -> RankMonitor:
    """Start this rank's monitor with ``settings`` (see the module docstring), after stopping one still running here.

    The settings go to the monitor whole; this adds the marks page (their ``attempt``
    written in it), opens ``settings.stacks`` (appended to) and registers
    ``settings.dump_signal`` with ``faulthandler`` to dump every thread's stack there.
    """
    global _CURRENT
    if _CURRENT is not None:
        _CURRENT.stop()
    for process in [p for p in _EXITING if p.poll() is not None]:  # the ones exited since: reaped now
        _EXITING.remove(process)
    marks = Marks()
    marks.attempt = settings.attempt
    Path(settings.stacks).parent.mkdir(parents=True, exist_ok=True)
    dump = open(settings.stacks, "a")  # noqa: SIM115 - kept open for faulthandler until stop()
    faulthandler.register(settings.dump_signal, file=dump, all_threads=True, chain=False)
    command = [sys.executable, "-S", "-E", "-s", _monitor.__file__, settings.to_json(), f"/proc/self/fd/{marks.fd}"]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(marks.fd,))
    _CURRENT = RankMonitor(marks, process, dump, settings)
    return _CURRENT
