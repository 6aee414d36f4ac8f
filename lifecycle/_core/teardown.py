"""A session's teardown plans, run on a worker while the caller's thread waits: each step bounded, all abandonable.

``Session.fail`` and ``Session.close`` hand their work to a ``TeardownRunner``. It runs the
work on one of lifecycle's worker threads (``lifecycle._core.worker``) while the caller
waits, so an exception raised into the caller (an asynchronous one: a restart wrapper's
request) cannot cut a teardown short; each step of a plan runs through the session's
holdings (claimed, at most once), on yet another worker when the session has a
per-step deadline, so a release that hangs is left running and the plan goes on; and a
second interrupt (``TeardownInterrupted``) makes the waiting thread stop waiting: the
worker is left inside the step it is in, and the session ends without it.

The runner keeps the state this needs (the job running now, the worker left behind, the
records of the plan running now, the steps left past their deadline, the last report);
the session keeps its machine, journal and observers, which the runner reaches only
through the ``Host`` it is given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import NoReturn, Protocol

from lifecycle._core.errors import StepTimedOut, describe
from lifecycle._core.executor import Released, Releaser, StepRecord, TeardownReport, execute
from lifecycle._core.holdings import Holdings
from lifecycle._core.ownership import Ledger
from lifecycle._core.plans import Outcome, RestartMode, Step, recorded_owner, teardown
from lifecycle._core.shield import Shield, TeardownInterrupted
from lifecycle._core.states import Owner
from lifecycle._core.worker import POOL, SLICE_S, Job, run_waiting

logger = logging.getLogger("lifecycle.session")

ABANDON_GRACE_S = 1.0
"""After an escalated interrupt, the longest the worker gets to reach its next step (bookkeeping only)."""

STEP_GRACE_S = 0.2
"""After an escalated interrupt, how long a step the worker is inside gets to return before it is left running."""


class Host(Protocol):
    """What a ``TeardownRunner`` reads from, and tells, the session it runs teardowns for."""

    label: str
    restart_mode: RestartMode
    release_timeout_s: float | None

    @property
    def ledger(self) -> Ledger:
        """The session's ledger now."""
        ...

    def teardown_step_ran(self, outcome: Outcome, record: StepRecord, by: Releaser | None = None) -> None:
        """A step of ``outcome``'s plan ran, or (``by`` given) a release outside its plans did; never raises."""
        ...

    def teardown_abandoned(self, escalation: TeardownInterrupted) -> None:
        """The waiting thread ended the teardown without the worker: the session goes ``failed`` now."""
        ...


