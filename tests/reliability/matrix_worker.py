"""One rank of the fault matrix: a long-lived process that runs cells sent by the driver.

Everything is real (gloo groups, megatron-core globals, async checkpoints, NVRx's
Wrapper, ``pretrain``). Faults go in through public seams only: ``FaultyActions`` wraps
the ``DistributedActions`` a session is given (the init faults, the success-plan faults
at the globals' destroy, the barrier and the group's destroy, and the teardown-step
fault), the public ``model_provider`` / ``batch_provider`` / callback hooks (setup, step,
eval, callback faults, and a user resource registered through the hooks' ``SessionHandle``
for the success-teardown fault), and ``AsyncCheckpointer``'s public ``save`` / ``finalize``
(the checkpoint faults, at training time and in the success plan). ``Session.close`` is
wrapped only to know when the success plan runs. The path is observed by wrapping
torch.distributed's public collectives. Each cell reports a list of problems: empty
means what this rank observed matches ``expected(cell)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for support

import torch
import torch.distributed as dist
from megatron.core import num_microbatches_calculator as microbatches
from megatron.core import parallel_state
from megatron.core import rerun_state_machine as rerun
from reliability.expected import (
    ERROR_OR_RESULT,
    GLOBALS,
    ORIGINAL,
    REFUSAL,
    RESTART,
    SOME_ERROR,
    TEARDOWN_ERROR,
    WRAPPER_STOPS,
    Expectation,
    RankOutcome,
    expected,
)
from reliability.matrix_cells import Cell
from reliability.nvrx_order import NvrxOrderGate
from support.configs import FAST, GROUP_TIMEOUT_S
from support.probes import TORCH_COLLECTIVES, alive
from support.torch_internals import SyntheticTokens  # the default batches: pretrain's own provider

from lifecycle import (
    Callback,
    CheckpointConfig,
    DistributedConfig,
    ExitConfig,
    ForeignResource,
    ModelConfig,
    Owner,
    ParallelConfig,
    PretrainConfig,
    PretrainResult,
    Session,
    SessionHandle,
    StaleResource,
    State,
    TeardownError,
    TorchActions,
    TrainingConfig,
    pretrain,
)
from lifecycle.checkpoint import AsyncCheckpointer
from lifecycle.lowlevel import DistributedActions, Handler, Resource, StepKind
from lifecycle.restart import SessionAbort, SessionFinalize, wrapped_pretrain
from lifecycle.testing import release_everything
from lifecycle.testing.doubles import acquire_name

CELL_LIMIT_S = 8.0
"""A cell must finish well inside the group timeout: nothing waited for a peer that is gone."""
ABORT_BOUND_S = 2.0
"""A main-thread collective under way when an abort starts (or started before the main
thread learns of the failure) must end within this of the abort's start: the abort
unblocks it. Far under the group timeout, far over an abort's tens of milliseconds."""
TEARDOWN_FAULT = "injected teardown fault"
RELEASED_BY = {  # each release action of DistributedActions, and the init whose resource it releases
    "destroy_rerun_state_machine": "init_rerun_state_machine",
    "destroy_microbatch_calculator": "init_microbatch_calculator",
    "destroy_model_parallel": "init_model_parallel",
    "abort_model_parallel": "init_model_parallel",
    "destroy_process_group": "init_process_group",
    "abort_process_group": "init_process_group",
    "close_store": "init_store",
}


