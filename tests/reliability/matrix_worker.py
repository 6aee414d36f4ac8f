"""One rank of the fault matrix: a long-lived process that runs cells sent by the driver.

Everything is real (gloo groups, megatron-core globals, async checkpoints, NVRx's
Wrapper, ``pretrain``); faults are injected by wrapping one method at the failure point,
and the path is observed by wrapping torch.distributed's collectives. Each cell reports
a list of problems: empty means every assertion held on this rank.
"""

from __future__ import annotations

import contextlib
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
from reliability.matrix_cells import CALLBACK_HOOKS, INTERRUPTS, Cell
from support.probes import TORCH_COLLECTIVES
from support.restart import FAST

import lifecycle._core.session as session_module
import lifecycle._training.pretrain as pretrain_module
from lifecycle import (
    Callback,
    CheckpointConfig,
    DistributedConfig,
    ExitConfig,
    LifecycleError,
    ModelConfig,
    Outcome,
    Owner,
    ParallelConfig,
    PretrainConfig,
    Resource,
    Session,
    State,
    TeardownError,
    TorchActions,
    TrainingConfig,
    pretrain,
)
from lifecycle._core.signals import InstalledHandlers
from lifecycle._torch.actions import close_hosted_stores, live_resources
from lifecycle._training.model import default_model_provider
from lifecycle.checkpoint import AsyncCheckpointer
from lifecycle.restart import wrapped_pretrain

GROUP_TIMEOUT_S = 10.0
CELL_LIMIT_S = 8.0
"""A cell must finish well inside the group timeout: nothing waited for a peer that is gone."""
TEARDOWN_FAULT = "injected teardown fault"


