"""The interrupt fuzzer's machinery: raise SIGINT/SIGTERM at a chosen line lifecycle runs, then check what followed.

A *line event* is one ``line`` event of ``sys.settrace`` in a frame whose file is under
the ``lifecycle`` package while a teardown runs: ``session.fail(error)`` from
``training``, or ``session.close()`` from ``finalizing``, with their bookkeeping (ledger,
journal, leftovers, the shield's removal). ``count_lines`` lists them. ``run_case`` runs
a fresh session and raises the case's signals at the case's line events (the handler
runs inside ``signal.raise_signal``, at that line, before it executes), then runs the
next session of the process, and records in a ``Run`` what the checks need.

Each check is a plain function ``Run -> list[str]`` (the problems; empty: fine), so a
meta-test can run it against a deliberately broken lifecycle and see it fail.

Torch-free runs also hold ``POOL_KIND``, a kind declared here (``declare_pool``): a
process-wide resource whose probe sees it live without torch, so that what an
interrupted session leaves of it must be *reclaimed* by the next session, not merely
forgotten (the built-in kinds' probes read torch only if it is imported, and say
"not alive" in a torch-free run).
"""

from __future__ import annotations

import dis
import linecache
import os
import random
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from types import CodeType, FrameType
from typing import Any

from support.internals import LEFTOVERS, WORKERS, Holdings, Leftover, resolve, serve_code, worker

import lifecycle
from lifecycle import Owner, Session, StaleResource, State, TeardownError, TeardownInterrupted, Trigger
from lifecycle.lowlevel import Handler, Resource, StepKind, declare_resource, undeclare_resource
from lifecycle.testing import RecordingActions, RecordingCheckpoints

PACKAGE_DIR = os.path.dirname(os.path.abspath(lifecycle.__file__)) + os.sep
"""Only frames of files under this directory are traced."""

SIGNALS = (signal.SIGINT, signal.SIGTERM)

DEFAULT_SEED = 20_240_611
"""The seed unless ``LIFECYCLE_FUZZ_SEED`` names another (the double variant's gaps, the samples)."""


def seed() -> int:
    """The fuzzer's seed: ``LIFECYCLE_FUZZ_SEED`` if set, else ``DEFAULT_SEED``."""
    return int(os.environ.get("LIFECYCLE_FUZZ_SEED", DEFAULT_SEED))


# -- a torch-free process-wide resource --------------------------------------------------


class Pool:
    """A process-wide resource without torch (a stand-in for the default group): one open handle, or none."""

    def __init__(self) -> None:
        self.current: object | None = None

    def open(self) -> Owner:
        """Open a handle; ``StaleResource`` if one is open already (an earlier session left it)."""
        if self.current is not None:
            raise StaleResource("fuzz_pool", "already open: left live by an earlier session")
        self.current = _Handle()
        return Owner.SESSION

    def close(self) -> None:
        """Close the handle (a no-op if none is open)."""
        self.current = None

    def is_open(self) -> bool:
        """True while a handle is open."""
        return self.current is not None


class _Handle:
    """The pool's live object (weakly referenceable: a leftover tells it apart from a newer one)."""


POOL = Pool()
CLOSE_POOL = StepKind("fuzz_close_pool")
DROP_POOL = StepKind("fuzz_drop_pool", unblocks=True)
POOL_KIND = Resource(
    "fuzz_pool",
    order=700,  # after the model-parallel state, before the barrier and the group
    success=(CLOSE_POOL,),
    failure=(DROP_POOL,),
    acquired_by=Trigger.INIT_GLOBALS,
    handler=lambda actions: Handler(POOL.open, {CLOSE_POOL: POOL.close, DROP_POOL: POOL.close}),
    probe=POOL.is_open,
    identity=lambda: POOL.current,
)


@contextmanager
def declare_pool() -> Iterator[None]:
    """``POOL_KIND`` declared (and the pool closed afterwards) inside the block only."""
    declare_resource(POOL_KIND)
    try:
        yield
    finally:
        undeclare_resource(POOL_KIND)
        POOL.close()


def drain_leftovers() -> None:
    """Forget every record of ``LEFTOVERS`` (each one's holdings forget it: a meta-test may patch ``take``)."""
    for left in LEFTOVERS.peek():
        left.done()