class TeardownRunner:
    """Runs one session's teardown plans on workers while the session's caller waits (see the module docstring)."""

    def __init__(self, host: Host, holdings: Holdings, shield: Shield) -> None:
        """Bind to ``host`` (the session), its ``holdings`` and its ``shield`` (whose escalation stops a plan)."""
        self._host = host
        self._holdings = holdings
        self._shield = shield
        self._report: TeardownReport | None = None
        self._job: Job[TeardownReport] | None = None
        self._left_thread: threading.Thread | None = None  # a worker the session stopped waiting for
        self._records: list[StepRecord] = []  # the records of the plan running now
        self._timed_out: list[Step] = []  # steps left running past the host's release_timeout_s
        self._escalated: TeardownInterrupted | None = None
        self.landed: list[BaseException] = []
        """What landed on the waiting thread (asynchronous exceptions), raised once the session is final."""
        holdings.on_release = self._released

    @property
    def report(self) -> TeardownReport | None:
        """The report of the last teardown, or None before any ran (the session's ``report``).

        Its ``released_elsewhere`` is what the holdings released outside the session's own
        plans up to now (the restart wrapper's abort may run after the teardown ended).
        """
        report = self._report
        if report is None:
            return None
        elsewhere = tuple(r for r in self._holdings.released() if not r.by.own_plan)
        return dataclasses.replace(report, released_elsewhere=elsewhere)

    @report.setter
    def report(self, report: TeardownReport | None) -> None:
        self._report = report

    def _released(self, done: Released) -> None:
        """The holdings ran a release: one outside the session's plans is told to the host as it happens."""
        if not done.by.own_plan:
            self._host.teardown_step_ran(done.record.outcome, done.record, done.by)

    def abandoned_here(self) -> bool:
        """True on a worker the session stopped waiting for: its late bookkeeping is to be dropped."""
        return self._left_thread is not None and threading.current_thread() is self._left_thread

    def take_landed(self) -> list[BaseException]:
        """What landed so far (see ``landed``), which is emptied."""
        landed, self.landed = self.landed, []
        return landed

    def raise_landed(self, cause: BaseException | None) -> None:
        """Raise the first exception that landed on the waiting thread (from ``cause``), noting the others on it."""
        landed = self.take_landed()
        if not landed:
            return
        first = landed[0]
        for later in landed[1:]:
            if cause is not None and later is not first:
                cause.add_note(f"lifecycle: {describe(later)} also landed during the teardown")
        if cause is None:
            raise first
        raise first from cause

    def wait(self, work: Callable[[], TeardownReport], outcome: Outcome) -> TeardownReport:
        """Run ``work`` on a worker while this thread waits, appending to ``landed`` what lands here; its result.

        Raises what ``work`` raised. A second interrupt (``TeardownInterrupted``, raised
        by the shield in the wait) stops the worker before its next step; if it is inside
        a step that does not return within ``STEP_GRACE_S`` (a release that hangs), this
        thread leaves it running there, runs what must not be skipped, and the session
        goes ``failed`` (``Host.teardown_abandoned``); the interrupt is raised.

        An exception that lands before the wait loop (``run_waiting``) propagates and
        leaves the job on record: the next ``wait`` goes on with that job, not ``work``
        (it may be running already: there must never be two teardowns).
        """
        job = self._job
        if job is None or job.done.is_set() or job.abandoned:
            job = Job(work)
            self._job = job
        try:
            run_waiting(job, self.landed, _serve, stop=(TeardownInterrupted,))
        except TeardownInterrupted as escalation:
            self._escalated = escalation  # the worker stops between steps, also once the shield is gone
            start = time.monotonic()
            running = job.in_step
            while not job.done.is_set():
                grace = STEP_GRACE_S
                if running is None or (isinstance(running, Step) and running.kind.main_thread):
                    grace = ABANDON_GRACE_S  # between steps, or a step posted here that the next serve() runs
                if time.monotonic() - start >= grace:
                    self._abandon(job, running, escalation, outcome)
                try:
                    job.serve()
                except BaseException as exc:  # noqa: BLE001 - a landing: recorded
                    self.landed.append(exc)
                running = job.in_step
        finally:
            if job.done.is_set() or job.abandoned:
                self._job = None
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def _abandon(
        self, job: Job[TeardownReport], running: object, escalation: TeardownInterrupted, outcome: Outcome
    ) -> NoReturn:
        """End the teardown here, leaving the worker inside ``running``: run what must not be skipped; raise."""
        self._left_thread = job.thread  # what the worker does from now on is not this session's story
        job.abandoned = True
        records = tuple(self._records)  # what the worker's plan ran so far
        done = {record.step for record in records}
        held = teardown(self._host.ledger, self._host.restart_mode, outcome)  # the plan that was running
        for step in held.plan:
            if not step.kind.abandonable:
                with contextlib.suppress(Exception):
                    self._holdings.run(step, by=Releaser(outcome.value))
        # Every abandonable step still held, wherever it stands in the plan: those before ``running`` the
        # worker skipped once the interrupt escalated are as unreleased as those after it.
        rest = tuple(step for step in held.plan if step.kind.abandonable and step not in done and step != running)
        left_running = (running,) if isinstance(running, Step) else ()
        self.report = TeardownReport(
            outcome, self._host.restart_mode, records, held.left, rest, escalation, left_running
        )
        running_text, rest_text = (", ".join(map(str, steps)) or "none" for steps in (left_running, rest))
        escalation.add_note(
            f"lifecycle: {self._host.label}: teardown abandoned; left running: {running_text}; not run: {rest_text} "
            "(what they hold is for the next session to reclaim)"
        )
        self._host.teardown_abandoned(escalation)
        raise escalation

    def run_plan(self, outcome: Outcome, *, stop_at_failure: bool = False) -> TeardownReport:
        """Run the plan of ``outcome`` for the ledger now; the holdings mark each release as it happens.

        Never raises: an interrupt between steps ends the plan, recorded in the report's
        ``interrupted`` with the steps not run. A step past the deadline is in
        ``left_running``.
        """
        restart_mode = self._host.restart_mode
        self._holdings.settle_pending(lambda resource: recorded_owner(resource, Owner.SESSION, restart_mode))
        planned = teardown(self._host.ledger, self._host.restart_mode, outcome)
        ran: list[StepRecord] = []
        if not self.abandoned_here():
            self._records = ran  # read by _abandon if this thread is left inside a step

        def observed(record: StepRecord) -> None:
            ran.append(record)
            self._host.teardown_step_ran(outcome, record)

        try:
            report = execute(
                planned,
                lambda step: self._perform(step, Releaser(outcome.value)),
                on_step=observed,
                stop_at_failure=stop_at_failure,
                escalated=lambda: self._shield.escalation or self._escalated,
            )
        except BaseException as exc:  # noqa: BLE001 - an interrupt between steps: keep what ran, abandon the rest
            rest = planned.plan[len(ran) :]
            report = TeardownReport(outcome, self._host.restart_mode, tuple(ran), planned.left, rest, exc)
        if self._timed_out:  # a step past its deadline is left running: it may still finish
            report = dataclasses.replace(report, left_running=report.left_running + tuple(self._timed_out))
        if not self.abandoned_here():
            self.report = report
        return report

    def _perform(self, step: Step, by: Releaser) -> bool:
        """Run ``step`` through the holdings for ``by`` (claimed, at most once); False if another thread released it.

        A step of a kind that must run on the waiting thread (``StepKind.main_thread``:
        restoring signal handlers) is posted to it when the teardown runs on a worker.
        """
        job = self._job

        def call(release: Callable[[], object]) -> None:
            if job is not None and step.kind.main_thread:
                job.on_caller(release)
                return
            (_run_step if step.kind.abandonable else _run_step_to_the_end)(release)

        if job is None:
            return self._holdings.run(step, call, by=by)
        job.in_step = step
        try:
            timeout = self._host.release_timeout_s
            if timeout is None or step.kind.main_thread or not step.kind.abandonable:
                return self._holdings.run(step, call, by=by)
            return self._within(step, timeout, lambda: self._holdings.run(step, call, by=by))
        finally:
            job.in_step = None

    def _within(self, step: Step, timeout_s: float, run: Callable[[], bool]) -> bool:
        """``run()`` (one step, through the holdings) on another worker, waited for at most ``timeout_s``.

        Past it, ``StepTimedOut``: the step is left running there, its entry still claimed
        (settled by that worker when it returns; ``LEFTOVERS.wait_for_running`` waits for it).
        Without an idle worker it runs here, unbounded.
        """
        sub: Job[bool] = Job(run)
        if not POOL.submit(sub):
            return run()
        deadline = time.monotonic() + timeout_s
        while not sub.done.wait(min(SLICE_S, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                self._timed_out.append(step)
                self._holdings.stuck(step.entry.key)
                logger.error(
                    "%s: teardown step %s not done within %g s: left running", self._host.label, step, timeout_s
                )
                raise StepTimedOut(str(step), timeout_s)
        if sub.error is not None:
            raise sub.error
        return bool(sub.result)


def _run_step(release: Callable[[], object]) -> None:
    """Run a teardown step's release: the only place an escalated interrupt is raised at once."""
    release()


def _run_step_to_the_end(release: Callable[[], object]) -> None:
    """Run a release that must not be left half done (its kind is not ``abandonable``)."""
    release()


def _serve(job: Job[TeardownReport]) -> None:
    """One slice of waiting for a teardown on a worker: where an escalated interrupt is raised at once."""
    job.serve()


STEP_CODES = frozenset({_run_step.__code__, _serve.__code__})
"""Where an escalated interrupt is raised at once: inside a teardown step (which may hang), or waiting for one."""

SERVE_CODE = _serve.__code__
"""The code of the wait loop, whose frames a tracer must skip (how often it runs is timing)."""
