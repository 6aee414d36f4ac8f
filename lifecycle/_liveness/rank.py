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

A thread of the rank waits on the monitor (``RankMonitor.watch``: blocked in
``waitpid``, no cost to training). A monitor that exits while the rank is not done is
*lost*: said in the log and the journal (a ``monitor_lost`` record) and started again,
once, on the same page; lost again (or not started), a ``kill`` monitor's rank is failed
through ``RankMonitor.on_lost``, a ``report`` one's goes on without.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import logging
import mmap
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from lifecycle import journal as _journal
from lifecycle._liveness import judgement
from lifecycle._liveness import monitor as _monitor
from lifecycle._liveness import page as _page
from lifecycle._liveness import parking as _parking
from lifecycle._liveness.deadlines import LOOP_PHASES
from lifecycle._liveness.settings import Settings

STOP_WAIT_S = 1.0
"""How long a stopped monitor has to exit, at interpreter exit, before it is killed (``reap``)."""

_PHASE_BYTES = 40
_SLOT_HEAD = struct.Struct("<QQQQQ")
"""The part of ``page.SLOT_FORMAT`` a collective rewrites: version, entered, left, fingerprint, code."""
_VERSION = struct.Struct("<Q")

logger = logging.getLogger("lifecycle.liveness")


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
        self._versions: list[int] = []  # per collective slot, its version (even: written)
        self._sites = 0  # call sites written
        self._loop: tuple[int, int, int] = (-1, -1, 0)  # the attempt and step of the loop's last mark, its steps
        self.attempt = 0
        self.on_mark: Callable[[], object] | None = None
        """Run after each ``mark`` (the collective positions' cross-check); must never raise."""
        self._write(0, _page.NO_STEP, b"")

    def mark(self, phase: str, step: int | None) -> None:
        """Record that the rank is at ``step`` (None: none yet) in ``phase``; then run ``on_mark`` if set.

        A step of the training loop (``deadlines.LOOP_PHASES``) not marked before counts one
        more of the attempt's loop steps (``Position.steps``)."""
        try:
            encoded = phase.encode()[:_PHASE_BYTES]
            with self._lock:
                attempt, last, steps = self._loop
                if step is not None and phase in LOOP_PHASES and (attempt, last) != (self.attempt, step):
                    self._loop = self.attempt, step, steps + 1 if attempt == self.attempt else 1
                self._write(0, _page.NO_STEP if step is None else step, encoded)
        except (ValueError, struct.error):  # a closed page, a step out of range: never raise into training
            pass
        if self.on_mark is not None:
            self.on_mark()

    def slot(self, key: str, label: str, entered: int) -> int:
        """Take the next free collective slot for the group ``key`` (``label``: in words), at sequence number
        ``entered`` (nothing inside); its index, or -1 when every slot is taken or the page is closed."""
        with self._lock:
            index = len(self._versions)
            if index >= _page.SLOTS:
                return -1
            self._versions.append(0)
            try:
                at = _page.POSITIONS_AT + index * _page.SLOT_SIZE
                struct.pack_into("<Q", self._page, at, 1)
                struct.pack_into(
                    _page.SLOT_FORMAT, self._page, at, 1, entered, entered, 0, 0, key.encode()[:24], label.encode()[:24]
                )
                struct.pack_into("<Q", self._page, at, 2)
                self._versions[index] = 2
            except ValueError:
                return -1
            return index

    def site(self, text: str) -> int:
        """Write the call site ``text`` (``path:line in function``) into the page's next free site entry, the text
        first and its length last; its number for a slot's code (1 to ``page.SITES``), or 0 once all are taken or
        the page is closed (the collective is then shown without a site)."""
        with self._lock:
            number = self._sites + 1
            if number > _page.SITES:
                return 0
            data = text.encode()[: _page.SITE_BYTES - 2]
            at = _page.SITES_AT + (number - 1) * _page.SITE_BYTES
            try:
                self._page[at + 2 : at + 2 + len(data)] = data
                struct.pack_into("<H", self._page, at, len(data))
            except ValueError:
                return 0
            self._sites = number
            return number

    def collective(self, slot: int, entered: int, left: int, fingerprint: int, code: int) -> None:
        """Write the collective position of ``slot`` (``Marks.slot``): sequence numbers ``entered`` and ``left``,
        the last collective's ``fingerprint`` and ``code`` (with flags and its call site's number); never raises.

        One write with the version odd, one that makes it even: a reader that sees the
        version change meanwhile reads again. No lock (a collective pays for every
        nanosecond): each write is one C call under the GIL, and the last write of any
        writer leaves the version even, so the page never stays odd; two threads writing
        one group's slot at once (never seen: a group's collectives come from one thread)
        could leave the reader a mix of their two positions.
        """
        versions = self._versions
        try:
            version = versions[slot]
            versions[slot] = version + 2
            at = _page.POSITIONS_AT + slot * _page.SLOT_SIZE
            _SLOT_HEAD.pack_into(self._page, at, version + 1, entered, left, fingerprint, code)
            _VERSION.pack_into(self._page, at, version + 2)
        except (ValueError, IndexError, struct.error):
            pass

    def done(self) -> None:
        """Tell the monitor the rank no longer trains (finished, or failing on its own): it stops judging."""
        try:
            with self._lock:
                count, _, attempt, step, steps, phase = struct.unpack_from(_page.MARKS_FORMAT, self._page, 0)
                struct.pack_into(_page.MARKS_FORMAT, self._page, 0, count + 2, 1, attempt, step, steps, phase)
        except ValueError:
            pass

    def _write(self, done: int, step: int, phase: bytes) -> None:
        count = self._count
        page = self._page
        struct.pack_into("<Q", page, 0, count + 1)  # odd: being written
        steps = self._loop[2] if self._loop[0] == self.attempt else 0
        struct.pack_into(_page.MARKS_FORMAT, page, 0, count + 1, done, self.attempt, step, steps, phase)
        self._count = count + 2
        struct.pack_into("<Q", page, 0, count + 2)

    @property
    def is_done(self) -> bool:
        """Whether ``done`` was called (or the page is closed)."""
        try:
            return _page.read_marks(self._page).done
        except ValueError:
            return True

    def position(self) -> _page.Position | None:
        """The position last marked (None once the page is closed)."""
        try:
            return _page.read_marks(self._page)
        except ValueError:
            return None

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
        self.held = False
        """Whether ``stop`` set ``settings.lost_signal`` to be ignored, until the monitor has exited (``release``)."""
        self.on_lost: Callable[[str], bool] | None = None
        """Called on the watching thread when the monitor is lost for good in ``kill`` mode, with why: True if it
        fails the rank (``pretrain``'s raises ``MonitorLost`` into the training thread), False if it cannot."""
        self.losses = 0
        """How many times the monitor was lost (the first is started again, not the second)."""
        self.thread = threading.get_ident()
        """The thread that started ``process``: the monitor dies with it (``PR_SET_PDEATHSIG``)."""
        self.parked = False
        """Whether the monitor was asked to wait for this process's next attempt (``park``)."""
        self._lock = threading.Lock()
        self._stopping = False

    def watch(self) -> None:
        """Wait for the monitor to exit, on a thread of its own (``start_monitor`` starts it); handle a loss.

        A monitor is lost when it exits while the rank is not done and ``stop`` was not
        called: the first loss is logged, journaled and the monitor started again (on this
        thread, which then waits for it: a monitor dies with the thread that started it,
        ``PR_SET_PDEATHSIG``); the second (or a start that fails) ends the watch: in ``kill``
        mode ``on_lost`` fails the rank, else it trains on without a monitor. Returns when
        the monitor exits after ``stop``, or once the rank is done.
        """
        process = self.process
        while True:
            process.wait()
            _close_pipes(process)
            with self._lock:
                if self._stopping or self.marks.is_done:
                    return
                position = self.marks.position()
                self.losses += 1
                how = _how(process.returncode)
                replacement: subprocess.Popen[bytes] | None = None
                failed = ""
                if self.losses == 1:
                    try:
                        replacement = _spawn(self.settings, self.marks)
                        self.process, self.thread, self.parked = replacement, threading.get_ident(), False
                    except OSError as exc:
                        failed = f"; starting another failed: {exc}"
            where = position.where() if position is not None else "its last position"
            said = f"rank {self.settings.rank}'s liveness monitor (pid {process.pid}) {how} at {where}{failed}"
            if replacement is not None:
                self._lost(process, how, "restarted", position, f"{said}; started again (pid {replacement.pid})")
                process = replacement
                continue
            why = f"{said} (lost {self.losses} times)"
            fails = self.settings.mode == "kill" and self.on_lost is not None
            action = "failed" if fails else "without"
            if fails:
                note = f"{why}; the rank fails rather than train on unsupervised"
            elif self.settings.mode == "kill":
                note = f"{why}; no handler can fail the rank off the main thread: it trains on without one"
            else:
                note = f"{why}; it trains on without one (report mode)"
            self._lost(process, how, action, position, note)
            if fails and self.on_lost is not None:
                self.on_lost(why)
            return

    def _lost(
        self,
        process: subprocess.Popen[bytes],
        how: str,
        action: str,
        position: _page.Position | None,
        note: str,
    ) -> None:
        """Say a loss in the log and the rank's journal (a ``monitor_lost`` record; never raises)."""
        logger.warning("lifecycle liveness: %s", note)
        if not self.settings.journal:
            return
        replacement = self.process if action == "restarted" else None
        record = _journal.MonitorLost(
            origin=_journal.Origin(**self.settings.origin),  # type: ignore[arg-type]
            pid=process.pid,
            how=how,
            action=action,
            phase=position.phase if position is not None else "",
            step=position.step if position is not None else None,
            note=note,
            time=time.time(),
            new_pid=replacement.pid if replacement is not None else None,
        )
        _append(self.settings.journal, (json.dumps(record.to_json()) + "\n").encode())

    def park(self) -> None:
        """Have the monitor wait for this process's next attempt once it has seen this one end (``parking.PARK``),
        rather than exit; never raises.

        The next ``start_monitor`` on the thread that started it hands it that attempt's
        settings (``_take_parked``): no new interpreter and imports, about 40 ms of CPU that
        a retry's set-up otherwise shares the node with (docs/recovery.md, "Measured
        here"). ``pretrain`` parks its monitor on the failure edge, before it marks the rank
        done; one no attempt takes ends at interpreter exit (``reap``), or with the rank.
        """
        with self._lock:
            stdin = self.process.stdin
            if self._stopping or self.parked or stdin is None or self.process.poll() is not None:
                return
            try:
                stdin.write(_parking.PARK)
                stdin.flush()
            except (OSError, ValueError):  # it exited meanwhile: the watch sees it
                return
            self.parked = True

    def stop(self) -> None:
        """Tell the monitor the rank is done and to end (SIGTERM); idempotent. Returns at once.

        The monitor beats once more (saying the rank is done) and exits on its own; it is
        reaped by the next ``start_monitor`` or at interpreter exit, killed if it has not
        exited within ``STOP_WAIT_S`` then. Waiting for it here cost every ``pretrain``
        call 10-30 ms. Until it has exited, no signal it may still send kills the rank:
        ``settings.lost_signal``, once its handler is put back (``on_stop``), is ignored
        where its default (terminate) would be in place, and the dump signal stays
        registered with ``faulthandler`` (``release`` undoes both).
        """
        global _CURRENT
        if _CURRENT is self:
            _CURRENT = None
        with self._lock:  # the watching thread reads the page under it: never closed under its feet
            if self._stopping:
                return
            self._stopping = True
        self.marks.done()
        while self.on_stop:
            self.on_stop.pop()()
        self._hold()
        self.marks.close()
        if self.process.poll() is None:
            self.process.terminate()
            _EXITING.append(self)
        else:
            self.release()

    def _hold(self) -> None:
        """Ignore ``settings.lost_signal`` where nothing handles it now (its default kills), until ``release``."""
        signum = self.settings.lost_signal
        if not signum:
            return
        try:
            if signal.getsignal(signum) == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_IGN)
                self.held = True
        except (ValueError, OSError):  # off the main thread: the monitor was told of no handler (lost_signal 0)
            pass

    def release(self) -> None:
        """Once the monitor has exited: unregister its dump signal (unless a newer monitor's is registered), close
        the stacks file, and give ``settings.lost_signal`` its default back where ``stop`` ignored it (main thread
        only: elsewhere it stays ignored, which is harmless)."""
        global _REGISTERED
        if _REGISTERED is self:
            faulthandler.unregister(self.settings.dump_signal)
            _REGISTERED = None
        self.stacks.close()
        if self.held:
            self.held = False
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(self.settings.lost_signal) == signal.SIG_IGN:
                    signal.signal(self.settings.lost_signal, signal.SIG_DFL)


