"""One rank of a real multi-process run under NVRx's in-process restart Wrapper (for test_restart.py).

Usage: ``python -W ignore tests/workers/restart_worker.py SCENARIO OUT_DIR`` with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` set. Writes ``OUT_DIR/rank<rank>.json``. The Wrapper's
monitor process is forked from this one, so it shares this command line (and OUT_DIR):
the test finds and reaps it by that.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from support.configs import FAST, GROUP_TIMEOUT_S
from support.probes import GROUP_ENDS, TorchCalls, by_session, by_wrapper, megatron_left

from lifecycle import (
    Callback,
    CheckpointConfig,
    DistributedConfig,
    ModelConfig,
    ParallelConfig,
    PretrainConfig,
    Session,
    SessionHandle,
    TorchActions,
    TrainingConfig,
    exit_code,
    restart,
)

RANK = int(os.environ["RANK"])


def collective(out: Path) -> dict[str, Any]:
    """Two Wrapper calls in a row (stores on MASTER_PORT + 1, then + 2), each as in ``_collective_run``."""
    base = int(os.environ["MASTER_PORT"])
    runs = [_collective_run(store_port) for store_port in (None, base + 2)]
    return {"runs": runs, "group_left": dist.is_initialized(), "globals_left": megatron_left()}


def _collective_run(store_port: int | None) -> dict[str, Any]:
    """Iteration 0: rank 1 raises while rank 0 waits in an all-reduce; iteration 1 runs to ``closed`` on both."""
    probe = TorchCalls(GROUP_ENDS).install()
    sessions: list[Session] = []
    times: dict[str, float] = {}

    def job(call_wrapper: Any) -> str:
        iteration = call_wrapper.iteration
        probe.tag = iteration
        session = restart.session_for(
            call_wrapper,
            lambda prefix: TorchActions(
                DistributedConfig(timeout_s=GROUP_TIMEOUT_S), ParallelConfig(), store_prefix=prefix
            ),
        )
        sessions.append(session)
        with session:
            session.init_distributed()
            times[f"ready{iteration}"] = time.monotonic()
            session.init_globals()
            session.start_training()
            if iteration == 0 and RANK == 1:
                time.sleep(0.5)  # let rank 0 block in its all-reduce first
                times["raise"] = time.monotonic()
                raise RuntimeError("rank 1 fails in iteration 0")
            total = torch.ones(1)
            try:
                dist.all_reduce(total)
            finally:
                times[f"left{iteration}"] = time.monotonic()
            session.finish()
        return session.state.value

    started = time.monotonic()
    try:
        result = restart.run(job, max_restarts=2, store_port=store_port, group_timeout_s=GROUP_TIMEOUT_S, **FAST)
    finally:
        probe.restore()
    return {
        "result": result,
        "wall_s": time.monotonic() - started,
        "times": times,
        "states": [s.state.value for s in sessions],
        "deferred": [bool(s.report and s.report.deferred_to_wrapper) for s in sessions],
        # read once the Wrapper returned: its abort ran on every rank by then, before or after the teardown
        "released_by_wrapper_iteration0": [
            f"{r.by.value} {r.record.step}"
            for r in (sessions[0].report.released_by_wrapper if sessions[0].report else ())
        ],
        "iterations": [s.iteration for s in sessions],
        "session_teardown_calls_iteration0": [c.name for c in by_session(probe, 0)],
        "wrapper_calls_iteration0": [c.name for c in by_wrapper(probe, 0)],
    }


def wrapped_pretrain(out: Path) -> dict[str, Any]:
    """``wrapped_pretrain`` on 2 ranks; rank 1 fails once, at step 2 of iteration 0, with a checkpoint in flight."""
    started_iterations: list[int] = []

    class FailOnce(Callback):
        def on_train_start(self, session: SessionHandle, ctx: Any) -> None:
            started_iterations.append(session.iteration)

        def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
            if RANK == 1 and step == 2 and session.iteration == 0:
                raise RuntimeError("rank 1 fails once, at step 2")

    config = PretrainConfig(
        distributed=DistributedConfig(timeout_s=GROUP_TIMEOUT_S),
        model=ModelConfig(seq_length=8, hidden_size=16, num_layers=1, num_heads=2),
        training=TrainingConfig(iterations=4, log_interval=0),
        checkpoint=CheckpointConfig(dir=str(out / "ckpt"), interval=1, resume=True),
        journal_dir=str(out / "journal"),
    )
    started = time.monotonic()
    result = restart.wrapped_pretrain(config, None, [FailOnce()], max_restarts=2, **FAST)
    return {
        "wall_s": time.monotonic() - started,
        "final_step": result.final_step,
        "start_step": result.start_step,
        "world_size": result.world_size,
        "losses": result.losses,
        "iterations_started": started_iterations,
        "state": result.journal[-1].dest.value,
        "group_left": dist.is_initialized(),
        "globals_left": megatron_left(),
    }


def reproducible(out: Path) -> dict[str, Any]:
    """``wrapped_pretrain`` on 2 ranks; rank 1 raises at step 2 of every iteration: the job decides to stop."""
    started_iterations: list[int] = []

    class FailAlways(Callback):
        def on_train_start(self, session: SessionHandle, ctx: Any) -> None:
            started_iterations.append(session.iteration)

        def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
            if RANK == 1 and step == 2:
                raise RuntimeError("rank 1 fails at step 2, every time")

    config = PretrainConfig(
        distributed=DistributedConfig(timeout_s=GROUP_TIMEOUT_S),
        model=ModelConfig(seq_length=8, hidden_size=16, num_layers=1, num_heads=2),
        training=TrainingConfig(iterations=4, log_interval=0),
        checkpoint=CheckpointConfig(dir=str(out / "ckpt"), interval=1, resume=True),
        journal_dir=str(out / "journal"),
    )
    try:
        restart.wrapped_pretrain(config, None, [FailAlways()], max_restarts=4, **FAST)
    except restart.RestartStopped as stopped:
        return {
            "iterations_started": started_iterations,
            "decision": stopped.decision.to_json(),
            "exit_code": int(exit_code(stopped, config.journal_dir)),
            "group_left": dist.is_initialized(),
            "globals_left": megatron_left(),
        }
    raise AssertionError("wrapped_pretrain returned: the job did not stop")


SCENARIOS = {"collective": collective, "pretrain": wrapped_pretrain, "reproducible": reproducible}


def main() -> None:
    """Run the scenario named on the command line; write its result (or error) as JSON."""
    scenario, out = sys.argv[1], Path(sys.argv[2])
    try:
        body = {"ok": True, **SCENARIOS[scenario](out)}
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
        body = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "notes": getattr(exc, "__notes__", [])}
    (out / f"rank{RANK}.json").write_text(json.dumps(body))


if __name__ == "__main__":
    main()