# -- the tracer --------------------------------------------------------------------------


def with_exits(code: CodeType) -> frozenset[int]:
    """The offsets in ``code`` where a ``with`` statement's normal exit starts (CPython 3.11's bytecode).

    There ``__exit__(None, None, None)`` is about to be called, outside the ``with``'s
    exception handler, and the ``with`` line's event comes a second time. CPython runs
    no signal handler there (it looks for signals at calls, function entries and
    backward jumps), but a tracer that raised there would skip ``__exit__`` (a lock
    would stay held): the tracer holds a signal due there until the next line event,
    as CPython holds it until ``__exit__`` returned.
    """
    found = _WITH_EXITS.get(code)
    if found is None:
        ops = list(dis.get_instructions(code))
        found = frozenset(
            a.offset
            for a, b, c, d in zip(ops, ops[1:], ops[2:], ops[3:], strict=False)
            if all(op.opname == "LOAD_CONST" and op.argval is None for op in (a, b, c))
            and d.opname == "PRECALL"
            and d.arg == 2
        )
        _WITH_EXITS[code] = found
    return found


_WITH_EXITS: dict[CodeType, frozenset[int]] = {}


@dataclass(frozen=True)
class Fired:
    """A signal raised at line event ``index``, in ``region`` (a function's qualified name) at ``line``."""

    index: int
    signum: int
    region: str
    line: str
    final: bool
    """The session was final already when it arrived."""
    route: str
    """Whose handler took it: ``previous`` (the one from before the session), ``session`` (the
    session's own ``install_signal_handlers``) or ``lifecycle`` (any other: the shield's)."""


@dataclass(frozen=True)
class Event:
    """One line event: its region (the function's qualified name) and its source line."""

    region: str
    line: str


class Tracer:
    """Counts line events in lifecycle's frames and raises ``plan[index]`` at each planned index.

    A signal due at a ``with`` statement's exit (see ``with_exits``) is raised at the next
    line event instead; ``Fired.index`` says where it was raised.
    """

    def __init__(self, plan: dict[int, int], route: Callable[[int], str], final: Callable[[], bool]) -> None:
        self.plan, self.route, self.final = plan, route, final
        self.index = 0
        self.events: list[Event] = []
        self.held_back: list[int] = []
        self.fired: list[Fired] = []
        self.record = False
        self._due: list[int] = []
        self._awaited: CodeType | None = None
        self._handled = threading.Event()

    def start(self, record: bool = False) -> None:
        """Trace this thread and the teardown's idle workers from now on; ``record``: keep every event."""
        self.record = record
        WORKERS.prepare()  # the workers a session would start: all traced, even in the first run of a process
        WORKERS.on_idle_workers(lambda: sys.settrace(self._call))
        sys.settrace(self._call)

    @staticmethod
    def stop() -> None:
        """Stop tracing this thread and the idle workers."""
        sys.settrace(None)
        WORKERS.on_idle_workers(lambda: sys.settrace(None))

    def _call(self, frame: FrameType, event: str, arg: object) -> Any:
        code = frame.f_code
        if self._awaited is not None and code is self._awaited and threading.current_thread() is MAIN:
            self._handled.set()  # the handler of the signal a worker sent runs now, on the main thread
        if not code.co_filename.startswith(PACKAGE_DIR) or code is _SERVE or code.co_filename == WORKER_FILE:
            return None  # the wait loop's slices come as often as the clock says: not counted
        return self._line

    def _line(self, frame: FrameType, event: str, arg: object) -> Any:
        if event != "line":
            return self._line
        index = self.index
        self.index += 1
        at_exit = frame.f_lasti in with_exits(frame.f_code)
        if self.record:
            self.events.append(Event(frame.f_code.co_qualname, _source(frame)))
            if at_exit:
                self.held_back.append(index)
        signum = self.plan.get(index)
        if signum is not None:
            self._due.append(signum)
        while self._due and not at_exit:
            signum = self._due.pop(0)
            fired = Fired(index, signum, frame.f_code.co_qualname, _source(frame), self.final(), self.route(signum))
            self.fired.append(fired)
            if threading.current_thread() is MAIN:
                signal.raise_signal(signum)  # its handler runs here; if it raises, so does this line (tracing stops)
            else:  # a teardown's worker: the main thread, waiting for it, runs the handler, as for a real Ctrl-C
                self._send_to_main(signum)
        return self._line

    def _send_to_main(self, signum: int) -> None:
        """Send ``signum`` to the main thread and wait until its Python handler started there (bounded)."""
        self._awaited, self._handled = _handler_code(signal.getsignal(signum)), threading.Event()
        assert MAIN.ident is not None
        signal.pthread_kill(MAIN.ident, signum)
        self._handled.wait(HANDLER_WAIT_S if self._awaited is not None else 0.05)
        self._awaited = None