@contextlib.contextmanager
def patched(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """Replace ``owner.name`` by ``make(original)`` for the duration of the block."""
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


class Observer:
    """Sessions created, errors each failure path started with, and collectives called during one."""

    def __init__(self) -> None:
        self.sessions: list[Session] = []
        self.failures: list[BaseException] = []
        self.failing = 0
        self.violations: list[str] = []

    def install(self, stack: contextlib.ExitStack) -> None:
        observer = self

        def record_sessions(init: Any) -> Any:
            def __init__(session: Session, *args: Any, **kwargs: Any) -> None:
                init(session, *args, **kwargs)
                observer.sessions.append(session)

            return __init__

        def watch_failure_path(fail_after: Any) -> Any:
            def _fail_after(session: Session, start: float, error: BaseException) -> Any:
                observer.failures.append(error)
                observer.failing += 1
                try:
                    return fail_after(session, start, error)
                finally:
                    observer.failing -= 1

            return _fail_after

        stack.enter_context(patched(Session, "__init__", record_sessions))
        stack.enter_context(patched(Session, "_fail_after", watch_failure_path))
        for module in (dist, dist.distributed_c10d):
            for name in TORCH_COLLECTIVES:
                if hasattr(module, name):
                    stack.enter_context(patched(module, name, self._watch(name)))

    def _watch(self, name: str) -> Callable[[Any], Any]:
        def make(collective: Any) -> Any:
            def watched(*args: Any, **kwargs: Any) -> Any:
                if self.failing and threading.current_thread() is threading.main_thread():
                    self.violations.append(name)
                return collective(*args, **kwargs)

            return watched

        return make


class Injector:
    """Raises the cell's error, once, at the cell's point (on the ranks it names)."""

    def __init__(self, cell: Cell, rank: int, observer: Observer) -> None:
        self.cell = cell
        self.armed = cell.refusal is None and rank in cell.fault_ranks
        self.error: BaseException = {
            "exception": RuntimeError(f"injected at {cell.point}"),
            "keyboard_interrupt": KeyboardInterrupt(f"injected at {cell.point}"),
            "system_exit": SystemExit(f"requested exit ended with sys.exit() at {cell.point}"),
            "teardown_step": RuntimeError(f"injected at {cell.point}"),
        }.get(cell.raised, RuntimeError("never raised: the configuration is refused"))
        self.fired = False
        self.teardown_fired = False
        self.teardown_steps = (0, 0)  # (steps planned, steps run) of the plan whose first step raised
        self.observer = observer

    def fire(self) -> None:
        """Raise the error if armed and not fired yet."""
        if self.armed and not self.fired:
            self.fired = True
            raise self.error

    def callback(self) -> Callback:
        """A callback whose every hook fires when it is the cell's point."""
        injector = self

        class Faulty(Callback):
            def __getattribute__(self, name: str) -> Any:
                if name in CALLBACK_HOOKS and name == injector.cell.point:
                    return lambda *args: injector.fire()
                return object.__getattribute__(self, name)

        return Faulty()

    def model_provider(self, config: PretrainConfig) -> torch.nn.Module:
        """The default model, unless the fault is due in setup."""
        if self.cell.point == "setup":
            self.fire()
        return default_model_provider(config)

    def install(self, stack: contextlib.ExitStack) -> None:
        point, injector = self.cell.point, self

        def before(method: Any, when: Callable[..., bool] = lambda *a: True) -> Any:
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                if when(*args, **kwargs):
                    injector.fire()
                return method(*args, **kwargs)

            return wrapped

        targets: dict[str, tuple[Any, str, Callable[..., bool]]] = {
            "pg_init": (TorchActions, "init_process_group", lambda *a: True),
            "globals_init": (TorchActions, "init_microbatch_calculator", lambda *a: True),
            "step": (pretrain_module._Run, "train_step", lambda run, step: step == 2),
            "eval": (pretrain_module._Run, "evaluate", lambda *a: True),
            "checkpoint_save": (AsyncCheckpointer, "save", lambda *a: True),
            "checkpoint_finalize": (AsyncCheckpointer, "finalize", lambda *a: True),
            "success_teardown": (
                InstalledHandlers,
                "restore",
                lambda *a: (
                    bool(injector.observer.sessions)
                    and injector.observer.sessions[-1].state is State.FINALIZING
                    and not injector.observer.failing
                ),
            ),
        }
        if point in targets:
            owner, name, when = targets[point]
            stack.enter_context(patched(owner, name, lambda method: before(method, when)))
        if self.cell.raised == "teardown_step" and self.armed:
            stack.enter_context(patched(session_module, "execute", self._first_failure_step_raises))

    def _first_failure_step_raises(self, execute: Any) -> Any:
        def wrapped(plan: Any, perform: Any, ledger: Any, *, outcome: Outcome, **kwargs: Any) -> Any:
            if outcome is Outcome.FAILURE and len(plan) and not self.teardown_fired:
                self.teardown_fired = True
                first = plan[0]

                def perform_then_raise(step: Any) -> None:
                    perform(step)
                    if step is first:
                        raise OSError(TEARDOWN_FAULT)

                report, after = execute(plan, perform_then_raise, ledger, outcome=outcome, **kwargs)
                self.teardown_steps = (len(plan), len(report.records))
                return report, after
            return execute(plan, perform, ledger, outcome=outcome, **kwargs)

        return wrapped


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
        if self.owns_globals and set(live_resources()) < {
            Resource.MODEL_PARALLEL,
            Resource.MICROBATCH_CALCULATOR,
            Resource.RERUN_STATE_MACHINE,
        }:
            problems.append(f"caller's globals were released: only {live_resources()} left")
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
    """A small pretrain run that passes every failure point: 3 steps, eval, a checkpoint each step."""
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
        training=TrainingConfig(iterations=1 if retry else 3, eval_interval=0 if retry else 2, log_interval=0),
        checkpoint=CheckpointConfig(dir=None if retry else str(workdir), interval=0 if retry else 1),
        parallel=ParallelConfig(create_gloo_process_groups=False),
        exit=ExitConfig(handle_sigterm=not retry),
    )


