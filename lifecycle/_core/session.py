"""The session: one training run's life, driven along the declared table."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import signal
import time
from collections.abc import Callable
from types import FrameType, TracebackType

from lifecycle._core import events
from lifecycle._core.acquiring import Acquirer
from lifecycle._core.errors import SessionFinished, UnfinishedSession, describe
from lifecycle._core.events import (
    FailureEvent,
    JournalEntry,
    ReclaimEvent,
    SessionEvent,
    TransitionEvent,
)
from lifecycle._core.executor import Releaser, StepRecord, TeardownReport, raise_failures
from lifecycle._core.failing import fail_surely
from lifecycle._core.frames import clear_frames_of, note_cleared
from lifecycle._core.holdings import Holdings
from lifecycle._core.machine import Driver
from lifecycle._core.ownership import Ledger, caller_site
from lifecycle._core.plans import Outcome, RestartMode
from lifecycle._core.resources import Resource, StepKind
from lifecycle._core.seams import BoundsReleases, CheckpointWriter, DistributedActions, ProgressSink, announce
from lifecycle._core.shield import Shield, TeardownInterrupted
from lifecycle._core.states import Owner, State, Trigger
from lifecycle._core.teardown import STEP_CODES, TeardownRunner
from lifecycle._core.worker import POOL
from lifecycle.journal.evidence import kind_of

logger = logging.getLogger("lifecycle.session")

_IDS = itertools.count(1)


class Session:
    """One distributed training session: use it once, then start a new one.

    Triggers (``init_distributed`` … ``close``, ``fail``) raise ``InvalidTransition``
    before any side effect when the current state declares no edge for them; acting on
    a finished session (``register`` after ``close``) raises ``SessionFinished``. As a
    context manager, an exception inside the block (``KeyboardInterrupt`` and
    ``SystemExit`` too) takes the failure edge and propagates unchanged; a block that
    ends normally in ``training`` or ``finalizing`` is finished and closed, and one
    that ends in an earlier live state takes the failure edge and raises
    ``UnfinishedSession``.

    What it acquires follows the resource declarations (``lifecycle.lowlevel.Resource``): each
    trigger acquires the kinds declared ``acquired_by`` it, in declaration order, and
    binds their release callables to the new ledger entry; teardown runs, for each
    step of the plan, the callable bound to its entry and kind.
    """

    def __init__(
        self,
        actions: DistributedActions,
        *,
        restart_mode: RestartMode = RestartMode.ORDINARY,
        iteration: int = 0,
        label: str = "session",
        release_timeout_s: float | None = None,
    ) -> None:
        """Bind a new session, in ``uninitialized``, to ``actions`` (what it does to torch/Megatron).

        ``label`` names it in log lines (``pretrain`` sets it to ``"rank N"`` once the rank is known).
        ``release_timeout_s``: the longest one teardown step may run (None: what the actions
        say, ``BoundsReleases``: ``TorchActions`` says twice the group timeout; actions that
        say nothing: no bound). A step past it is left running on its thread and recorded
        as failed with ``StepTimedOut``; the plan goes on (so an abort still follows a
        graceful destroy that hangs) and the session still ends final.
        """
        self._actions = actions
        self.restart_mode = restart_mode
        self.iteration = iteration
        self.label = label
        self.id = next(_IDS)
        self._reclaimed: list[StepRecord] = []
        self._driver = Driver()
        self._holdings = Holdings(self, self.id, lambda: f"{self.label} [session {self.id}]")
        self._journal: list[JournalEntry] = []
        self._exit_request: str | None = None
        self._shield = Shield(_PROTECTED, STEP_CODES, self)
        self._teardowns = TeardownRunner(self, self._holdings, self._shield)
        self._acquirer = Acquirer(
            self._holdings, actions, lambda: self.restart_mode, lambda: self.label, self._reclaimed_one
        )
        self._observers: list[Callable[[SessionEvent], object]] = []
        self._phase: tuple[str, State] | None = None  # (phase, the state it was given in)
        self._step: int | None = None
        self.progress_sink: ProgressSink | None = None
        """Where ``progress`` also sends each mark (None: nowhere); ``pretrain``'s while its monitor runs."""
        if release_timeout_s is None and isinstance(actions, BoundsReleases):
            release_timeout_s = actions.release_timeout_s
        if release_timeout_s is not None and not release_timeout_s > 0:
            raise ValueError(f"release_timeout_s must be above 0 (or None), not {release_timeout_s!r}")
        self.release_timeout_s = release_timeout_s
        POOL.prepare()  # the threads a teardown needs, started now: never on the failure path

    # -- what can be read -------------------------------------------------------------

    @property
    def state(self) -> State:
        """The current state."""
        return self._driver.state

    @property
    def actions(self) -> DistributedActions:
        """The actions this session drives: what it does to torch.distributed and Megatron-core."""
        return self._actions

    @property
    def ledger(self) -> Ledger:
        """The ownership ledger (an immutable snapshot): which ``Owner`` holds each acquired ``Resource``."""
        return self._holdings.ledger

    @property
    def holdings(self) -> Holdings:
        """What this session holds: its ledger, the release callables bound to each entry, their claims.

        ``holdings.run(step)`` is the one way to release an entry (the restart wrapper's
        abort uses it too): a resource is released at most once, whichever thread asks.
        """
        return self._holdings

    @property
    def journal(self) -> tuple[JournalEntry, ...]:
        """Every transition taken, in order."""
        return tuple(self._journal)

    @property
    def report(self) -> TeardownReport | None:
        """The report of the last teardown, or None before any teardown ran."""
        return self._teardowns.report

    @property
    def reclaimed(self) -> tuple[StepRecord, ...]:
        """The release steps this session ran on what earlier sessions left (see ``lifecycle._core.leftovers``)."""
        return tuple(self._reclaimed)

    @property
    def exit_requested(self) -> str | None:
        """Why a graceful exit was requested (e.g. ``"SIGTERM"``), or None."""
        return self._exit_request

    # -- triggers ---------------------------------------------------------------------

    def init_distributed(self) -> None:
        """``uninitialized`` → ``dist_ready``: acquire the kinds declared for it (the default process group)."""
        detail = f"restart_mode={self.restart_mode.value} iteration={self.iteration}"
        site = caller_site()  # taken here: inside the machine, the caller's frames are transitions'
        self._fire(Trigger.INIT_DISTRIBUTED, lambda: self._acquirer.declared(Trigger.INIT_DISTRIBUTED, site), detail)

    def init_globals(self) -> None:
        """``dist_ready`` → ``globals_ready``: acquire the kinds declared for it (the Megatron-core globals).

        If one acquisition raises, those before it stay recorded (the failure edge
        releases them) and the state does not move.
        """
        site = caller_site()
        self._fire(Trigger.INIT_GLOBALS, lambda: self._acquirer.declared(Trigger.INIT_GLOBALS, site))

    def start_training(self) -> None:
        """``globals_ready`` → ``training``."""
        self._fire(Trigger.START_TRAINING, lambda: None)

    def finish(self) -> None:
        """``training`` → ``finalizing``: the loop ended normally or by a requested exit."""
        self._fire(Trigger.FINISH, lambda: None)

    def close(self) -> TeardownReport:
        """``finalizing`` → ``closed``: run the success plan, and return its report.

        If a step raises, the success plan stops there: the session takes the failure
        edge, whose plan releases what is still held (no barrier, abort rather than
        destroy; a user release that raised is not run again), and raises a
        ``TeardownError`` grouping every step's ``Exception``; if a step was interrupted
        (Ctrl-C, ``SystemExit``), that interruption is raised instead, from the group.
        ``report`` then lists every step that ran, from both plans, in order.

        SIGINT and SIGTERM wait until the session is final (see
        ``lifecycle._core.shield``); a second one during the teardown abandons the rest
        of it: the session takes the failure edge at once (what it still holds is
        reclaimed by the next session) and ``TeardownInterrupted`` is raised.

        The teardown runs on a worker thread while this thread waits (see
        ``lifecycle._core.worker``): an exception raised into this thread meanwhile (an
        asynchronous one: a restart wrapper's request) cannot cut it short; the first one
        is raised once the session is final (from the teardown's error, if any).
        """
        return self._shielded(self._close, Outcome.SUCCESS, None)

    def _close(self) -> TeardownReport:
        start = time.monotonic()
        reports: list[TeardownReport] = []

        def work() -> bool:
            reports.append(self._teardowns.run_plan(Outcome.SUCCESS, stop_at_failure=True))
            return not reports[0].failed and reports[0].interrupted is None

        if self._driver.fire(Trigger.CLOSE, work):
            self._journal_move(State.FINALIZING, Trigger.CLOSE, start)
            return reports[0]
        success = reports[0]
        if self._teardowns.abandoned_here():  # the session ended without this worker: no failure plan, no notice
            return success
        if success.interrupted is not None:
            cause = describe(success.interrupted)
            self._fail_teardown(start, f"teardown abandoned: {cause}", success.interrupted, abandoned=success)
            raise success.interrupted
        failed = "; ".join(f"{f.step}: {type(f.error).__name__}" for f in success.failed)
        logger.error("%s: teardown step failed (%s); switching to the failure plan", self.label, failed)
        after = self._fail_teardown(start, f"teardown failed: {failed}", success.failed[0].error)
        both = success.records + after.records
        self._teardowns.report = dataclasses.replace(after, records=both, abandoned=after.abandoned)
        if after.interrupted is not None:
            raise after.interrupted
        raise_failures(success.failed + after.failed)
        raise AssertionError("unreachable: a failed teardown raised nothing")  # pragma: no cover

    def fail(self, error: BaseException) -> TeardownReport:
        """Any live state → ``failed``: run the failure plan because of ``error``, and return the report.

        ``error`` is logged first (ERROR, ``lifecycle.session``, with ``label``), before
        anything is released, so a teardown that hangs cannot hide the cause. Then, still
        before any release, the actions tell the other ranks (if they can: see
        ``AnnouncesFailures``; bounded, never raising) and observers get a
        ``FailureEvent``; if a peer's failure came first (or the first is unknown), a note
        on ``error`` says so. It is not raised here: re-raise it yourself (the context
        manager does). Each failed step adds a note to ``error``. If an exit was requested
        (e.g. SIGTERM) before or during the failure, ``error.requested_exit`` is set to the
        reason and a note says so: a retry loop should stop instead of starting a new
        attempt. If a step was interrupted by a ``BaseException`` that is not an
        ``Exception`` (Ctrl-C, a restart request), the remaining steps still run and that
        interruption is raised afterwards, from ``error``.

        SIGINT and SIGTERM wait until the session is final, then reach the handler
        that was there before (a Ctrl-C then raises ``KeyboardInterrupt``, from
        ``error``); a second one during the teardown abandons the rest of it and
        ``TeardownInterrupted`` is raised at once, the session final all the same.

        The teardown runs on a worker thread while this thread waits (see
        ``lifecycle._core.worker``): an exception raised into this thread meanwhile (NVRx's
        ``RankShouldRestart``, raised again and again past its soft timeout) cannot cut it
        short. The first one is raised from ``error`` once the session is final, so a
        restart wrapper still gets its request; later ones are noted on ``error``. One that
        lands before that wait (from this method's first instruction that does anything on)
        does not stop the teardown either: it is raised from ``error`` once the session is
        final (``lifecycle._core.failing``).
        """
        try:
            return self._shielded(lambda: self._fail(error), Outcome.FAILURE, error)
        except BaseException as landed:
            if self.state.is_final:
                raise
            fail_surely(self, error, [landed])  # final, then raises ``landed`` from ``error``
            raise

    def _shielded(
        self, work: Callable[[], TeardownReport], outcome: Outcome, cause: BaseException | None
    ) -> TeardownReport:
        """``close``'s and ``fail``'s body: ``work`` under the shield, on a worker; once final, what landed is raised.

        ``cause``: the failure being torn down (None on the success edge), what an
        escalation or a landing is raised from.
        """
        self._shield.install()
        try:
            report = self._teardowns.wait(work, outcome)
        except BaseException as exc:
            escalation = self._end_shield(cause)
            if escalation is not None and escalation is not exc:
                raise escalation from (exc if cause is None else cause)
            if not isinstance(exc, TeardownInterrupted):
                self._teardowns.raise_landed(exc if cause is None else cause)
            raise
        escalation = self._end_shield(cause)
        if escalation is not None:  # it landed in bookkeeping, after the last step: raised all the same
            if cause is None:
                raise escalation
            raise escalation from cause
        self._teardowns.raise_landed(cause)
        return report

    def final_landings(self, cause: BaseException) -> tuple[TeardownInterrupted | None, list[BaseException]]:
        """Once final: remove the shield; (the escalation if any, what landed on the waiting thread: emptied)."""
        return self._end_shield(cause), self._teardowns.take_landed()

    def _end_shield(self, cause: BaseException | None = None) -> TeardownInterrupted | None:
        """Once final: remove the shield (a deferred Ctrl-C is raised from ``cause``); return an escalation.

        An exception landing inside the removal is recorded (``TeardownRunner.raise_landed``) and the
        removal runs again: a final session never leaves its handlers installed.
        """
        if not self.state.is_final:
            return None
        while True:
            try:
                return self._shield.remove(cause)
            except BaseException as exc:  # a landing, unless the removal ran to its end
                if not self._shield.installed:
                    raise  # removed: what a deferred signal's previous handler raised
                self._teardowns.landed.append(exc)

    def _fail(self, error: BaseException) -> TeardownReport:
        start, text, state = time.monotonic(), describe(error), self.state.value

        def log_first() -> None:  # once the machine accepted the trigger, before any release
            logger.error("%s failed in state %s: %s; releasing what it owns", self.label, state, text)

        holders = tuple(dict.fromkeys(p for e in self.ledger.entries for p in e.resource.held_in_frames_of))
        # Never the caller's frames; before the groups are aborted; the note after the teardown's own notes.
        cleared = clear_frames_of(error, holders, quietly=("lifecycle",), note=False)
        report = self._fail_teardown(start, text, error, log_first)
        note_cleared(error, cleared, holders)
        for failure in report.failed:
            error.add_note(f"lifecycle: teardown step {failure.step} also failed: {describe(failure.error)}")
        if self._exit_request is not None:
            error.requested_exit = self._exit_request  # type: ignore[attr-defined]
            error.add_note(
                f"lifecycle: an exit was requested ({self._exit_request}) before this failure was torn down: "
                "do not retry (error.requested_exit)"
            )
        if report.interrupted is not None:
            raise report.interrupted from error
        interruption = next((f.error for f in report.failed if not isinstance(f.error, Exception)), None)
        if interruption is not None and interruption is not error:
            raise interruption from error
        return report

    # -- resources acquired while live ------------------------------------------------

    def track_checkpoints(self, writer: CheckpointWriter) -> None:
        """Record ``writer``'s in-flight saves: finalized on success, aborted on failure; ``AlreadyHeld`` if tracked."""
        self._check_live("track_checkpoints")
        self._acquirer.refuse_held(Resource.ASYNC_CHECKPOINT)
        releases = {StepKind.FINALIZE_CHECKPOINTS: writer.finalize, StepKind.ABORT_CHECKPOINTS: writer.abort}
        self._acquirer.record(Resource.ASYNC_CHECKPOINT, Owner.SESSION, releases, "", caller_site())

    def register(self, name: str, release: Callable[[], object]) -> None:
        """Record a user resource ``name``; ``release()`` runs at teardown, in reverse registration order.

        ``AlreadyHeld`` if this session already registered ``name``.
        """
        self._check_live("register")
        self._acquirer.refuse_held(Resource.USER, name)
        releases = {StepKind.RELEASE_USER_RESOURCE: release}
        self._acquirer.record(Resource.USER, Owner.SESSION, releases, name, caller_site())

    def install_signal_handlers(
        self, signums: tuple[int, ...] = (signal.SIGTERM,), on_signal: Callable[[int], None] | None = None
    ) -> None:
        """Turn each of ``signums`` into a requested exit (see ``exit_requested``); restored at teardown.

        With ``on_signal``, a signal calls ``on_signal(signum)`` instead, in the main thread,
        between two bytecodes (as a signal handler): it may request the exit itself, or
        raise (``pretrain`` raises ``StoppedByLauncher`` for a SIGTERM that follows a peer's
        failure). Installing twice raises ``AlreadyHeld`` before anything is installed. At
        teardown a signal's previous handler is put back only if ours is still the one installed.
        """
        self._check_live("install_signal_handlers")
        self._acquirer.refuse_held(Resource.SIGNAL_HANDLERS)

        def request(signum: int, frame: FrameType | None) -> None:
            (on_signal or (lambda number: self.request_exit(signal.Signals(number).name)))(signum)

        self._acquirer.signal_handlers(signums, request, caller_site())

    def request_exit(self, reason: str) -> None:
        """Ask the training loop to stop gracefully; the first reason given is kept."""
        if self._exit_request is None:
            self._exit_request = reason

    def progress(self, phase: str, step: int | None = None) -> None:
        """Say where the caller is, for the report of a failure: ``phase`` (e.g. ``"step"``) at training ``step``.

        A failure is reported (``FailureEvent``, the notice to the other ranks) in the
        phase given last, or in the state's name once a transition was taken since
        (so ``progress`` need not be called again to leave a phase); at the step given
        last (``step`` None keeps it; None until one is given). Then ``progress_sink``, if
        set, gets the phase and that step (``pretrain``'s writes this rank's mark for its
        liveness monitor into a shared page: no system call). Cheap (docs/benchmarks.md,
        progress-mark): call it as often as you like. Never raises (a sink never does).
        """
        self._phase = (phase, self.state)
        if step is not None:
            self._step = step
        if (sink := self.progress_sink) is not None:
            sink(phase, self._step)

    def add_observer(self, observer: Callable[[SessionEvent], object]) -> None:
        """Call ``observer`` right after each transition and each teardown step, with what happened.

        On the failure edge it is called first with a ``FailureEvent``, before anything is
        released (once per session: a session fails once).

        Observers run on the thread that drives the session, in the order added; ``end``
        times are taken when the event happens and ``start`` is ``end`` less its duration.
        An ``Exception`` an observer raises is logged as a warning and otherwise ignored:
        it never changes what the session does or how it ends.
        """
        self._observers.append(observer)

    # -- context manager --------------------------------------------------------------

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._exit(exc)
        except BaseException as landed:  # what lands on _exit's first line included
            if not self.state.is_final:
                fail_surely(self, exc if exc is not None else landed, [])
            raise

    def _exit(self, exc: BaseException | None) -> None:
        """The context manager's exit: the failure edge for ``exc``, else finish and close (see the class)."""
        if exc is not None:
            fail_surely(self, exc, [])
            return
        try:
            if self.state is State.TRAINING:
                self.finish()
            if self.state is State.FINALIZING:
                self.close()
            elif not self.state.is_final:
                error = UnfinishedSession(self.state)
                fail_surely(self, error, [])
                raise error
        except BaseException as landed:
            fail_surely(self, landed, [])
            raise

    # -- internals --------------------------------------------------------------------

    def _fire(self, trigger: Trigger, work: Callable[[], object], detail: str = "") -> None:
        """Take ``trigger``'s edge, running ``work`` inside it; the machine refuses an invalid trigger first."""
        source, start = self.state, time.monotonic()

        def run() -> bool:
            installed = self._shield.install()  # from the first trigger until final (main thread only)
            try:
                work()
            except BaseException:
                if installed and self.state is State.UNINITIALIZED and self._holds_nothing():
                    self._shield.remove()  # refused before acquiring anything: leave no handler behind
                raise
            return True

        self._driver.fire(trigger, run)
        self._journal_move(source, trigger, start, detail)

    # -- what the teardown runner tells the session (``lifecycle._core.teardown.Host``) --

    def teardown_step_ran(self, outcome: Outcome, record: StepRecord, by: Releaser | None = None) -> None:
        """A step of ``outcome``'s plan ran (``TeardownEvent``), or ``by`` released outside them (``ReleaseEvent``)."""
        if self._observers:
            told = events.TeardownEvent(outcome, record, record.start, record.end)
            self._notify(told if by is None else events.ReleaseEvent(by, record))

    def teardown_abandoned(self, escalation: TeardownInterrupted) -> None:
        """The caller stopped waiting for the teardown (a second interrupt): the session goes ``failed`` now."""
        start = time.monotonic()
        if not self.state.is_final:
            source = self.state
            self._driver.force_failed()
            self._journal_move(source, Trigger.FAIL, start, f"teardown abandoned: {describe(escalation)}")

    def _holds_nothing(self) -> bool:
        """True if the ledger records nothing the session would release (only what the caller owns, if anything)."""
        return all(entry.owner is Owner.CALLER for entry in self.ledger.entries)

    def _check_live(self, what: str) -> None:
        if self.state.is_final:
            raise SessionFinished(self.state, what)

    def _journal_move(self, source: State, trigger: Trigger, start: float, detail: str = "") -> None:
        if self._teardowns.abandoned_here():
            return
        now = time.monotonic()
        entry = JournalEntry(source, self.state, trigger, now, now - start, detail)
        self._journal.append(entry)
        if self._observers:
            end = time.time()
            self._notify(TransitionEvent(entry, end - entry.duration_s, end))

    def _notify(self, event: SessionEvent) -> None:
        if self._teardowns.abandoned_here():
            return
        for observer in self._observers:
            try:
                observer(event)
            except Exception:  # an observer must never change the session's outcome
                logger.warning("session observer %r failed on %s; ignored", observer, event, exc_info=True)

    def acquire(self, resource: Resource, name: str = "") -> None:
        """Acquire one instance of a declared kind that has a handler of its own, while live (e.g. mid-training).

        For a kind with ``acquired_by`` None and a ``handler``: a data-loader worker pool,
        a profiler, a server the job starts. Its ``check`` runs first, then what an earlier
        session left of the kind is reclaimed, then its ``acquire`` runs, recorded
        atomically; it is released by the teardown plans like any other kind.
        ``SessionFinished`` once final; ``AlreadyHeld`` if this session holds it already;
        ``LifecycleError`` for a kind a trigger acquires or one without a handler.
        """
        self._check_live("acquire")
        self._acquirer.own_handler(resource, name, caller_site())

    def _reclaimed_one(self, record: StepRecord, left_by: str) -> None:
        """A step ran on what ``left_by`` (an earlier session) left: kept for ``reclaimed``, observers told."""
        self._reclaimed.append(record)
        self._notify(ReclaimEvent(left_by, record))

    def _announce(self, error: BaseException, state: State) -> None:
        """Tell the other ranks that this one failed in ``state`` (if the actions can), note what they say, notify.

        Never raises ``Exception``: actions that raise are reported as not having published.
        """
        phase = self._phase[0] if self._phase is not None and self._phase[1] is state else state.value
        now = time.time()
        announcement = announce(self._actions, error, phase=phase, step=self._step, time=now)
        if announcement.note:
            error.add_note(announcement.note)
            logger.error("%s: %s", self.label, announcement.note)
        if self._observers:
            self._notify(FailureEvent(phase, self._step, describe(error), now, announcement, kind_of(error).value))

    def _fail_teardown(
        self,
        start: float,
        detail: str,
        error: BaseException,
        first: Callable[[], None] | None = None,
        *,
        abandoned: TeardownReport | None = None,
    ) -> TeardownReport:
        """Take the failure edge because of ``error``, running the failure plan inside it; return its report.

        Nothing is raised. Inside the edge, before any release: ``first``, then the
        failure is announced (``_announce``). With ``abandoned`` (the report of a teardown
        an escalated interrupt cut short), no plan runs: the edge is taken and that report
        kept. Whatever interrupts it once the work started, the session ends ``failed``
        and the transition is journaled (an interrupt inside the machine's own code included).
        """
        source = self.state
        reports: list[TeardownReport] = []
        entered = False

        def work() -> bool:
            nonlocal entered
            entered = True
            if first is not None:
                first()
            self._announce(error, source)
            if abandoned is None:
                reports.append(self._teardowns.run_plan(Outcome.FAILURE))
            else:
                self._teardowns.report = abandoned
                reports.append(abandoned)
            return True

        try:
            self._driver.fire(Trigger.FAIL, work)
        finally:
            if entered:  # not when the machine refused the trigger: nothing was done then
                if not self.state.is_final:
                    self._driver.force_failed()
                self._journal_move(source, Trigger.FAIL, start, detail)
        return reports[0]


_PROTECTED = frozenset({Session.fail.__code__, Session.close.__code__})
"""Where the shield defers signals: a teardown and its bookkeeping (see ``lifecycle._core.shield``)."""