HANDLER_WAIT_S = 5.0
"""The longest a worker that sent a signal waits for the main thread's handler to start."""

MAIN = threading.main_thread()
_SERVE = serve_code
WORKER_FILE = worker.__file__
"""The wait machinery's frames (``_serve``, ``lifecycle._core.worker``) are not traced: how often they run is timing."""


def _handler_code(handler: object) -> CodeType | None:
    """The code object a Python signal handler runs first (a function, a bound method, a callable object)."""
    call = vars(type(handler)).get("__call__")  # a callable object's method (a lifecycle Link)
    for candidate in (handler, getattr(handler, "__func__", None), call):
        code = getattr(candidate, "__code__", None)
        if isinstance(code, CodeType):
            return code
    return None


def _source(frame: FrameType) -> str:
    return linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()


# -- scenarios and cases -----------------------------------------------------------------


class Scenario(StrEnum):
    """The teardown fuzzed."""

    FAIL = "fail"
    """``session.fail(error)`` from ``training``."""
    CLOSE = "close"
    """``session.close()`` from ``finalizing``: the success plan."""
    CLOSE_FAULTY = "close_faulty"
    """``session.close()`` whose user release ``bad`` raises: the success plan stops there, the failure plan runs."""


class Variant(StrEnum):
    """The signals raised."""

    SIGINT = "sigint"
    SIGTERM = "sigterm"
    DOUBLE = "double"
    """SIGINT at N, and again at N + k."""


@dataclass(frozen=True)
class Case:
    """One fuzzed run: which teardown, which signals, at which line events."""

    scenario: Scenario
    variant: Variant
    at: int
    gap: int = 0
    """k of the double variant."""

    @property
    def plan(self) -> dict[int, int]:
        """Line event index → signal."""
        if self.variant is Variant.DOUBLE:
            return {self.at: signal.SIGINT, self.at + self.gap: signal.SIGINT}
        return {self.at: signal.SIGTERM if self.variant is Variant.SIGTERM else signal.SIGINT}

    def __str__(self) -> str:
        return f"{self.scenario}/{self.variant}@{self.at}" + (f"+{self.gap}" if self.gap else "")


class FaultyRelease(RuntimeError):
    """What the user release ``bad`` raises in the ``close_faulty`` scenario."""


Actions = Callable[[list[str]], Any]
"""Makes the ``DistributedActions`` of a session, given the call log it is to share."""


def recording(calls: list[str]) -> RecordingActions:
    """The torch-free actions: a ``RecordingActions`` appending to ``calls``."""
    return RecordingActions(calls=calls)


@dataclass
class Built:
    """A session ready for its teardown, its call log, and the SIGTERM handler its ``install_signal_handlers`` set."""

    session: Session
    calls: list[str]
    own_handler: object
    error: BaseException | None


def build(scenario: Scenario, actions: Actions) -> Built:
    """A session in ``training`` with two user resources, tracked checkpoints and its signal handlers installed.

    For the close scenarios it is then finished (``finalizing``); in ``close_faulty`` the
    user resource ``bad`` raises ``FaultyRelease`` when released.
    """
    calls: list[str] = []
    session = Session(actions(calls), label="fuzzed")
    session.init_distributed()
    session.init_globals()
    session.start_training()
    session.register("good", lambda: calls.append("release:good"))

    def bad() -> None:
        calls.append("release:bad")
        if scenario is Scenario.CLOSE_FAULTY:
            raise FaultyRelease("bad")

    session.register("bad", bad)
    session.track_checkpoints(RecordingCheckpoints(calls=calls))
    session.install_signal_handlers()  # SIGTERM is a requested exit until the teardown restores the handler
    own = signal.getsignal(signal.SIGTERM)
    if scenario is not Scenario.FAIL:
        session.finish()
    return Built(session, calls, own, RuntimeError("injected") if scenario is Scenario.FAIL else None)