def run_cell(cell: Cell, rank: int, ports: tuple[int, int, int, int], base: Path) -> dict[str, Any]:
    """Run one cell on this rank; return its problems (empty: it passed), elapsed time and a summary."""
    problems: list[str] = []
    workdir = base / cell.id
    caller = CallerState(cell, rank, ports[0])
    observer = Observer()
    injector = Injector(cell, rank, observer)
    outcome: Any = None
    elapsed = 0.0
    try:
        caller.create()
        with contextlib.ExitStack() as stack:
            observer.install(stack)
            injector.install(stack)
            config = config_for(cell, rank, ports[1], workdir)
            start = time.monotonic()
            try:
                if cell.mode == "ordinary":
                    outcome = pretrain(config, callbacks=[injector.callback()], model_provider=injector.model_provider)
                else:
                    outcome = wrapped_pretrain(
                        config,
                        callbacks=[injector.callback()],
                        model_provider=injector.model_provider,
                        max_restarts=1,
                        store_port=ports[2],
                        **FAST,
                    )
            except BaseException as exc:  # noqa: BLE001 - the cell's outcome, whatever it is
                outcome = exc
            elapsed = time.monotonic() - start
        problems += check(cell, rank, outcome, observer, injector, caller)
        if elapsed > CELL_LIMIT_S:
            problems.append(f"took {elapsed:.1f} s (limit {CELL_LIMIT_S} s, group timeout {GROUP_TIMEOUT_S} s)")
        problems += caller.usable()
        caller.release()
        problems += retry(cell, rank, ports[3], base)
    except BaseException as exc:  # noqa: BLE001 - a broken harness is a failed cell, not a dead worker
        problems.append("harness error: " + "".join(traceback.format_exception(exc)))
    finally:
        problems += force_clean()
        outcome = None  # drop the traceback: it references groups
        if rank == 0:
            shutil.rmtree(workdir, ignore_errors=True)
    return {"rank": rank, "problems": problems, "elapsed": elapsed, "fired": injector.fired}


def check(
    cell: Cell, rank: int, outcome: Any, observer: Observer, injector: Injector, caller: CallerState
) -> list[str]:
    """Every assertion of the matrix on this rank; returns the ones that failed."""
    problems: list[str] = []
    expect = problems.append
    sessions = observer.sessions
    if observer.violations:
        expect(f"collectives on the failure path: {observer.violations}")

    # Exactly the owned resources released: what the caller owns is live, nothing else.
    live = set(live_resources())
    wanted = set()
    if caller.owns_group:
        wanted.add(Resource.PROCESS_GROUP)
    if caller.owns_globals:
        wanted |= {Resource.MODEL_PARALLEL, Resource.MICROBATCH_CALCULATOR, Resource.RERUN_STATE_MACHINE}
    if live != wanted:
        expect(f"live after the run: {sorted(live)}, expected {sorted(wanted)}")

    if cell.refusal is not None:
        if not isinstance(outcome, LifecycleError):
            expect(f"expected a LifecycleError refusal, got {outcome!r}")
        elif cell.refusal == "stale" and "stale" not in str(outcome):
            expect(f"refusal does not say the state is stale: {outcome}")
        if cell.refusal == "inprocess" and sessions:
            expect(f"{len(sessions)} session(s) started under a refused Wrapper run")
        if cell.refusal == "stale" and [s.state for s in sessions] != [State.FAILED]:
            expect(f"stale refusal: sessions ended {[s.state for s in sessions]}")
        return problems

    if not sessions:
        return [*problems, f"no session was created; outcome {outcome!r}"]
    first, last = sessions[0], sessions[-1]
    error = injector.error
    # With two ranks faulting at the same point, one rank's failure can reach the other
    # (its group aborted under it) before that rank's own fault fires: it is then
    # pre-empted, and fails with the error it got. The driver checks some rank fired.
    preempted = injector.armed and not injector.fired
    if preempted and cell.world_size == 1:
        expect("the fault never fired")

    if cell.mode == "inprocess" and cell.raised not in INTERRUPTS:
        # The Wrapper restarts: iteration 1 is the next session, and it must close.
        if not (hasattr(outcome, "exit_reason") and last.state is State.CLOSED and len(sessions) == 2):
            expect(f"expected a restart that closes; got {outcome!r}, sessions {[s.state for s in sessions]}")
        # A peer may have closed iteration 0 before the Wrapper restarted it.
        if first.state is not State.FAILED and (injector.armed or first.state is not State.CLOSED):
            expect(f"iteration 0 ended {first.state}")
        if injector.fired and not any(f is error or _carries(f, error) for f in observer.failures):
            expect("the session's failure path never saw the original exception")
        if first.state is State.FAILED:
            # What the session still held for the Wrapper is exactly what its report says it deferred.
            held = [e for e in first.ledger.held() if e.owner is Owner.RESTART_WRAPPER]
            deferred = first.report is not None and first.report.deferred_to_wrapper
            if bool(held) != deferred:
                expect(f"iteration 0 held {[str(e) for e in held]} for the Wrapper, but deferred={deferred}")
    elif preempted:
        if not isinstance(outcome, BaseException):
            expect(f"pre-empted by a peer's failure, yet the run returned {outcome!r}")
        if last.state is not State.FAILED:
            expect(f"final state {last.state}, expected failed")
    elif injector.armed:
        if cell.point == "success_teardown" and cell.raised not in INTERRUPTS:
            if not (isinstance(outcome, TeardownError) and any(f.error is error for f in outcome.failures)):
                expect(f"expected a TeardownError carrying the injected error, got {outcome!r}")
        elif outcome is not error:
            expect(f"the caller got {outcome!r}, not the original exception object {error!r}")
        if last.state is not State.FAILED:
            expect(f"final state {last.state}, expected failed")
    else:  # a peer of the failing rank: it fails (its own error) or, if it was done already, closes
        if last.state not in (State.FAILED, State.CLOSED):
            expect(f"peer ended {last.state}")

    if cell.raised == "teardown_step" and injector.armed:
        report = first.report
        planned = report is not None and report.outcome is Outcome.FAILURE and len(report.ran) > 0
        if injector.teardown_fired != planned:
            expect(f"teardown fault fired={injector.teardown_fired} but the failure plan ran {report and report.ran}")
        if injector.teardown_fired:
            notes = [n for f in observer.failures for n in getattr(f, "__notes__", [])]
            if not any(TEARDOWN_FAULT in n for n in notes):
                expect(f"no note about the failed teardown step on the original exception: {notes}")
            planned_steps, ran_steps = injector.teardown_steps
            if ran_steps != planned_steps:
                expect(f"only {ran_steps} of {planned_steps} failure steps ran after the first one raised")
    return problems