_CURRENT: RankMonitor | None = None

_REGISTERED: RankMonitor | None = None
"""The monitor whose stacks file ``faulthandler`` writes the dump signal's stacks into."""

_EXITING: list[RankMonitor] = []
"""Monitors told to stop that had not exited yet (``release`` not called)."""


@atexit.register
def reap(wait_s: float = STOP_WAIT_S) -> None:
    """Reap the monitors told to stop: each gets what is left of ``wait_s`` to exit, then is killed; then released."""
    for monitor in _EXITING:  # a parked one exits at the end of its stdin; the others do not read it
        _close_pipes(monitor.process, stdout=False)
    deadline = time.monotonic() + wait_s
    while _EXITING:
        monitor = _EXITING.pop()
        try:
            monitor.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            monitor.process.kill()
            monitor.process.wait()
        monitor.release()


def settle() -> None:
    """Stop the monitor still running here, if any, and release the stopped ones that have exited since."""
    if _CURRENT is not None:
        _CURRENT.stop()
    for monitor in [m for m in _EXITING if m.process.poll() is not None]:
        _EXITING.remove(monitor)
        monitor.release()


def current() -> RankMonitor | None:
    """The monitor running for this process, if any."""
    return _CURRENT


def start_monitor(settings: Settings) -> RankMonitor:
    """Start this rank's monitor with ``settings`` (see the module docstring), after stopping one still running here.

    The settings go to the monitor whole; this adds the marks page (their ``attempt``
    written in it), opens ``settings.stacks`` (appended to) and registers
    ``settings.dump_signal`` with ``faulthandler`` to dump every thread's stack there.
    """
    global _CURRENT, _REGISTERED
    settle()
    marks = Marks()
    marks.attempt = settings.attempt
    Path(settings.stacks).parent.mkdir(parents=True, exist_ok=True)
    dump = open(settings.stacks, "a")  # noqa: SIM115 - kept open for faulthandler until release()
    faulthandler.register(settings.dump_signal, file=dump, all_threads=True, chain=False)
    process = _take_parked(settings, marks) or _spawn(settings, marks)
    _CURRENT = _REGISTERED = RankMonitor(marks, process, dump, settings)
    threading.Thread(target=_CURRENT.watch, name=f"lifecycle monitor watch (rank {settings.rank})", daemon=True).start()
    return _CURRENT