@contextlib.contextmanager
def patched(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """Replace the public ``owner.name`` by ``make(original)`` for the duration of the block."""
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


class Probe:
    """This rank's injection and observation for one cell.

    The failure path opens when the main thread learns of the failure: our fault fires,
    a collective it runs raises (a peer's failure reached this rank), a session's
    ``fail()`` or the Wrapper's finalize starts, or it aborts the group itself. It closes
    at the next session's ``init_store`` or the end of the run. A collective the main
    thread starts while it is open is a violation, and so is one that any other thread
    starts then (the failure plan runs on a helper thread). (A failed success-plan step switches
    ``close()`` to the failure plan without ``fail()``: the fault that failed the step
    opened the path already, so the barrier, or any collective, after it is a violation.)

    An abort that starts in another thread (NVRx's monitor thread: it interrupts the main
    thread only afterwards) does not open the path: the main thread may still run
    training collectives until it learns. But every main-thread collective under way
    once the abort started must end within ``ABORT_BOUND_S`` of that start, and a
    collective in the aborting thread during the abort is a violation.
    """

    def __init__(self, cell: Cell, rank: int, gate: NvrxOrderGate | None = None) -> None:
        self.cell = cell
        self.expect = expected(cell)
        self.armed = rank in self.expect.fault_ranks
        self.error: BaseException = {
            "exception": RuntimeError(f"injected at {cell.point}"),
            "keyboard_interrupt": KeyboardInterrupt(f"injected at {cell.point}"),
            "system_exit": SystemExit(f"requested exit ended with sys.exit() at {cell.point}"),
            "teardown_step": RuntimeError(f"injected at {cell.point}"),
        }.get(cell.raised, RuntimeError("never raised: the configuration is refused"))
        self.fired = False
        self.teardown_fired = False
        self.failing = False
        """The main thread learned of the failure: the failure path is open."""
        self.abort_at: float | None = None
        """When an abort started in another thread (monotonic), until the path closes."""
        self.abort_thread: int | None = None
        """The thread running that abort, while it runs."""
        self.window: list[str] = []
        """Main-thread collectives started after such an abort started, before the path opened."""
        self.gate = None if self.armed else gate  # the order NVRx takes on a peer of the failing rank
        self.running = False
        self.closing = False  # True while a session's close() runs
        self.actions: list[FaultyActions] = []
        self.registered: list[SessionHandle] = []
        self.failures: list[BaseException] = []
        self.violations: list[str] = []

    def fire(self, point: str) -> None:
        """Raise the cell's error if ``point`` is the cell's point, armed here, and not fired yet."""
        if point == self.cell.point and self.armed and not self.fired:
            self.fired = True
            self.failing = True
            raise self.error

    def fire_in_success_plan(self, point: str) -> None:
        """``fire(point)``, but only while ``close()`` runs its success plan.

        That is: a session is in ``finalizing``, inside ``close()``, and the failure path
        is not open (the failure plan that a failed success step switches to, or a
        ``fail()``, runs the same releases: they must not fire it). ``pretrain`` also
        commits the last save in ``finalizing``, before ``close()``: not a success step.
        """
        if self.closing and not self.failing:
            self.fire(point)

    def watch_close(self, stack: contextlib.ExitStack) -> None:
        """Know, for the duration of ``stack``, when a session's ``close()`` runs (any session: the Wrapper's too)."""

        def make(close: Any) -> Any:
            def watched(session: Session) -> Any:
                self.closing = True
                try:
                    return close(session)
                finally:
                    self.closing = False

            return watched

        stack.enter_context(patched(Session, "close", make))

    def watch_restart(self, stack: contextlib.ExitStack) -> None:
        """Know, for the duration of ``stack``, when a session's ``fail()`` or the Wrapper's abort or finalize runs."""

        def make_fail(fail: Any) -> Any:
            def watched(session: Session, error: BaseException) -> Any:
                if threading.current_thread() is threading.main_thread():
                    self.failing = True
                return fail(session, error)

            return watched

        def make_abort(abort: Any) -> Any:
            def watched(action: Any, state: Any) -> Any:
                if threading.current_thread() is threading.main_thread():
                    self.failing = True
                    return abort(action, state)
                if self.abort_at is None:
                    self.abort_at = time.monotonic()
                self.abort_thread = threading.get_ident()
                try:
                    return abort(action, state)
                finally:
                    self.abort_thread = None

            return watched

        def make_finalize(finalize: Any) -> Any:
            def watched(action: Any, state: Any) -> Any:
                self.failing = True  # in the main thread: it knows the attempt failed
                return finalize(action, state)

            return watched

        stack.enter_context(patched(Session, "fail", make_fail))
        stack.enter_context(patched(SessionAbort, "__call__", make_abort))
        stack.enter_context(patched(SessionFinalize, "__call__", make_finalize))

    def path_closed(self) -> None:
        """The next session starts: the previous one's failure path, and any abort of it, are over."""
        self.failing = False
        self.abort_at = None

    def released(self) -> None:
        """After each release the actions perform: raise the teardown fault from the first one on the failure path."""
        if self.cell.raised == "teardown_step" and self.fired and self.failing and not self.teardown_fired:
            self.teardown_fired = True
            raise OSError(TEARDOWN_FAULT)

    def make_actions(self, inner: DistributedActions) -> DistributedActions:
        """The actions of a new session: ``inner``, with this cell's faults."""
        actions = FaultyActions(inner, self)
        self.actions.append(actions)
        return actions

    def watch(self, stack: contextlib.ExitStack) -> None:
        """Watch torch.distributed's collectives for the duration of ``stack``."""
        for module in (dist, dist.distributed_c10d):
            for name in TORCH_COLLECTIVES:
                if hasattr(module, name):
                    stack.enter_context(patched(module, name, self._watched(name)))

    def _watched(self, name: str) -> Callable[[Any], Any]:
        def make(collective: Any) -> Any:
            def watched(*args: Any, **kwargs: Any) -> Any:
                if not self.running:
                    return collective(*args, **kwargs)
                thread = threading.current_thread()
                if thread is not threading.main_thread():
                    # A teardown step on a helper thread, or the Wrapper's abort in its monitor thread.
                    if self.failing or threading.get_ident() == self.abort_thread:
                        where = "the abort" if threading.get_ident() == self.abort_thread else f"thread {thread.name}"
                        self.violations.append(f"{name} in {where}")
                    return collective(*args, **kwargs)
                if self.failing:
                    self.violations.append(name)
                elif self.abort_at is not None:
                    self.window.append(name)
                if self.gate is not None:
                    self.gate.at_collective()
                start = time.monotonic()
                try:
                    result = collective(*args, **kwargs)
                    if self.gate is not None:
                        self.gate.after_collective()
                    return result
                except BaseException:
                    self.failing = True
                    raise
                finally:
                    self._bounded(name, start)

            return watched

        return make

    def _bounded(self, name: str, start: float) -> None:
        """A violation if collective ``name``, started at ``start``, ended too long after an abort started."""
        end, abort_at = time.monotonic(), self.abort_at
        if abort_at is not None and end - max(start, abort_at) > ABORT_BOUND_S:
            began, late = start - abort_at, end - abort_at
            self.violations.append(
                f"{name} (started {began:+.2f} s) ended {late:.1f} s after the abort started (bound {ABORT_BOUND_S} s)"
            )

    def callback(self) -> Callback:
        """A callback that fires at its hook when that is the cell's point, and records each run's session handle."""
        probe = self

        class Faulty(Callback):
            def __getattribute__(self, name: str) -> Any:
                if not name.startswith("on_"):
                    return object.__getattribute__(self, name)

                def hook(session: SessionHandle, *args: Any) -> None:
                    probe.seen(session)
                    probe.fire(name)

                return hook

        return Faulty()

    def seen(self, session: SessionHandle) -> None:
        """A hook ran with ``session``, the handle of the latest actions' session (sessions run one after another).

        Under in-process restart the wrapper builds the session, so the handle is all this
        probe gets of it; ``check`` reads only its final ``state``.
        """
        latest = self.actions[-1]
        if latest.session is None:
            latest.session = session
        if self.cell.point == "success_teardown" and session not in self.registered:
            self.registered.append(session)
            # Released by every plan; raises the cell's error only on the success plan.
            session.register("matrix", lambda: session.state is State.FINALIZING and self.fire("success_teardown"))

    def model_provider(self, config: PretrainConfig) -> torch.nn.Module:
        """The default model, unless the fault is due in setup."""
        self.fire("setup")
        from support.torch_internals import default_model_provider  # pretrain's own default

        return default_model_provider(config)

    def batch_provider(self, config: PretrainConfig) -> Callable[[str, int], Any]:
        """The default batches; raises at the first batch of train step 2, or of the first evaluation.

        One micro-batch per step per data-parallel rank (the defaults: ``micro_batch_size``
        1, ``global_batch_size`` None): train step ``s`` reads indices
        ``(s - 1) * world .. s * world - 1``.
        """
        data = SyntheticTokens(config.model, config.parallel.micro_batch_size, config.training.seed)
        world = self.cell.world_size

        def batch(split: str, index: int) -> Any:
            if split == "train" and index >= world:
                if self.gate is not None:
                    self.gate.at_batch()
                self.fire("step")
            if split == "eval":
                self.fire("eval")
            return data.batch(split, index)

        return batch

    def checkpointer_faults(self, stack: contextlib.ExitStack) -> None:
        """A checkpointer method raises, when the cell's point is there (public methods only).

        ``checkpoint_save`` / ``checkpoint_finalize``: the first save / the first finalize
        (the commit of step 1's save, in train step 2). ``success_finalize_checkpoints``:
        the finalize that the success plan's ``finalize_checkpoints`` step calls in
        ``close()`` (with nothing in flight there: ``pretrain`` committed the last save
        before ``close()``).
        """
        faults = {
            "checkpoint_save": ("save", self.fire),
            "checkpoint_finalize": ("finalize", self.fire),
            "success_finalize_checkpoints": ("finalize", self.fire_in_success_plan),
        }
        if self.cell.point in faults:
            name, fire = faults[self.cell.point]
            point = self.cell.point

            def before(method: Any) -> Any:
                def wrapped(*args: Any, **kwargs: Any) -> Any:
                    fire(point)
                    return method(*args, **kwargs)

                return wrapped

            stack.enter_context(patched(AsyncCheckpointer, name, before))


class FaultyActions:
    """A ``DistributedActions`` that delegates to real ones, with the cell's faults.

    Raises the cell's error inside ``init_process_group`` (before the group exists) or
    ``init_microbatch_calculator`` (after the model-parallel state, before the
    calculator); in the success plan of ``close()``, before ``destroy_model_parallel``,
    ``barrier`` or ``destroy_process_group`` does anything (the resource is still held:
    the failure plan must release it); raises the teardown-step fault after the first
    release it performs once the fault fired. Records what it created (``Owner.SESSION``)
    and released.
    """

    def __init__(self, inner: DistributedActions, probe: Probe) -> None:
        self.inner, self.probe = inner, probe
        self.created: list[str] = []
        self.releases: list[str] = []
        self.failed_releases: list[str] = []
        self.session: Session | SessionHandle | None = None  # the session, or a hook's handle of it

    def _init(self, name: str) -> Owner:
        owner: Owner = getattr(self.inner, name)()
        if owner is Owner.SESSION:
            self.created.append(name)
        return owner

    def _release(self, name: str, release: Callable[[], object]) -> None:
        release()
        try:
            self.probe.released()
        except OSError:
            self.failed_releases.append(RELEASED_BY[name])  # reported failed: a later pass may run it again
            raise
        self.releases.append(RELEASED_BY[name])

    def handler(self, resource: Resource) -> Handler:
        """The inner actions' handler of ``resource``, each callable wrapped with the cell's faults (``_before``)."""
        inner = self.inner.handler(resource)
        acquire, name = inner.acquire, acquire_name(resource)
        assert acquire is not None

        def acquired() -> Owner:
            self._before(name)
            owner = acquire()
            if owner is Owner.SESSION:
                self.created.append(name)
            return owner

        def wrapped(kind: StepKind, release: Callable[[], object]) -> Callable[[], None]:
            def run() -> None:
                self._before(kind.value)
                if kind.releases:
                    self._release(kind.value, release)
                else:
                    release()

            return run

        releases = {kind: wrapped(kind, release) for kind, release in inner.releases.items()}
        return Handler(acquired, releases, inner.check)

    def _before(self, name: str) -> None:
        """The cell's fault due at ``name``, if any (and the failure path's start or end, as the probe tracks it).

        ``init_store``: the next session starts (the failure path of the previous one is
        over); the ``pg_init`` fault fires here, before the store opens: a rank 0 that
        hosted the store and failed at once would leave peers that had not connected yet
        retrying a refused connection for the store timeout (torch cannot tell a host
        that is gone from one not up yet), which no lifecycle can shorten.
        """
        if name == "init_store":
            self.probe.path_closed()
            self.probe.fire("pg_init")
        elif name == "init_microbatch_calculator":
            self.probe.fire("globals_init")
        elif name == "destroy_model_parallel":
            self.probe.fire_in_success_plan("success_destroy_globals")
        elif name == "barrier":
            self.probe.fire_in_success_plan("success_barrier")
        elif name == "destroy_process_group":
            self.probe.fire_in_success_plan("success_destroy_group")
        elif name == "abort_process_group":
            if threading.current_thread() is threading.main_thread():
                self.probe.failing = True
            elif self.probe.gate is not None:
                self.probe.gate.at_abort()


class WatchedSession(Session):
    """A session whose ``fail()`` opens the failure path and records the error it got."""

    def __init__(self, actions: FaultyActions, probe: Probe) -> None:
        super().__init__(actions)
        self.probe = probe
        actions.session = self

    def fail(self, error: BaseException) -> Any:
        """As ``Session.fail``, watched."""
        self.probe.failures.append(error)
        return super().fail(error)  # opens the failure path (Probe.watch_restart)


class CallerState:
    """What the caller creates before the run (a group, the globals), and releases after it."""

    def __init__(self, cell: Cell, rank: int, port: int) -> None:
        self.cell, self.rank, self.port = cell, rank, port
        self.owns_group = cell.group_owner == "caller"
        self.owns_globals = cell.globals_owner == "caller"
        self.store: Any = None

    def create(self) -> None:
        world = self.cell.world_size
        if not (self.owns_group or self.owns_globals):
            return
        timeout = timedelta(seconds=GROUP_TIMEOUT_S)
        self.store = dist.TCPStore("127.0.0.1", self.port, world, self.rank == 0, timeout)
        dist.init_process_group(
            "gloo", store=dist.PrefixStore("caller", self.store), rank=self.rank, world_size=world, timeout=timeout
        )
        if self.owns_globals:
            parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
            microbatches.init_num_microbatches_calculator(self.rank, None, world, 1, world)
            rerun.initialize_rerun_state_machine()
        if not self.owns_group:
            # Globals without the caller's group: left over from a group that is gone.
            dist.destroy_process_group()

    def usable(self) -> list[str]:
        """Problems with what the caller still owns: it must exist and work."""
        problems = []
        if self.owns_group:
            tensor = torch.ones(1)
            dist.all_reduce(tensor)
            if tensor.item() != self.cell.world_size:
                problems.append(f"caller's group all_reduce gave {tensor.item()}")
        live = {name for name, up in alive().items() if up}
        if self.owns_globals and not live >= GLOBALS:
            problems.append(f"caller's globals were released: only {sorted(live)} left")
        return problems

    def release(self) -> None:
        if self.owns_globals:
            rerun.destroy_rerun_state_machine()
            microbatches.destroy_num_microbatches_calculator()
            parallel_state.destroy_model_parallel()
        if dist.is_initialized() and self.owns_group:
            dist.destroy_process_group()
        self.store = None


def config_for(cell: Cell, rank: int, port: int, workdir: Path, *, retry: bool = False) -> PretrainConfig:
    """A small pretrain run that passes every failure point: 2 steps, one evaluation, a checkpoint each step.

    Step 1 saves, step 2 commits that save (the first finalize) and saves again, the
    evaluation after step 2 is the first; the retry is 1 step with nothing else.
    """
    world = cell.world_size
    return PretrainConfig(
        distributed=DistributedConfig(
            world_size=world,
            rank=rank,
            master_addr="127.0.0.1",
            master_port=port if world > 1 else 0,
            timeout_s=GROUP_TIMEOUT_S,
        ),
        model=ModelConfig(vocab_size=16, seq_length=8, hidden_size=16, num_layers=1, num_heads=2),
        training=TrainingConfig(
            iterations=1 if retry else 2, eval_interval=0 if retry else 2, eval_iterations=1, log_interval=0
        ),
        checkpoint=CheckpointConfig(dir=None if retry else str(workdir), interval=0 if retry else 1),
        parallel=ParallelConfig(create_gloo_process_groups=cell.gloo_copies),
        exit=ExitConfig(handle_sigterm=not retry),
    )


def run_cell(
    cell: Cell, rank: int, ports: tuple[int, int, int, int], base: Path, *, gate: bool = False
) -> dict[str, Any]:
    """Run one cell on this rank; return its problems (empty: it passed), elapsed time and whether it fired.

    ``gate``: force NVRx's order on a rank where the fault is not armed (``NvrxOrderGate``).
    Also returned: ``window``, the main-thread collectives that ran after an abort started
    in another thread, before this rank learned of the failure; ``gate_held``.
    """
    problems: list[str] = []
    workdir = base / cell.id
    caller = CallerState(cell, rank, ports[0])
    probe = Probe(cell, rank, NvrxOrderGate() if gate else None)
    outcome: Any = None
    elapsed = 0.0
    try:
        caller.create()
        with contextlib.ExitStack() as stack:
            probe.watch(stack)
            probe.watch_restart(stack)
            probe.watch_close(stack)
            probe.checkpointer_faults(stack)
            config = config_for(cell, rank, ports[1], workdir)
            hooks = {"callbacks": [probe.callback()], "model_provider": probe.model_provider}
            hooks["batch_provider"] = probe.batch_provider(config)
            start = time.monotonic()
            probe.running = True
            try:
                if cell.mode == "ordinary":
                    actions = probe.make_actions(TorchActions(config.distributed, config.parallel))
                    outcome = pretrain(config, session=WatchedSession(actions, probe), **hooks)
                else:
                    # As wrapped_pretrain's own: rank and world size come from the Wrapper's environment.
                    distributed = dataclasses.replace(config.distributed, rank=None, world_size=None)

                    def actions_for(prefix: str, store: dist.Store) -> DistributedActions:
                        inner = TorchActions(distributed, config.parallel, store_prefix=prefix, store=store)
                        return probe.make_actions(inner)

                    outcome = wrapped_pretrain(
                        config, max_restarts=1, store_port=ports[2], actions=actions_for, **hooks, **FAST
                    )
            except BaseException as exc:  # noqa: BLE001 - the cell's outcome, whatever it is
                outcome = exc
            finally:
                probe.running = False
            elapsed = time.monotonic() - start
        problems += check(cell, rank, outcome, probe)
        if elapsed > CELL_LIMIT_S:
            problems.append(f"took {elapsed:.1f} s (limit {CELL_LIMIT_S} s, group timeout {GROUP_TIMEOUT_S} s)")
        problems += caller.usable()
        caller.release()
        if probe.expect.retry:
            problems += retry(cell, rank, ports[3], base)
    except BaseException as exc:  # noqa: BLE001 - a broken harness is a failed cell, not a dead worker
        problems.append("harness error: " + "".join(traceback.format_exception(exc)))
    finally:
        problems += force_clean()
        outcome = None  # drop the traceback: it references groups
        probe.actions.clear()
        probe.registered.clear()
        if rank == 0:
            shutil.rmtree(workdir, ignore_errors=True)
    held = probe.gate is not None and probe.gate.held
    return {"rank": rank, "problems": problems, "elapsed": elapsed, "fired": probe.fired, "window": probe.window,
            "gate_held": held}  # fmt: skip


def role(probe: Probe) -> tuple[str, RankOutcome | None]:
    """This rank's role in the cell, and what ``expected`` requires of it."""
    expect = probe.expect
    if expect.refusal is not None or not probe.armed:
        return "peer", expect.peer
    if probe.fired:
        return "fired", expect.fired
    return "preempted", expect.preempted


def check(cell: Cell, rank: int, outcome: Any, probe: Probe) -> list[str]:
    """Compare what this rank observed with ``expected(cell)``; return every difference."""
    problems: list[str] = []
    add = problems.append
    expect: Expectation = expected(cell)
    if probe.violations:
        add(f"collectives on the failure path: {probe.violations}")

    # Exactly the owned resources released: what the caller owns is live, nothing else ...
    live = {name for name, up in alive().items() if up}
    if live != expect.live_after:
        add(f"live after the run: {sorted(live)}, expected {sorted(expect.live_after)}")
    # ... and each session's actions released what they created, each once (a release
    # reported failed does not count: the ledger still holds it, a later pass may retry it).
    for i, actions in enumerate(probe.actions):
        done, failed = actions.releases, actions.failed_releases
        once = sorted(set(done) | set(failed)) == sorted(actions.created) and len(done) == len(set(done))
        if not once:
            add(f"session {i} created {actions.created} but released {done} (and {failed}, reported failed)")

    name, wanted = role(probe)
    if wanted is None:
        return [*problems, f"rank role {name} is not allowed in this cell (expected fault ranks {expect.fault_ranks})"]
    error = probe.error
    gets = wanted.gets
    if gets == ORIGINAL and outcome is not error:
        add(f"the caller got {outcome!r}, not the original exception object {error!r}")
    elif gets == TEARDOWN_ERROR and not (
        isinstance(outcome, TeardownError) and any(f.error is error for f in outcome.failures)
    ):
        add(f"expected a TeardownError carrying the injected error, got {outcome!r}")
    elif gets == WRAPPER_STOPS and not (isinstance(outcome, TeardownError) and _caused_by(outcome, error)):
        add(f"expected the Wrapper's TeardownError, raised from the injected error, got {outcome!r}")
    elif gets == RESTART and not isinstance(outcome, PretrainResult):
        add(f"expected a Wrapper restart that closes, got {outcome!r}")
    elif gets == REFUSAL:
        wanted_type = {"stale": StaleResource, "inprocess": ForeignResource}[expect.refusal or ""]
        if not isinstance(outcome, wanted_type):
            add(f"expected a {wanted_type.__name__} refusal, got {outcome!r}")
    elif gets == SOME_ERROR and not isinstance(outcome, BaseException):
        add(f"pre-empted by a peer's failure, yet the run returned {outcome!r}")
    elif gets == ERROR_OR_RESULT and not isinstance(outcome, BaseException | PretrainResult):
        add(f"a peer's run ended with {outcome!r}")

    # The sessions, in order, and the final state of each (a session that never reached
    # a hook is unobserved: under the Wrapper, only its actions show it).
    if len(probe.actions) != len(wanted.sessions):
        add(f"{len(probe.actions)} session(s) ran as {name}, expected {len(wanted.sessions)}")
    for i, (actions, states) in enumerate(zip(probe.actions, wanted.sessions, strict=False)):
        if actions.session is not None and actions.session.state not in states:
            add(f"session {i} ended {actions.session.state}, expected one of {sorted(states)}")
    if cell.mode == "ordinary" and probe.actions and probe.actions[0].session is None:
        add("the session given to pretrain was not the one that ran")
    if isinstance(outcome, PretrainResult) and outcome.journal[-1].dest is not State.CLOSED:
        add(f"the returned run's session ended {outcome.journal[-1].dest}")

    failed_with = probe.failures[0] if probe.failures else error
    if name == "fired" and cell.mode == "ordinary" and gets == ORIGINAL and failed_with is not error:
        add(f"the session failed with {failed_with!r}, not the injected error")

    # The teardown-step fault: it fired exactly where expected, every later step still
    # ran (the releases above), and the caller's exception names it.
    if name == "fired" and probe.teardown_fired != expect.teardown_fault:
        add(f"teardown fault fired={probe.teardown_fired}, expected {expect.teardown_fault}")
    if name == "fired" and probe.teardown_fired and isinstance(outcome, BaseException):
        said = [*getattr(outcome, "__notes__", [])]
        if isinstance(outcome, TeardownError):
            said += [repr(f.error) for f in outcome.failures]
        if not any(TEARDOWN_FAULT in n for n in said):
            add(f"the caller's exception does not name the failed teardown step (notes and failures: {said})")
    return problems


def _caused_by(outcome: BaseException, error: BaseException) -> bool:
    """True if ``error`` is ``outcome``, or in its chain of causes and contexts, or in a group on that chain.

    A failed success-plan step reaches the Wrapper inside ``close()``'s ``TeardownError``.
    """
    seen: BaseException | None = outcome
    while seen is not None:
        if seen is error:
            return True
        if isinstance(seen, BaseExceptionGroup) and any(_caused_by(e, error) for e in seen.exceptions):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def retry(cell: Cell, rank: int, port: int, base: Path) -> list[str]:
    """The next session in this process: an ordinary pretrain on a fresh group must close."""
    try:
        result = pretrain(config_for(cell, rank, port, base, retry=True))
    except BaseException as exc:  # noqa: BLE001
        return [f"the next session failed: {exc!r}"]
    if result.report.failed:
        return [f"the next session's teardown failed: {result.report.failed}"]
    return []


def force_clean() -> list[str]:
    """Release anything a broken cell left, so the next cell starts clean; report what was left."""
    # A hosted store kept for later attempts is not a leak: rank 0 keeps it by design.
    left = [name for name in release_everything() if name != "hosted_store"]
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return [f"left live after the cell: {sorted(left)}"] if left else []


def serve(conn: Any, rank: int, world_size: int, base: str, ready_after_s: float = 0.0) -> None:
    """Say ``("ready", pid)`` on ``conn`` (imports done; ``ready_after_s`` later), then run each cell it sends.

    Each message is ``(cell, ports, options)`` (``options``: ``run_cell``'s keywords);
    answers each with its result, until ``conn`` sends None (see ``matrix_pool``).
    """
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1"})
    for name in ("megatron", "nvidia_resiliency_ext", "lifecycle", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    os.makedirs(base, exist_ok=True)
    torch.set_num_threads(1)  # tiny models: intra-op threads only add contention between ranks
    # NVRx runs full collections at every restart; keep the imported modules out of them.
    gc.collect()
    gc.freeze()
    time.sleep(ready_after_s)  # as if its imports had taken that much longer
    conn.send(("ready", os.getpid()))
    while True:
        message = conn.recv()
        if message is None:
            break
        cell, ports, options = message
        os.environ["MASTER_PORT"] = str(ports[1])
        conn.send(run_cell(cell, rank, ports, Path(base), **options))