def _carries(failure: BaseException, error: BaseException) -> bool:
    """True if ``failure`` is a TeardownError carrying ``error``, or ``error`` caused it."""
    if isinstance(failure, TeardownError) and any(f.error is error for f in failure.failures):
        return True
    return failure.__cause__ is error or failure.__context__ is error


def retry(cell: Cell, rank: int, port: int, base: Path) -> list[str]:
    """The next session in this process: an ordinary pretrain on a fresh group must close."""
    if cell.mode == "inprocess" and cell.refusal is None and cell.raised not in INTERRUPTS:
        return []  # the Wrapper's next iteration was the next session, and it closed
    try:
        result = pretrain(config_for(cell, rank, port, base, retry=True))
    except BaseException as exc:  # noqa: BLE001
        return [f"the next session failed: {exc!r}"]
    if result.report.failed:
        return [f"the next session's teardown failed: {result.report.failed}"]
    return []


def force_clean() -> list[str]:
    """Release anything a broken cell left, so the next cell starts clean; report what was left."""
    left = live_resources()
    if Resource.RERUN_STATE_MACHINE in left:
        rerun.destroy_rerun_state_machine()
    if Resource.MICROBATCH_CALCULATOR in left:
        microbatches.destroy_num_microbatches_calculator()
    if Resource.MODEL_PARALLEL in left:
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
    close_hosted_stores()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return [f"left live after the cell: {sorted(left)}"] if left else []


def serve(conn: Any, rank: int, world_size: int, base: str) -> None:
    """Run cells received on ``conn`` until it sends None; answer each with its result."""
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1"})
    for name in ("megatron", "nvidia_resiliency_ext", "lifecycle", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    os.makedirs(base, exist_ok=True)
    torch.set_num_threads(1)  # tiny models: intra-op threads only add contention between ranks
    # NVRx runs full collections at every restart; keep the imported modules out of them.
    gc.collect()
    gc.freeze()
    while True:
        message = conn.recv()
        if message is None:
            break
        cell, ports = message
        os.environ["MASTER_PORT"] = str(ports[1])
        conn.send(run_cell(cell, rank, ports, Path(base)))