def teardown(built: Built) -> None:
    """The fuzzed call: ``fail(error)`` or ``close()``."""
    if built.error is not None:
        built.session.fail(built.error)
    else:
        built.session.close()


@dataclass(frozen=True)
class Lines:
    """The line events of one teardown, in order, and the indices of those at a ``with`` statement's exit."""

    events: tuple[Event, ...]
    held_back: frozenset[int]

    @property
    def targets(self) -> list[int]:
        """The indices a signal is raised at as planned (one due at a ``with`` exit would wait for the next)."""
        return [index for index in range(len(self.events)) if index not in self.held_back]

    def find(self, region: str, line: str, after: int = -1) -> int:
        """The index of the first event at ``line`` of ``region`` after ``after``; ``LookupError`` if none."""
        for index in range(after + 1, len(self.events)):
            if self.events[index] == Event(region, line):
                return index
        raise LookupError(f"no line event {line!r} in {region} after index {after}: did lifecycle change?")


def count_lines(scenario: Scenario, actions: Actions = recording) -> Lines:
    """The line events of ``scenario``'s teardown and bookkeeping, with no signal raised (it ends clean)."""
    drain_leftovers()
    with kept_handlers():
        built = build(scenario, actions)
        tracer = Tracer({}, lambda signum: "", lambda: built.session.state.is_final)
        try:
            tracer.start(record=True)
            try:
                teardown(built)
            finally:
                tracer.stop()
        except TeardownError:
            pass  # close_faulty raises it, once every line was counted
    return Lines(tuple(tracer.events), frozenset(tracer.held_back))


@contextmanager
def kept_handlers() -> Iterator[None]:
    """SIGINT/SIGTERM's handlers put back as they were when the block ends, whatever it left."""
    original = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in original.items():
            signal.signal(signum, handler)


def cases(scenario: Scenario, lines: Lines, rng: random.Random, *, max_gap: int = 60) -> list[Case]:
    """Every target line event × every variant; the double variant's gap k drawn from ``rng`` (1..``max_gap``)."""
    out = []
    for at in lines.targets:
        out.append(Case(scenario, Variant.SIGINT, at))
        out.append(Case(scenario, Variant.SIGTERM, at))
        out.append(Case(scenario, Variant.DOUBLE, at, rng.randint(1, max_gap)))
    return out


# -- a run -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """The handler from before the session ran for ``signum``; the session's state then."""

    signum: int
    state: State


@dataclass
class Next:
    """What the next session of the process did."""

    reached: State | None = None
    """``training`` once it got there."""
    state: State | None = None
    raised: BaseException | None = None
    held: tuple[str, ...] = ()
    reclaimed: tuple[str, ...] = ()
    """The kind of each reclaim step it ran."""
    reclaim_errors: tuple[str, ...] = ()
    leftovers: tuple[str, ...] = ()
    """What ``LEFTOVERS`` still records once it is final."""
    owners: dict[str, Owner] = field(default_factory=dict)
    handlers_restored: bool = True
    alive: dict[str, bool] = field(default_factory=dict)
    """What a probe of the world says once it is final (all False: nothing left)."""


@dataclass
class Run:
    """Everything one fuzzed case left to check."""

    case: Case
    session: Session
    calls: list[str]
    error: BaseException | None
    """What ``fail`` was given (None: ``close``)."""
    raised: BaseException | None
    """What reached the caller of ``fail`` / ``close``."""
    fired: list[Fired]
    deliveries: list[Delivery]
    handlers_restored: bool
    left: tuple[Leftover, ...]
    """``LEFTOVERS.peek()`` right after the fuzzed session."""
    live_left: tuple[str, ...]
    """The kinds of ``left`` whose object was still live (``Leftover.is_live``)."""
    killed: list[int]
    """Signals whose default action (terminate) lifecycle invoked on this process (intercepted)."""
    lock_held: bool
    """An interrupt left ``LEFTOVERS``' lock held (every later session would hang)."""
    dist_initialized: bool | None = None
    """Real runs: ``torch.distributed.is_initialized()`` right after the fuzzed session."""
    next: Next = field(default_factory=Next)

    def __str__(self) -> str:
        fired = ", ".join(f"{signal.Signals(f.signum).name}@{f.index} in {f.region} ({f.line!r})" for f in self.fired)
        return f"{self.case} [{fired or 'nothing fired'}] → {self.session.state}, raised {self.raised!r}"


