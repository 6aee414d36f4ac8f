"""Work the calling thread waits for instead of running: what no asynchronous exception can cut short.

Python cannot mask an asynchronous exception (a signal handler's ``KeyboardInterrupt``,
NVRx's ``RankShouldRestart`` raised with ``PyThreadState_SetAsyncExc``): it lands on
whatever bytecode the target thread runs. A teardown therefore runs on a ``Worker``
thread, and the thread that asked for it waits in short slices (``wait``), recording
what lands on it instead of being cut short by it. Work that must run on the waiting
thread itself (restoring signal handlers: only the main thread may) is posted back to
it (``Job.on_caller``) and run inside the same wait loop, again until it completes.

Workers are started *before* a failure, when a session is created (``POOL.prepare``),
never on the failure path: a thread start there opens a window in which an exception
aimed at the main thread can reach the new thread (seen on Python 3.11) and leave the
starter waiting in ``Thread.start`` without bound. A worker is reused for the next job
once it finished; one stuck in a job (a release that never returns) is left, and the
next ``prepare`` starts another.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

SLICE_S = 0.05
"""How long one wait slice lasts: the longest a posted call or a finished job waits to be noticed."""

SESSION_WORKERS = 3
"""The workers a session makes ready when it is made: a teardown's, one for a step with a deadline, one for the
failure notice (work a teardown waits for with a deadline)."""

EXIT_WAIT_S = 5.0
"""At interpreter exit, how long to wait for workers still inside a job (a release left running).

