"""One rank of the GPU check (tests/gpu): ``python gpu_worker.py SCENARIO OUT``, with RANK etc. set.

Every scenario runs on nccl, one rank per GPU, and writes this rank's result as JSON
to ``OUT/<scenario>-rank<R>.json`` (``{"ok": False, "error": ...}`` if it raised).
``GPU_WORKER_BACKEND=gloo`` rehearses the scenarios on CPU (to check the worker itself).

- ``session``: for each live state, a session driven there fails (with two ranks or
  more: the last rank raises while rank 0 waits on an all-reduce it never joins), then
  one session trains (an all-reduce) and closes; the device bound, the NCCL variables
  set and the tensor-parallel RNG tracker are recorded.
- ``pretrain``: ``pretrain`` with a fault in each phase, each followed by a retry in
  the same process that must succeed.
- ``inprocess``: ``wrapped_pretrain`` under NVRx's Wrapper; the last rank fails once,
  at step 2 of iteration 0, and the Wrapper restarts every rank in its process.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel import random as tp_random
from support.configs import FAST
from support.probes import alive, megatron_left
from support.session import drive

from lifecycle import (
    Callback,
    CheckpointConfig,
    DistributedConfig,
    FaultInjection,
    InjectedFault,
    ModelConfig,
    ParallelConfig,
    Phase,
    PretrainConfig,
    Session,
    SessionHandle,
    TorchActions,
    TrainingConfig,
    pretrain,
    restart,
)
from lifecycle.testing import release_everything

BACKEND = os.environ.get("GPU_WORKER_BACKEND", "nccl")
DEVICE = "cuda" if BACKEND == "nccl" else "cpu"
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LAST = WORLD - 1
SESSION_TIMEOUT_S = 10.0
"""The session scenario's group timeout: with two ranks, rank 0 is released by its watchdog at the latest then."""
WRAPPER_TIMEOUT_S = 30.0
"""Under the Wrapper the watchdog must outlast NVRx's hard-timeout kill (``restart.wrapper_timeouts``)."""
NCCL_VARIABLES = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_RETHROW_CUDA_ERRORS")
FAIL_STATES = ("dist_ready", "globals_ready", "training", "finalizing")
DELAY_S = 0.5


def tracker_states() -> list[str]:
    """The names of the tensor-parallel RNG tracker's states (empty if it is not seeded)."""
    tracker = tp_random._CUDA_RNG_STATE_TRACKER
    return sorted(tracker.get_states()) if tracker is not None else []


def fail_in(state: str) -> dict[str, Any]:
    """Drive a session to ``state`` and fail there; with peers, the last rank fails while rank 0 waits on it."""
    session = Session(TorchActions(DistributedConfig(backend=BACKEND, timeout_s=SESSION_TIMEOUT_S), ParallelConfig()))
    record: dict[str, Any] = {"fail_state": state}
    failed_at = time.monotonic()
    try:
        with session:
            drive(session, state)
            value = torch.ones(1, device=DEVICE)
            dist.all_reduce(value)
            record["sum"] = value.item()  # every rank is in ``state`` now
            if RANK == LAST:
                time.sleep(DELAY_S)
                failed_at = time.monotonic()
                raise InjectedFault(Phase.STEP, RANK, None)
            blocked = time.monotonic()
            try:
                waiting = torch.ones(8, device=DEVICE)
                dist.all_reduce(waiting)  # the last rank never joins this one
                waiting.cpu()  # the wait is here: nccl returns from the call at once
                again = torch.ones(1, device=DEVICE)
                dist.all_reduce(again)  # after the watchdog aborted the communicator: must raise
                again.item()
                record["all_reduce"] = "returned"
            except Exception:
                failed_at = time.monotonic()
                record["blocked_s"] = failed_at - blocked
                raise
    except BaseException as exc:  # noqa: BLE001 - recorded: what each rank saw is the result
        record["teardown_s"] = time.monotonic() - failed_at
        record["error"] = type(exc).__name__
    record["final_state"] = session.state.value
    record["alive"] = alive()
    return record