def _spawn(settings: Settings, marks: Marks) -> subprocess.Popen[bytes]:
    """Start a monitor process with ``settings`` on ``marks`` (its descriptor passed as ``/proc/self/fd/<n>``); its
    stdin and stdout pipes to this process, for ``park``."""
    command = [sys.executable, "-S", "-E", "-s", _monitor.__file__, settings.to_json(), f"/proc/self/fd/{marks.fd}"]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(marks.fd,))


def _take_parked(settings: Settings, marks: Marks) -> subprocess.Popen[bytes] | None:
    """The monitor an earlier attempt parked (``RankMonitor.park``), told ``settings`` and ``marks``; None if none
    this thread may take (the one that started it: it dies with that thread) or it did not say its watch ended
    within ``STOP_WAIT_S`` (it is then ended, and reaped like a stopped one)."""
    me = threading.get_ident()
    old = next((m for m in reversed(_EXITING) if m.parked and m.thread == me and m.process.poll() is None), None)
    if old is None:
        return None
    process = old.process
    told = (json.dumps([settings.to_json(), marks.path]) + "\n").encode()
    if _ended(process, STOP_WAIT_S) and process.stdin is not None:
        try:
            process.stdin.write(told)
            process.stdin.flush()
        except (OSError, ValueError):  # it exited meanwhile
            pass
        else:
            _EXITING.remove(old)
            old.release()
            return process
    old.parked = False
    _close_pipes(process, stdout=False)  # it exits at the end of its stdin
    return None