def follow(scenario: Scenario, actions: Actions, world: Callable[[], dict[str, bool]]) -> Next:
    """The next session: to ``training``, then ``fail`` (after the fail scenario) or finish and ``close``."""
    out = Next()
    before = {s: signal.getsignal(s) for s in SIGNALS}
    session = Session(actions([]), label="next")
    try:
        session.init_distributed()
        session.init_globals()
        session.start_training()
        out.reached = session.state
        if scenario is Scenario.FAIL:
            session.fail(RuntimeError("the next session fails too"))
        else:
            session.finish()
            session.close()
    except BaseException as exc:  # noqa: BLE001 - recorded: check_next names it
        out.raised = exc
        if not session.state.is_final:
            session.fail(exc)
    out.state = session.state
    out.held = tuple(str(e) for e in session.ledger.held())
    out.reclaimed = tuple(r.step.entry.resource.value for r in session.reclaimed)
    out.reclaim_errors = tuple(f"{r.step}: {r.error!r}" for r in session.reclaimed if r.error is not None)
    out.leftovers = tuple(f"{left.entry} by {left.session}" for left in LEFTOVERS.peek())
    out.owners = {e.resource.value: e.owner for e in session.ledger.entries}
    out.handlers_restored = {s: signal.getsignal(s) for s in SIGNALS} == before
    out.alive = world()
    return out


def pool_world() -> dict[str, bool]:
    """What is alive in a torch-free run: the pool."""
    return {"fuzz_pool": POOL.is_open()}


class _Surroundings:
    """What surrounds the fuzzed session in the process: the handlers from before it, and ``os.kill``."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.killed: list[int] = []
        self.session: Session | None = None
        self.handler = self._previous  # one object: handlers are compared by identity
        self._kill = os.kill

    def _previous(self, signum: int, frame: FrameType | None) -> None:
        """The handler from before the session: records, and for SIGINT raises as Python's own does."""
        self.deliveries.append(Delivery(signum, self.session.state if self.session else State.UNINITIALIZED))
        if signum == signal.SIGINT:
            raise KeyboardInterrupt

    def install(self) -> None:
        """Make ``handler`` SIGINT's and SIGTERM's handler."""
        for signum in SIGNALS:
            signal.signal(signum, self.handler)

    @contextmanager
    def intercepting_kill(self) -> Iterator[None]:
        """``os.kill`` of this process with a SIG_DFL signal is recorded, not done (it would end the test run)."""

        def default_action(pid: int, signum: int) -> None:
            if pid == os.getpid() and signum in SIGNALS and signal.getsignal(signum) == signal.SIG_DFL:
                self.killed.append(signum)
                signal.signal(signum, self.handler)
                return
            self._kill(pid, signum)

        os.kill = default_action
        try:
            yield
        finally:
            os.kill = self._kill