def session_scenario(out: Path) -> dict[str, Any]:
    """Each failure, then a session that trains and closes; what it bound, set and seeded."""
    failures = [fail_in(state) for state in FAIL_STATES]
    session = Session(TorchActions(DistributedConfig(backend=BACKEND, timeout_s=SESSION_TIMEOUT_S), ParallelConfig()))
    with session:
        drive(session, "training")
        seeded = tracker_states()
        value = torch.ones(1, device=DEVICE)
        dist.all_reduce(value, group=parallel_state.get_data_parallel_group())
        device = torch.cuda.current_device() if DEVICE == "cuda" else None
    return {
        "failures": failures,
        "final_state": session.state.value,
        "sum": value.item(),
        "device": device,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "local_rank": os.environ.get("LOCAL_RANK"),
        "nccl_env": {name: os.environ.get(name) for name in NCCL_VARIABLES},
        "seeded_during": seeded,
        "seeded_after": tracker_states(),
        "alive": alive(),
    }


def config(out: Path, timeout_s: float, **fields: Any) -> PretrainConfig:
    """A tiny nccl ``pretrain`` on this world: 4 steps, checkpoints every 2, evaluation every 2, a journal."""
    base = PretrainConfig(
        distributed=DistributedConfig(backend=BACKEND, timeout_s=timeout_s),
        parallel=ParallelConfig(micro_batch_size=4),
        model=ModelConfig(vocab_size=32, seq_length=16, hidden_size=32, num_layers=1, num_heads=2),
        training=TrainingConfig(iterations=4, log_interval=0, eval_interval=2, eval_iterations=1),
        checkpoint=CheckpointConfig(dir=str(out / "ckpt"), interval=2),
        journal_dir=str(out / "journal"),
    )
    return dataclasses.replace(base, **fields)


def pretrain_scenario(out: Path) -> dict[str, Any]:
    """A fault in each phase (on the last rank), each followed by a retry that must finish."""
    phases: dict[str, Any] = {}
    for phase in Phase:
        record: dict[str, Any] = {}
        started = time.monotonic()
        try:
            pretrain(config(out / phase.value, SESSION_TIMEOUT_S, fault=FaultInjection(phase, rank=LAST, step=2)))
            record["fault"] = "did not fire"
        except Exception as exc:  # noqa: BLE001 - recorded: what each rank saw is the result
            record["fault"] = type(exc).__name__
        record["fail_s"] = time.monotonic() - started
        record["alive_after_fault"] = alive()
        # Twice the timeout: after a fault in phase dist, rank 0 leaves only at its group timeout, while
        # the failed rank starts its retry at once and waits for rank 0's next session; with equal
        # timeouts that was a race (lost about one run in two on the slower Python 3.12 stack).
        retry = pretrain(config(out / f"{phase.value}-retry", 2 * SESSION_TIMEOUT_S))
        record["retry_final_step"] = retry.final_step
        record["retry_loss_finite"] = bool(retry.losses) and all(math.isfinite(loss) for _, loss in retry.losses)
        phases[phase.value] = record
    return {"phases": phases, "alive": alive(), "globals_left": megatron_left()}


def inprocess_scenario(out: Path) -> dict[str, Any]:
    """``wrapped_pretrain``: the last rank fails once, at step 2 of iteration 0; the Wrapper restarts every rank."""
    started_iterations: list[int] = []

    class FailOnce(Callback):
        def on_train_start(self, session: SessionHandle, ctx: Any) -> None:
            started_iterations.append(session.iteration)

        def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
            if RANK == LAST and step == 2 and session.iteration == 0:
                raise RuntimeError("the last rank fails once, at step 2")

    started = time.monotonic()
    result = restart.wrapped_pretrain(
        config(out, WRAPPER_TIMEOUT_S, checkpoint=CheckpointConfig(dir=str(out / "ckpt"), interval=1, resume=True)),
        None,
        [FailOnce()],
        max_restarts=1,
        **FAST,
    )
    return {
        "wall_s": time.monotonic() - started,
        "final_step": result.final_step,
        "iterations_started": started_iterations,
        "state": result.journal[-1].dest.value,
        "group_left": dist.is_initialized(),
        "globals_left": megatron_left(),
    }


SCENARIOS = {"session": session_scenario, "pretrain": pretrain_scenario, "inprocess": inprocess_scenario}


def main() -> None:
    """Run the scenario named on the command line; write its result (or its error) as JSON."""
    scenario, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    try:
        body = {"ok": True, **SCENARIOS[scenario](out / f"rank{RANK}")}
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
        body = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "notes": getattr(exc, "__notes__", [])}
    (out / f"{scenario}-rank{RANK}.json").write_text(json.dumps(body, default=str))
    release_everything()


if __name__ == "__main__":
    main()
