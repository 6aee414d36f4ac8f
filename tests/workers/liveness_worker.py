"""One rank of the liveness tests in ``tests/liveness/``: ``pretrain`` with a liveness monitor and a silent fault.

Usage: ``liveness_worker.py OUT_DIR KIND PHASE FAIL_RANK STEPS [JITTER]`` with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set (``lifecycle.testing.launch_ranks``).
KIND is a ``FaultKind`` or ``none``; the fault fires at step ``FAIL_STEP`` in PHASE on
FAIL_RANK. Under torchrun, KIND ``agent-stop`` or ``agent-kill`` has FAIL_RANK stop
(SIGSTOP) or kill (SIGKILL) the torchrun agent, which hosts the store, at step ``FAIL_STEP``;
each rank then also writes its report to ``OUT_DIR/report-<rank>.json``, and the rank that
stopped the agent lets it go on (SIGCONT) once every rank has reported (or after 60 s).
KIND ``monitor-kill`` has FAIL_RANK SIGKILL its own liveness monitor at step ``FAIL_STEP``
(a new one is started; the run goes on); ``monitor-kill-twice`` kills the new one too, 20
steps later (the rank then fails with ``MonitorLost``). KIND ``agent-stall`` runs ``pretrain`` on a
thread of its own (no signal handler can be installed there) and has FAIL_RANK stop the
agent at step ``FAIL_STEP`` for ``STALL_S`` seconds.
The monitor beats every 0.25 s with the 2 s floor; the group timeout is 60 s, so only
the monitor releases the ranks in time. Every step sleeps a base step; with
JITTER (a factor, e.g. 3), a random time up to JITTER base steps instead, ten at step 40,
and a checkpoint is saved every 250 steps. Prints one JSON line: this rank, its error and
notes, the wall-clock time it failed, and the end of its last step.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")

from support.configs import TINY  # noqa: E402
from support.internals import describe, liveness_rank  # noqa: E402

from lifecycle import (  # noqa: E402
    Callback,
    CheckpointConfig,
    DistributedConfig,
    ExitConfig,
    FaultInjection,
    LivenessConfig,
    ParallelConfig,
    PretrainConfig,
    SessionHandle,
    TrainingConfig,
    pretrain,
)

RANK = int(os.environ["RANK"])
FAIL_STEP = 60
GROUP_TIMEOUT_S = 60.0
INTERVAL_S = 0.25
FLOOR_S = 2.0
PATIENCE = 0.5
"""Conviction floor: 0.5 x 60 s / 3 = 10 s, the demo's (30 s timeout, patience 1) with a 60 s group timeout."""
BASE_STEP_S = 0.02
STALL_S = 12.0


class Jitter(Callback):
    """Sleeps a base step after each step; with ``factor``, 0 to ``factor`` base steps, and ten at step 40."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.random = random.Random(RANK)

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        if not self.factor:
            time.sleep(BASE_STEP_S)
            return
        time.sleep(BASE_STEP_S * (10 if step == 40 else self.random.uniform(0, self.factor)))


class AgentFault(Callback):
    """At step ``FAIL_STEP``, sends ``signum`` to this rank's parent, the torchrun agent; the time in ``OUT/agent``."""

    def __init__(self, signum: int, out: Path) -> None:
        self.signum, self.out = signum, out

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        if step == FAIL_STEP:
            (self.out / "agent").write_text(str(time.time()))
            os.kill(os.getppid(), self.signum)


class MonitorKill(Callback):
    """At step ``FAIL_STEP`` (and 20 steps later if ``twice``), SIGKILLs this rank's liveness monitor; its pid in
    ``OUT/monitor``."""

    def __init__(self, out: Path, twice: bool) -> None:
        self.out, self.twice = out, twice

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        watching = liveness_rank.current()
        if (step == FAIL_STEP or (self.twice and step == FAIL_STEP + 20)) and watching is not None:
            (self.out / "monitor").write_text(str(watching.process.pid))
            os.kill(watching.process.pid, signal.SIGKILL)


AGENT_SIGNALS = {"agent-stop": signal.SIGSTOP, "agent-kill": signal.SIGKILL, "agent-stall": signal.SIGSTOP}


class AgentStall(AgentFault):
    """At step ``FAIL_STEP``, stops the torchrun agent (SIGSTOP) and lets it go on (SIGCONT) ``STALL_S`` later."""

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        super().on_step_end(session, step, loss)
        if step == FAIL_STEP:
            threading.Timer(STALL_S, os.kill, (os.getppid(), signal.SIGCONT)).start()


def main(out: Path, kind: str, phase: str, fail_rank: int, steps: int, jitter: float) -> int:
    fault = None
    if kind not in ("none", "monitor-kill", "monitor-kill-twice", *AGENT_SIGNALS):
        fault = FaultInjection(phase=phase, rank=fail_rank, step=FAIL_STEP, kind=kind)  # type: ignore[arg-type]
    config = PretrainConfig(
        distributed=DistributedConfig(timeout_s=GROUP_TIMEOUT_S),
        parallel=ParallelConfig(micro_batch_size=4),
        model=TINY,
        training=TrainingConfig(iterations=steps, log_interval=0, eval_interval=0),
        checkpoint=CheckpointConfig(dir=str(out / "ckpt"), interval=250) if jitter else CheckpointConfig(),
        journal_dir=str(out),
        fault=fault,
        liveness=LivenessConfig(
            mode="kill", interval_s=INTERVAL_S, floor_s=FLOOR_S, default_deadline_s=30.0, patience=PATIENCE
        ),  # type: ignore[arg-type]
        exit=ExitConfig(handle_sigterm=kind != "agent-stall"),  # off the main thread no handler can be installed
    )
    error: BaseException | None = None
    last: list[float] = [0.0]

    class LastStep(Callback):
        def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
            last[0] = time.time()

    callbacks: list[Callback] = [LastStep(), Jitter(jitter)]
    agent = os.getppid()
    if kind in ("monitor-kill", "monitor-kill-twice") and fail_rank == RANK:
        callbacks.append(MonitorKill(out, twice=kind == "monitor-kill-twice"))
    if kind in AGENT_SIGNALS and fail_rank == RANK:
        callbacks.append((AgentStall if kind == "agent-stall" else AgentFault)(AGENT_SIGNALS[kind], out))

    def train() -> None:
        nonlocal error
        try:
            pretrain(config, callbacks=callbacks)
        except Exception as exc:  # noqa: BLE001 - what the test inspects
            error = exc

    if kind == "agent-stall":
        thread = threading.Thread(target=train, name="pretrain")
        thread.start()
        thread.join()
    else:
        train()
    report: dict[str, Any] = {
        "rank": RANK,
        "error": error and describe(error),
        "notes": list(getattr(error, "__notes__", ())),
        "failed_at": time.time(),
        "last_step_end": last[0],
    }
    print(json.dumps(report), flush=True)
    if kind in AGENT_SIGNALS:
        (out / f"report-{RANK}.json").write_text(json.dumps(report))
    if kind == "agent-stop" and fail_rank == RANK:  # (agent-stall: its timer lets the agent go on)
        world = int(os.environ["WORLD_SIZE"])
        deadline = time.monotonic() + 60.0
        while len(list(out.glob("report-*.json"))) < world and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(agent, signal.SIGCONT)
    return 0


if __name__ == "__main__":
    jitter = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    sys.exit(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), jitter))