def _ended(process: subprocess.Popen[bytes], wait_s: float) -> bool:
    """Whether a parked monitor says (``parking.ENDED``) within ``wait_s`` that it saw its attempt end."""
    if process.stdout is None:
        return False
    deadline, said = time.monotonic() + wait_s, b""
    with contextlib.suppress(OSError, ValueError):
        while not said.endswith(_parking.ENDED):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([process.stdout], [], [], left)[0]:
                return False
            chunk = os.read(process.stdout.fileno(), 64)
            if not chunk:
                return False
            said += chunk
        return True
    return False


def _close_pipes(process: subprocess.Popen[bytes], stdout: bool = True) -> None:
    """Close this process's ends of the monitor's stdin (and stdout) pipes; never raises."""
    for pipe in (process.stdin, process.stdout if stdout else None):
        if pipe is not None:
            with contextlib.suppress(OSError, ValueError):
                pipe.close()


def _how(returncode: int) -> str:
    """How a process ended, in words: ``killed by SIGKILL``, ``exited with code 1``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def _append(path: str, data: bytes) -> None:
    """Append ``data`` (one journal line) to ``path`` in one ``write`` on a file opened for appending; never raises.

    ``judgement.append_line``, which the monitor's records use too: they never interleave.
    """
    try:
        judgement.append_line(path, data)
    except OSError as exc:
        logger.warning("lifecycle liveness: could not write to the journal %s: %s", path, exc)
