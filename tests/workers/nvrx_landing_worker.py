"""NVRx's own ``RankShouldRestart`` landing at seeded lines of a failure teardown, under the real Wrapper (CPU, gloo).

Usage: ``python tests/workers/nvrx_landing_worker.py OUT SEED SAMPLE`` as rank 0 of a world of one
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` set; every Wrapper call takes fresh ports). Appends one
JSON line per Wrapper call to ``OUT`` as it ends, so a parent that had to kill this process still
knows which case was running.

Each case is one ``restart.run`` (``max_restarts=1``). Iteration 0 holds everything a session under
the Wrapper can hold (group, Megatron globals, store, checkpoints, a user release, a SIGTERM
handler), then raises ``InjectedFault`` in ``with session:``; from that raise on, a tracer (the
asynchronous-exception fuzzer's, ``reliability.async_fuzz.Tracer``) counts the line events of
lifecycle's files on the main thread and on the teardown's worker. At the case's line it asks
NVRx for a restart the way a failed peer does (an ``EXCEPTION`` interruption record in the
iteration's store): NVRx's monitor thread then aborts the group (``SessionAbort``) and raises
``RankShouldRestart`` into the main thread with ``PyThreadState_SetAsyncExc``, as it does in
production. The traced thread waits at that line until NVRx raised (on the main thread the
exception lands there; on the worker, the main thread gets it while it waits for the teardown,
unless NVRx's abort waited for a lock the worker held: then NVRx raises after the attempt and
handles it in its own code). Iteration 1 must then run to ``closed``. Case ``None`` (the
first) asks for nothing: it counts the line events the seeded sample is drawn from.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import torch
import torch.distributed as dist
from nvidia_resiliency_ext.inprocess import CallWrapper
from nvidia_resiliency_ext.inprocess import monitor_thread as nvrx_monitor_thread
from nvidia_resiliency_ext.inprocess.attribution import Interruption, InterruptionRecord
from nvidia_resiliency_ext.inprocess.monitor_thread import RankShouldRestart
from nvidia_resiliency_ext.inprocess.store import PrefixStore
from reliability.async_fuzz import MAIN, Tracer
from reliability.fuzz import PACKAGE_DIR
from support.configs import FAST, GROUP_TIMEOUT_S
from support.internals import LEFTOVERS, WORKERS
from support.probes import megatron_left, monitor_pid, reap

from lifecycle import DistributedConfig, ParallelConfig, Session, TorchActions, restart
from lifecycle.testing import RecordingCheckpoints, free_ports
from lifecycle.testing.leaks import find_leaks, snapshot

RAISE_WAIT_S = 5.0
"""How long the traced main thread waits at the case's line for NVRx's monitor thread to raise (it takes ~0.1 s)."""
WORKER_WAIT_S = 1.0
"""The same for a traced worker. NVRx's abort can wait for a lock the worker holds at that line: the
raise then comes once the worker went on, possibly after the attempt ended (NVRx handles that itself)."""
PICKUP_S = 0.2
"""After NVRx raised, how long a traced worker waits more: the main thread gets the exception within a wait slice."""


class InjectedFault(RuntimeError):
    """The failure iteration 0 raises."""


class NvrxRaised:
    """Observes NVRx's monitor thread raising into the main thread (its function still does the raising)."""

    def __init__(self) -> None:
        self.raised = threading.Event()
        self._original = nvrx_monitor_thread.async_abort_main_thread

    def __enter__(self) -> NvrxRaised:
        original = self._original

        def observed(msg: Any = None) -> None:
            original(msg)
            self.raised.set()

        nvrx_monitor_thread.async_abort_main_thread = observed
        return self

    def __exit__(self, *exc: object) -> None:
        nvrx_monitor_thread.async_abort_main_thread = self._original


class RestartRequest(Tracer):
    """The fuzzer's tracer; at its line it asks NVRx for a restart and waits there for NVRx's raise."""

    def __init__(self, at: int | None, call_wrapper: CallWrapper, raised: threading.Event) -> None:
        super().__init__(at)
        self.call_wrapper, self.raised = call_wrapper, raised
        self.on_main: list[bool] = []

    def line(self, frame: FrameType) -> None:
        """Count the line event (and the thread it ran on), then as the fuzzer's tracer."""
        self.on_main.append(threading.current_thread() is MAIN)
        super().line(frame)

    def land(self) -> None:
        """Record an interruption as a failed peer does; wait until NVRx raised (on the main thread: it lands here).

        The main thread waits in Python, one millisecond at a time: NVRx's monitor thread
        raises only once the main thread ran the progress watchdog's pending call
        (``pause_and_synchronize``), which a wait inside C (``Event.wait``) would hold off.
        """
        iteration_store = PrefixStore(self.call_wrapper.iteration, self.call_wrapper.base_store)
        iteration_store.record_interrupted([InterruptionRecord(0, Interruption.EXCEPTION)])
        deadline = time.monotonic() + RAISE_WAIT_S
        if threading.current_thread() is MAIN:
            while time.monotonic() < deadline:  # RankShouldRestart lands in this loop: at the traced line
                time.sleep(0.001)
            return
        if self.raised.wait(WORKER_WAIT_S):
            time.sleep(PICKUP_S)


def landing_site(error: BaseException | None) -> str:
    """The innermost line of lifecycle's files in ``error``'s traceback: where it landed (empty: none there)."""
    site = ""
    tb: TracebackType | None = None if error is None else error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.startswith(PACKAGE_DIR):
            site = f"{code.co_qualname}:{tb.tb_lineno}"
        tb = tb.tb_next
    return site