def run_case(
    case: Case,
    actions: Actions = recording,
    *,
    world: Callable[[], dict[str, bool]] = pool_world,
    is_initialized: Callable[[], bool] | None = None,
) -> Run:
    """Run ``case`` on a fresh session, then the next session; SIGINT/SIGTERM's handlers are restored whatever happens.

    Before the session starts, each signal's handler is a recorder (the "previous
    handler"; for SIGINT it raises ``KeyboardInterrupt`` as Python's does). ``world``:
    what is alive once the next session is final; ``is_initialized``: whether the default
    group exists right after the fuzzed session (real runs).
    """
    drain_leftovers()
    around = _Surroundings()
    with kept_handlers(), around.intercepting_kill():
        around.install()
        built = build(case.scenario, actions)
        around.session = built.session

        def route(signum: int) -> str:
            handler = resolve(signal.getsignal(signum))  # a deactivated handler of lifecycle's only passes it on
            return (
                "previous"
                if handler is around.handler
                # an ended link (its session's restore already ran) passes the signal on: it is not the session's
                else "session"
                if handler is built.own_handler and getattr(handler, "active", True)
                else "lifecycle"
            )

        tracer = Tracer(case.plan, route, lambda: built.session.state.is_final)
        raised: BaseException | None = None
        try:
            tracer.start()
            try:
                teardown(built)
            finally:
                tracer.stop()
        except BaseException as exc:  # noqa: BLE001 - what reached the caller is the result
            raised = exc
        restored = all(signal.getsignal(s) is around.handler for s in SIGNALS)
        lock_held = not _unlocked(built.session.holdings)
        left = LEFTOVERS.peek()
        live = tuple(item.entry.resource.value for item in left if item.is_live())
        run = Run(
            case, built.session, built.calls, built.error, raised, tracer.fired, around.deliveries, restored, left,
            live, around.killed, lock_held,
        )  # fmt: skip
        if is_initialized is not None:
            run.dist_initialized = is_initialized()
        around.install()  # the next session starts from the process's handlers, whatever this one left
        run.next = follow(case.scenario, actions, world)
        return run


def _unlocked(holdings: Holdings) -> bool:
    """True if the holdings' lock is free; if an interrupt left it held, free it (so the run goes on) and say so."""
    lock = holdings._lock
    if lock.acquire(blocking=False):
        lock.release()
        return True
    lock.release()
    return False


# -- the checks: Run -> problems ---------------------------------------------------------


def check_final(run: Run) -> list[str]:
    """The session is final; its journal's last entry is that move (its only one into a final state).

    And ``closed`` means clean: nothing held, nothing abandoned, no interrupt kept back.
    """
    session = run.session
    if not session.state.is_final:
        return [f"left live in {session.state}"]
    journal, problems = session.journal, []
    last = journal[-1] if journal else None
    if last is None or last.dest is not session.state or last.trigger not in (Trigger.FAIL, Trigger.CLOSE):
        problems.append(
            f"the journal ends {last and (last.source.value, last.dest.value)}, not the move to {session.state}"
        )
    finals = sum(1 for entry in journal if entry.dest.is_final)
    if finals != 1:
        problems.append(f"{finals} journal entries into a final state")
    report = session.report
    if session.state is State.CLOSED:
        if session.ledger.held():
            problems.append(f"closed, yet holds {', '.join(map(str, session.ledger.held()))}")
        if report is not None and (report.abandoned or report.interrupted is not None):
            problems.append(f"closed, yet its report abandoned {len(report.abandoned)} step(s): {report.interrupted!r}")
    return problems


def check_ledger(run: Run) -> list[str]:
    """What the ledger still holds is exactly what the report abandoned, plus entries whose release raised."""
    session, report = run.session, run.session.report
    held = {e.key: e for e in session.ledger.held()}
    abandoned = {step.entry.key: step for step in (report.abandoned if report is not None else ())}
    running = {step.entry.key for step in (report.left_running if report is not None else ())}
    failed = set(session.ledger.failed)
    problems = [
        f"{entry} still held, neither abandoned nor released with an error"
        for key, entry in held.items()
        if key not in abandoned and key not in failed and key not in running
    ]
    problems += [
        f"abandoned {step}, yet {step.entry} is released" for key, step in abandoned.items() if key not in held
    ]
    return problems


