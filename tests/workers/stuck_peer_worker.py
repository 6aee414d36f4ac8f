"""One rank of ``test_a_failing_rank_tears_down_and_releases_a_peer_stuck_in_a_collective``; RANK etc. set.

Both ranks drive a session to ``training`` and meet in one all-reduce on the default
group. Then rank 0 waits in a second all-reduce on the default group that rank 1 never
joins, and rank 1 raises inside its session. Each rank writes ``$RESULTS/rank<rank>.json``:
what reached it, when (wall clock, comparable between the two ranks on one host), how
long its failure teardown took, its final state and what is still alive.
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
from support.configs import GROUP_TIMEOUT_S
from support.session import PlannedFailure

from lifecycle import DistributedConfig, ParallelConfig, Session, TorchActions
from lifecycle.testing import alive

DELAY_S = 0.3
"""How long rank 1 waits before it raises: rank 0 is surely blocked by then."""


def main() -> int:
    """Run this rank's part and write its record."""
    rank = int(os.environ["RANK"])
    session = Session(
        TorchActions(DistributedConfig(timeout_s=GROUP_TIMEOUT_S), ParallelConfig()), label=f"rank {rank}"
    )
    record: dict[str, Any] = {"rank": rank, "error": None}
    raised: BaseException | None = None
    failed_at: float | None = None
    try:
        with session:
            session.init_distributed()
            session.init_globals()
            session.start_training()
            dist.all_reduce(torch.ones(1))  # both ranks are in training now
            if rank == 1:
                time.sleep(DELAY_S)
                raised = PlannedFailure("rank 1 fails while rank 0 waits")
                record["raised_at"] = time.time()
                failed_at = time.monotonic()
                raise raised
            start = time.monotonic()
            try:
                dist.all_reduce(torch.ones(8))  # the default group; rank 1 never joins
                record["all_reduce"] = "returned"
            except Exception:
                failed_at = time.monotonic()
                record["error_at"] = time.time()
                record["blocked_s"] = failed_at - start
                raise
    except BaseException as exc:  # noqa: BLE001 - recorded: what reached each rank is the result
        record["teardown_s"] = None if failed_at is None else time.monotonic() - failed_at
        record["error"] = type(exc).__name__
        record["same_object"] = raised is None or exc is raised
    record["state"] = session.state.value
    record["alive"] = alive()
    Path(os.environ["RESULTS"], f"rank{rank}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