def _actions(prefix: str | None) -> TorchActions:
    return TorchActions(DistributedConfig(timeout_s=GROUP_TIMEOUT_S), ParallelConfig(), store_prefix=prefix)


def one_case(at: int | None) -> dict[str, Any]:
    """One Wrapper call whose iteration 0 fails with a restart request at line event ``at``; what the checks need."""
    port = free_ports(2)[0]
    os.environ["MASTER_PORT"] = str(port)
    before = snapshot()
    handlers_before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    sessions: list[Session] = []
    user_releases: list[int] = []
    checkpoints: list[RecordingCheckpoints] = []
    escaped: list[BaseException] = []
    out: dict[str, Any] = {"at": at, "handlers_at_iteration_1": None, "held_at_iteration_1": None}
    monitors: list[int] = []
    tracers: list[RestartRequest] = []

    def job(call_wrapper: CallWrapper) -> str:
        iteration = call_wrapper.iteration
        monitors.append(monitor_pid(call_wrapper))
        if iteration == 1:
            now = {s: signal.getsignal(s) for s in handlers_before}
            out["handlers_at_iteration_1"] = now == handlers_before
            out["held_at_iteration_1"] = [str(e) for e in sessions[0].ledger.held()]
        session = restart.session_for(call_wrapper, _actions)
        sessions.append(session)
        writer = RecordingCheckpoints()
        checkpoints.append(writer)
        try:
            with session:
                session.init_distributed()
                session.init_globals()
                session.register("user", lambda: user_releases.append(iteration))
                session.track_checkpoints(writer)
                session.start_training()
                session.install_signal_handlers()
                total = torch.ones(1)
                dist.all_reduce(total)
                if iteration == 0:
                    tracer = RestartRequest(at, call_wrapper, observer.raised)
                    tracers.append(tracer)
                    tracer.start()
                    raise InjectedFault("iteration 0")
        except BaseException as exc:
            escaped.append(exc)
            raise
        finally:
            for tracer in tracers:
                tracer.stop()
        return session.state.value

    start = time.monotonic()
    with NvrxRaised() as observer:
        try:
            result: Any = restart.run(job, max_restarts=1, group_timeout_s=GROUP_TIMEOUT_S, **FAST)
        except BaseException as exc:  # noqa: BLE001 - reported
            result = f"raised {exc!r}: {''.join(traceback.format_exception(exc))[-2000:]}"
    out["wall_s"] = round(time.monotonic() - start, 2)
    tracer = tracers[0] if tracers else None
    first = escaped[0] if escaped else None
    chain, seen, error = set(), 0, first
    while error is not None and id(error) not in chain:
        chain.add(id(error))
        seen += isinstance(error, RankShouldRestart)
        error = error.__cause__ or error.__context__
    out.update(
        result=result,
        events=None if tracer is None else tracer.index,
        on_main=None if tracer is None or at is not None else [i for i, main in enumerate(tracer.on_main) if main],
        fired=None if tracer is None else tracer.fired,
        requested_at=None if tracer is None else tracer.where,
        nvrx_raised=None if tracer is None else observer.raised.is_set(),
        escaped=[type(e).__name__ for e in escaped],
        escaped_is_restart=isinstance(first, RankShouldRestart),
        restart_cause_is_fault=isinstance(first, RankShouldRestart) and isinstance(first.__cause__, InjectedFault),
        restarts_in_chain=seen,
        landed_at=landing_site(first) if isinstance(first, RankShouldRestart) else "",
        states=[s.state.value for s in sessions],
        user_releases=user_releases,
        checkpoint_calls=[w.calls for w in checkpoints],
        handlers_after=({s: signal.getsignal(s) for s in handlers_before} == handlers_before),
        group_left=dist.is_initialized(),
        globals_left=megatron_left(),
        leftovers=[str(item.entry) for item in LEFTOVERS.peek() if item.is_live()],
    )
    escaped.clear()  # the tracebacks hold the iteration's frames
    sessions.clear()
    out["leaks"] = [str(leak) for leak in find_leaks(before, allowed_threads=("MonitorThread*",))]
    out["monitors_left"] = reap(monitors, grace_s=10.0)
    return out


def main() -> None:
    """Count the line events (case None), then run a seeded sample of them, half on each thread; a JSON line a case.

    With ``LIFECYCLE_TEARDOWN_IN_PLACE=1`` (the meta-test's broken build) no teardown gets a
    worker: ``Session.fail`` runs its plan on the main thread, as before issue 21.
    """
    out, seed, sample = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    if os.environ.get("LIFECYCLE_TEARDOWN_IN_PLACE") == "1":
        WORKERS.submit = lambda job: False  # type: ignore[method-assign]
    with out.open("a") as lines:

        def report(case: dict[str, Any]) -> None:
            lines.write(json.dumps(case) + "\n")
            lines.flush()

        counted = one_case(None)
        report(counted)
        total = counted["events"]
        if not total:
            return
        rng = random.Random(f"{seed}:nvrx-landing")
        main_thread = set(counted["on_main"])
        worker = [i for i in range(total) if i not in main_thread]
        half = sample // 2
        picked = rng.sample(sorted(main_thread), min(sample - min(half, len(worker)), len(main_thread)))
        picked += rng.sample(worker, min(sample - len(picked), len(worker)))
        for at in sorted(picked):
            report(one_case(at))


if __name__ == "__main__":
    main()