def check_interrupts(run: Run) -> list[str]:
    """Every interrupt reaches the caller once, never before the session is final; two in one teardown escalate.

    No signal reaches the previous handler while the session is live, and none goes to
    its default action. SIGINT: the caller gets a ``KeyboardInterrupt``; a single one
    reaches the previous handler exactly once; two that both arrive before the session
    is final escalate (``TeardownInterrupted``, the previous handler never runs); in any
    case the previous handler runs at least once unless the pair escalated, and never
    more often than signals were raised. SIGTERM is seen exactly once, as the session's
    own requested exit (its handler was installed then) or by the previous handler,
    and the caller gets what it gets without a signal.
    """
    problems = [f"{signal.Signals(n).name} went to its default action: the process would have died" for n in run.killed]
    if run.lock_held:
        problems.append("an interrupt left the holdings' lock held: every later session would hang")
    if not run.fired:
        return [*problems, "no signal was raised: the case's line event never came"]
    problems += [
        f"{signal.Signals(d.signum).name} reached the previous handler while the session was {d.state}"
        for d in run.deliveries
        if not d.state.is_final
    ]
    sigint = [f for f in run.fired if f.signum == signal.SIGINT]
    if sigint:
        delivered = sum(1 for d in run.deliveries if d.signum == signal.SIGINT)
        escalated = isinstance(run.raised, TeardownInterrupted)
        during = [f for f in sigint if not f.final and f.route != "previous"]
        if not isinstance(run.raised, KeyboardInterrupt):
            problems.append(f"{len(sigint)} SIGINT(s), yet the caller got {run.raised!r}")
        if len(sigint) == 1 and (delivered != 1 or escalated):
            problems.append(f"one SIGINT reached the previous handler {delivered} time(s), escalated: {escalated}")
        if len(during) >= 2 and (not escalated or delivered):
            problems.append(f"two SIGINTs during the teardown: escalated {escalated}, delivered {delivered} time(s)")
        if len(sigint) >= 2 and not escalated and not 1 <= delivered <= len(sigint):
            problems.append(f"{len(sigint)} SIGINTs reached the previous handler {delivered} time(s)")
    sigterm = [f for f in run.fired if f.signum == signal.SIGTERM]
    for fired in sigterm:
        delivered = sum(1 for d in run.deliveries if d.signum == signal.SIGTERM) + len(run.killed)
        requested = run.session.exit_requested == "SIGTERM"
        if fired.route == "session":
            if not requested or delivered:
                problems.append(f"SIGTERM to the session's handler: exit requested {requested}, delivered {delivered}")
            if run.error is not None and getattr(run.error, "requested_exit", None) != "SIGTERM":
                problems.append("SIGTERM requested an exit during fail(), yet error.requested_exit does not say so")
        elif delivered != 1 or requested:
            problems.append(f"SIGTERM ({fired.route}) delivered {delivered} time(s), exit requested {requested}")
        expected = TeardownError if run.case.scenario is Scenario.CLOSE_FAULTY else type(None)
        if not isinstance(run.raised, expected):
            problems.append(f"SIGTERM changed what the caller got: {run.raised!r}")
    return problems


def check_cause(run: Run) -> list[str]:
    """``fail()``: as documented, a deferred Ctrl-C reaches the caller as ``KeyboardInterrupt`` from the error.

    Only when the last SIGINT was deferred (the shield took it): one that arrives once the
    shield is gone is an ordinary Ctrl-C after the session ended, raised where it lands.
    """
    sigints = [fired for fired in run.fired if fired.signum == signal.SIGINT]
    if sigints and sigints[-1].route == "previous":
        return []
    if run.error is None or type(run.raised) is not KeyboardInterrupt or run.raised.__cause__ is run.error:
        return []
    return [f"the deferred KeyboardInterrupt is raised from {run.raised.__cause__!r}, not from the original error"]


def check_handlers(run: Run) -> list[str]:
    """Once the session is final, SIGINT and SIGTERM have the handlers they had before it."""
    return [] if run.handlers_restored else ["a SIGINT/SIGTERM handler is still changed after the session ended"]


def check_leftovers(run: Run) -> list[str]:
    """``LEFTOVERS`` names exactly what the session left held of its process-wide kinds (acquired by a trigger).

    A step the session left running on its worker may end either way (it was recorded while it ran).
    """
    report = run.session.report
    running = {step.entry.resource.value for step in (report.left_running if report is not None else ())}
    recorded = {
        (left.entry.resource.value, left.session_id) for left in run.left if left.entry.resource.value not in running
    }
    wanted = {
        (e.resource.value, run.session.id)
        for e in run.session.ledger.held()
        if e.resource.acquired_by is not None and e.owner is not Owner.CALLER and e.resource.value not in running
    }
    problems = [f"left {kind} held, not recorded in LEFTOVERS" for kind, _ in sorted(wanted - recorded)]
    problems += [f"LEFTOVERS records {kind} of session {sid}, not left held" for kind, sid in sorted(recorded - wanted)]
    return problems


