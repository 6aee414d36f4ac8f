"""One rank of ``tests/distributed/test_bounded_waits.py``: a failure with work pending on Megatron's gloo copies.

Both ranks drive a session (Megatron's gloo copies of the data-parallel groups on,
group timeout ``TIMEOUT_S``) to ``training``. Rank 0 starts an all-reduce on the
data-parallel gloo copy that rank 1 never joins (asynchronous work pending on it) and
fails; rank 1 waits in an all-reduce on the default group that rank 0 never joins,
until rank 0's abort ends it. Each rank writes one JSON line to
``$RESULTS/rank<rank>.json``: when rank 0 failed, when the rank's session was final,
its state, its teardown steps with their durations, the torch functions that released
groups (a graceful ``destroy_process_group`` must not be one: the failure plan aborts),
and what was left alive.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from support.probes import TORCH_RELEASES, TorchCalls, record_run
from support.session import drive

from lifecycle import DistributedConfig, ParallelConfig, Session, State, TorchActions

TIMEOUT_S = 15.0
"""The group timeout: a teardown that waits on the pending work takes this long."""


def start_pending_work() -> bool:
    """Start an all-reduce on the data-parallel gloo copy that the peer never joins; True if it is pending.

    No reference to the group or the work is kept here (a training step's would go with
    its frames): only Megatron's and torch's registries hold the group.
    """
    work = dist.all_reduce(torch.ones(4), group=parallel_state.get_data_parallel_group_gloo(), async_op=True)
    return work is not None and not work.is_completed()


def scenario(rank: int, record: dict[str, Any]) -> None:
    """Rank 0: pending work on the gloo copy, then a failure. Rank 1: waits in a collective. Fills ``record``."""
    actions = TorchActions(DistributedConfig(timeout_s=TIMEOUT_S), ParallelConfig(create_gloo_process_groups=True))
    session = Session(actions, label=f"rank {rank}")
    calls = TorchCalls(TORCH_RELEASES)
    try:
        with calls, session:
            drive(session, State.TRAINING)
            record["gloo_copy"] = parallel_state.get_data_parallel_group_gloo() is not None
            dist.barrier()  # both ranks are up: from here rank 0 fails and rank 1 waits
            if rank == 0:
                record["pending"] = start_pending_work()
                record["failed_at"] = time.time()
                raise RuntimeError("rank 0 fails with work pending on the gloo copy")
            record["waiting_at"] = time.time()
            dist.all_reduce(torch.ones(4))  # rank 0 never joins: ended by its abort
    except Exception as exc:  # noqa: BLE001 - the expected failure (rank 0) or the peer's error (rank 1)
        record["error"] = f"{type(exc).__name__}: {exc}"
    record["final_at"] = time.time()
    record["releases"] = [call.name for call in calls.calls]
    record["state"] = session.state.value
    report = session.report
    record["steps"] = [[str(r.step), r.duration_s] for r in report.records] if report is not None else []


def main() -> int:
    """Run the scenario on this rank; write what it saw, then what was left alive."""
    rank = int(os.environ["RANK"])
    return record_run(lambda record: scenario(rank, record), Path(os.environ["RESULTS"], f"rank{rank}.json"))


if __name__ == "__main__":
    sys.exit(main())