A release left inside torch (a gloo collective whose peer is gone) usually ends soon
after (the peer's death closes its connections); a process that exits while a thread is
still inside a process group's C++ code dies of SIGABRT ("terminate called without an
active exception"), which hides the run's own outcome.
"""


class _Call:
    """A callable posted to the waiting thread, and how it ended."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.error: BaseException | None = None


class Job(Generic[T]):
    """Work for a worker thread: ``fn()``'s result or error once ``done``; calls it posts to the waiting thread."""

    def __init__(self, fn: Callable[[], T]) -> None:
        """Not started; nothing posted."""
        self._fn = fn
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None
        self.abandoned = False
        """Set by the waiting thread when it stopped waiting (an escalated interrupt): nothing it posts runs."""
        self.in_step: object | None = None
        """What the job is running that may hang (a teardown step), set by the job itself; None between them."""
        self._posted: deque[_Call] = deque()
        self._posted_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.waiter = threading.current_thread()
        """The thread that made the job and waits for it: ``on_caller`` runs there."""
        self._claim = threading.Lock()

    def run(self) -> None:
        """Run ``fn`` here (a worker's thread, or the caller's own as a fallback); never raises.

        At most once: a job handed over again (a landing cut its first hand-over short) runs
        where it was claimed first; the other ``run`` returns at once.
        """
        if not self._claim.acquire(blocking=False):
            return
        self.thread = threading.current_thread()
        try:
            self.result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self.error = exc
        finally:
            self.done.set()
            self._posted_event.set()

    def on_caller(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the waiting thread (from ``fn``'s own thread), wait for it, and raise what it raised.

        Run inline when this already is the waiting thread (a job run in place). If the
        waiting thread stopped waiting (``abandoned``), ``fn`` does not run and
        ``JobAbandoned`` is raised.
        """
        if threading.current_thread() is self.waiter:
            fn()
            return
        call = _Call(fn)
        self._posted.append(call)
        self._posted_event.set()
        while not call.done.wait(SLICE_S):
            if self.abandoned:
                raise JobAbandoned("the waiting thread stopped waiting; not run")
        if call.error is not None:
            raise call.error

    def serve(self) -> None:
        """Wait one slice for the job; run what it posted (each call once, to its end: a landing re-runs it)."""
        self._posted_event.wait(SLICE_S)
        self._posted_event.clear()
        while self._posted:
            call = self._posted[0]
            try:
                call.fn()
            except Exception as exc:  # noqa: BLE001 - handed back to the job
                call.error = exc
            # A BaseException that is not an Exception (a landing) propagates: the call stays
            # posted and runs again in the next slice, so it ends up run to its end.
            self._posted.popleft()
            call.done.set()
        if self.done.is_set():
            self._posted_event.set()


class JobAbandoned(RuntimeError):
    """A call posted to a waiting thread that stopped waiting: it did not run."""


class Worker:
    """A daemon thread that runs jobs one after another."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._jobs: deque[Job[object]] = deque()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="lifecycle-teardown", daemon=True)

    def give(self, job: Job[object]) -> None:
        """Hand ``job`` to this (idle) worker."""
        self._jobs.append(job)
        self._ready.set()

    def _loop(self) -> None:
        # SIGINT/SIGTERM go to the main thread (the one waiting), which runs their handlers
        # at once; delivered to a worker, they would wait for the main thread's next slice.
        with contextlib.suppress(AttributeError, ValueError, OSError):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        while True:
            self._ready.wait()
            self._ready.clear()
            while self._jobs:
                _BUSY.add(self.thread)
                try:
                    self._jobs.popleft().run()
                finally:
                    _BUSY.discard(self.thread)
                self._pool.idle(self)


class Pool:
    """Idle workers of this process, started ahead of need."""

    def __init__(self) -> None:
        """No worker yet."""
        self._idle: list[Worker] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def prepare(self, count: int = SESSION_WORKERS) -> None:
        """Make sure ``count`` idle workers are ready (starts what is missing): call it off the failure path.

        ``SESSION_WORKERS`` by default, what a session starts with, so that no thread is
        started on the failure path.
        """
        with self._lock:
            if self._pid != os.getpid():  # a forked child has none of its parent's threads
                self._idle, self._pid = [], os.getpid()
            while len(self._idle) < count:
                worker = Worker(self)
                worker.thread.start()
                self._idle.append(worker)

    def idle(self, worker: Worker) -> None:
        """``worker`` finished its job: it can take the next one."""
        with self._lock:
            if self._pid == os.getpid():
                self._idle.append(worker)

    def on_idle_workers(self, fn: Callable[[], object], timeout_s: float = 5.0) -> int:
        """Run ``fn`` once on each idle worker's thread (e.g. ``sys.settrace``); how many ran it in time."""
        with self._lock:
            workers, self._idle = self._idle, []
        ran = 0
        for worker in workers:
            job: Job[object] = Job(fn)
            worker.give(job)  # it goes back to idle once done
            ran += job.done.wait(timeout_s)
        return ran

    def run_within(self, fn: Callable[[], T], timeout_s: float) -> tuple[bool, T | None]:
        """Run ``fn`` on an idle worker and wait at most ``timeout_s``: (finished, its result).

        Without an idle worker, a daemon thread is started for it (the one case where a
        thread starts here). ``fn`` must not raise; one still running at the deadline is
        left to finish (the worker is then busy, and the next ``prepare`` starts another).
        """
        job: Job[T] = Job(fn)
        if not self.submit(job):
            threading.Thread(target=job.run, name="lifecycle-deadline", daemon=True).start()
        finished = job.done.wait(timeout_s)
        return finished, job.result

    def submit(self, job: Job[T]) -> bool:
        """Hand ``job`` to an idle worker; False (nothing started) if none is ready: run it in place then."""
        with self._lock:
            if self._pid != os.getpid() or not self._idle:
                return False
            worker = self._idle.pop()
        worker.give(job)  # type: ignore[arg-type]
        return True


POOL = Pool()
"""This process's workers."""

_BUSY: set[threading.Thread] = set()


@atexit.register
def _wait_for_busy_workers() -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    for thread in list(_BUSY):
        thread.join(max(0.0, deadline - time.monotonic()))


def run_waiting(
    job: Job[T],
    landed: list[BaseException],
    serve: Callable[[Job[T]], None],
    stop: tuple[type[BaseException], ...] = (),
) -> Job[T]:
    """Run ``job`` on a worker and wait for it here, appending to ``landed`` whatever lands on this thread meanwhile.

    ``serve(job)`` is one wait slice (``Job.serve``, or a function of the caller's that
    calls it, so that an interrupt shield recognises the wait by its code). Without an
    idle worker, it runs here, unprotected. An exception ``serve`` raises that is one of
    ``stop`` (an escalated interrupt) ends the wait and propagates (the job runs on).
    Returns the job (``result`` / ``error`` set once ``done``).

    Before the wait loop, what lands here propagates: call it again with the same job to
    go on (the job is handed over again, and runs once however often it was).
    """
    if not POOL.submit(job):
        job.run()  # a no-op where a worker claimed it already: the loop then waits for that one
    while True:
        try:
            while not job.done.is_set():
                serve(job)
            serve(job)  # what it posted last, if anything
            return job
        except stop:
            raise
        except BaseException as exc:  # noqa: BLE001 - a landing: recorded, the wait goes on
            landed.append(exc)