def check_next(run: Run) -> list[str]:
    """The next session reaches ``training``, ends cleanly, reclaims what was left live, and leaves nothing."""
    nxt, problems = run.next, []
    expected = State.FAILED if run.case.scenario is Scenario.FAIL else State.CLOSED
    if nxt.reached is not State.TRAINING:
        problems.append(f"the next session did not reach training: {nxt.raised!r}")
    elif nxt.raised is not None:
        problems.append(f"the next session raised {nxt.raised!r}")
    if nxt.state is not expected:
        problems.append(f"the next session ended {nxt.state}, not {expected}")
    if nxt.held:
        problems.append(f"the next session still holds {', '.join(nxt.held)}")
    problems += [f"a reclaim step failed: {error}" for error in nxt.reclaim_errors]
    reclaimed, left = set(nxt.reclaimed), {item.entry.resource.value for item in run.left}
    if set(run.live_left) - reclaimed:
        problems.append(f"left live {sorted(set(run.live_left) - reclaimed)}, not reclaimed by the next session")
    if reclaimed - left:
        problems.append(f"the next session reclaimed {sorted(reclaimed - left)}, which nothing left")
    if nxt.leftovers:
        problems.append(f"LEFTOVERS still records {', '.join(nxt.leftovers)} after the next session")
    adopted = sorted(kind for kind, owner in nxt.owners.items() if owner is Owner.CALLER)
    if adopted:
        problems.append(f"the next session adopted {adopted} as the caller's")
    alive = sorted(name for name, up in nxt.alive.items() if up)
    if alive:
        problems.append(f"still alive after the next session: {alive}")
    if not nxt.handlers_restored:
        problems.append("the next session left a SIGINT/SIGTERM handler changed")
    return problems


def check_no_barrier_after_failure(run: Run) -> list[str]:
    """No barrier runs after a success step failed (the failure plan takes over, and it has none)."""
    report, problems = run.session.report, []
    records = report.records if report is not None else ()
    failed_at = next((i for i, r in enumerate(records) if r.error is not None and r.outcome == "success"), None)
    if failed_at is not None:
        late = [str(r.step) for r in records[failed_at + 1 :] if r.step.kind is StepKind.BARRIER]
        if late:
            problems.append(f"barrier ran after the failed success step {records[failed_at].step}")
    bad = run.calls.index("release:bad") if "release:bad" in run.calls else len(run.calls)
    if run.case.scenario is Scenario.CLOSE_FAULTY and "barrier" in run.calls[bad:]:
        problems.append("the barrier was called after the user release that raised")
    return problems


def check_group(run: Run) -> list[str]:
    """Real runs: the default group is gone, or the next session reclaimed it and created its own (not the caller's)."""
    if not run.dist_initialized:
        return []
    problems = []
    if "process_group" not in run.next.reclaimed:
        problems.append("the default group was left initialized and the next session did not reclaim it")
    if run.next.owners.get("process_group") is not Owner.SESSION:
        problems.append(f"the next session's process_group owner is {run.next.owners.get('process_group')}")
    return problems


CHECKS: tuple[Callable[[Run], list[str]], ...] = (
    check_final,
    check_ledger,
    check_interrupts,
    check_cause,
    check_handlers,
    check_leftovers,
    check_next,
    check_no_barrier_after_failure,
)
"""Every check of a torch-free run."""

REAL_CHECKS: tuple[Callable[[Run], list[str]], ...] = (*CHECKS, check_group)
"""Every check of a run on real gloo."""


def problems_of(run: Run, checks: Sequence[Callable[[Run], list[str]]] = CHECKS) -> dict[str, list[str]]:
    """The problems each check finds in ``run``, by check name (only checks that found some)."""
    found = {check.__name__: check(run) for check in checks}
    return {name: problems for name, problems in found.items() if problems}


def hits(runs: Sequence[Run]) -> Counter[str]:
    """How many fuzzed cases raised their first signal in each region."""
    return Counter(run.fired[0].region if run.fired else "(none fired)" for run in runs)
