"""One rank of the two-rank tests in ``tests/distributed/test_actions.py``; run by torchrun or with RANK etc. set.

For each live state after ``uninitialized``, both ranks drive a fresh session to that
state; rank 1 raises while rank 0 is blocked in an all-reduce that rank 1 never joins;
both take the failure path. Then one session runs to ``closed`` on both ranks. Each
result is one JSON line in ``$DIST_RESULTS/rank<rank>.jsonl``.
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
from megatron.core import parallel_state
from support.configs import GROUP_TIMEOUT_S
from support.probes import alive
from support.session import PlannedFailure, drive

from lifecycle import DistributedConfig, ParallelConfig, Session, TorchActions
from lifecycle.testing import release_everything

FAIL_STATES = ("dist_ready", "globals_ready", "training", "finalizing")
DELAY_S = 0.3  # how long rank 0 is surely blocked before rank 1 raises


def group_for(state: str) -> Any:
    """The group to run collectives on in ``state``: Megatron's data-parallel group once it exists."""
    return None if state == "dist_ready" else parallel_state.get_data_parallel_group()


def fail_in(state: str, rank: int) -> dict[str, Any]:
    """Rank 1 raises in ``state`` while rank 0 waits in an all-reduce; return what each rank saw."""
    session = Session(TorchActions(DistributedConfig(timeout_s=GROUP_TIMEOUT_S), ParallelConfig()))
    record: dict[str, Any] = {"fail_state": state}
    raised: BaseException | None = None
    failed_at = time.monotonic()
    try:
        with session:
            drive(session, state)
            # The group is looked up at each use, never kept in a local: with gloo, a
            # reference held in the failing frame would keep the group's connections open
            # (its abort does not close them), and rank 0 would wait for the timeout.
            dist.all_reduce(torch.ones(1), group=group_for(state))  # both ranks are in ``state`` now
            if rank == 1:
                time.sleep(DELAY_S)
                raised = PlannedFailure(state)
                failed_at = time.monotonic()
                raise raised
            blocked = time.monotonic()
            try:
                dist.all_reduce(torch.ones(8), group=group_for(state))  # rank 1 never joins this one
                record["all_reduce"] = "returned"
            except Exception:
                failed_at = time.monotonic()
                record["blocked_s"] = failed_at - blocked
                raise
    except BaseException as exc:  # noqa: BLE001 - recorded: what each rank saw is the result
        record["teardown_s"] = time.monotonic() - failed_at
        record["error"] = type(exc).__name__
        record["same_object"] = raised is None or exc is raised
    record["final_state"] = session.state.value
    record["alive"] = alive()
    record["plan"] = [str(step) for step in session.report.ran] if session.report else []
    return record


def succeed(rank: int) -> dict[str, Any]:
    """A session that trains (one real all-reduce) and closes on both ranks."""
    session = Session(TorchActions(DistributedConfig(timeout_s=GROUP_TIMEOUT_S), ParallelConfig()))
    with session:
        drive(session, "training")
        value = torch.ones(1)
        dist.all_reduce(value, group=parallel_state.get_data_parallel_group())
    return {"final_state": session.state.value, "sum": value.item(), "alive": alive()}


def main() -> int:
    """Run every scenario on this rank and write one JSON line per result."""
    rank = int(os.environ["RANK"])
    out = Path(os.environ["DIST_RESULTS"]) / f"rank{rank}.jsonl"
    with out.open("w") as sink:
        for state in FAIL_STATES:
            sink.write(json.dumps(fail_in(state, rank)) + "\n")
            sink.flush()
        sink.write(json.dumps(succeed(rank)) + "\n")
    release_everything()
    return 0


if __name__ == "__main__":
    sys.exit(main())
