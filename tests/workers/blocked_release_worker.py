"""One rank of ``tests/distributed/test_bounded_waits.py``'s test of a release blocked inside torch.

Both ranks drive a session to ``training`` and meet in an all-reduce. Rank 1 then
stops itself (SIGSTOP). Rank 0 closes its session: the success plan's barrier blocks
inside gloo, waiting for the stopped peer. Rank 0 sends itself SIGINT twice, 1 s apart,
while it waits; the second one abandons the teardown. Then rank 0 starts a session on a
world of one, which reclaims what the abandoned teardown left, and kills rank 1.
Rank 0 writes ``$RESULTS/rank0.json``: when each SIGINT went, when ``close()`` returned
and with what, the abandoned session's state and report, what the next session
reclaimed, and what was left alive.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from support.probes import record_run
from support.session import drive

from lifecycle import DistributedConfig, ParallelConfig, Session, State, TorchActions
from lifecycle.testing import free_port

GROUP_TIMEOUT_S = 8.0
"""Longer than the SIGINTs take (the barrier is still blocked then); short enough that the barrier left
running ends (at the timeout: an aborted gloo group's pending work does not see its peer die) within the
5 s the process waits at exit for it (``lifecycle._core.worker.EXIT_WAIT_S``)."""
FIRST_S, SECOND_S = 1.0, 2.0
"""When the SIGINTs go, after ``close()`` started."""


def interrupt_later(sent: list[float]) -> threading.Thread:
    """A thread that sends this process SIGINT at ``FIRST_S`` and ``SECOND_S``, appending when each went."""

    def run() -> None:
        start = time.monotonic()
        for at in (FIRST_S, SECOND_S):
            time.sleep(max(0.0, start + at - time.monotonic()))
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def rank0(record: dict[str, Any], results: Path) -> None:
    """Close a session whose barrier blocks on the stopped peer; two SIGINTs; then the next session."""
    session = Session(TorchActions(DistributedConfig(timeout_s=GROUP_TIMEOUT_S), ParallelConfig()), label="rank 0")
    drive(session, State.TRAINING)
    dist.all_reduce(torch.ones(1))
    peer = int((results / "pid1").read_text())
    time.sleep(0.5)  # rank 1 has stopped itself by now
    session.finish()
    sent: list[float] = []
    interrupt_later(sent)
    try:
        session.close()
    except BaseException as exc:  # noqa: BLE001 - what close() raised is the result
        record["returned_after_second_s"] = time.monotonic() - sent[-1] if len(sent) == 2 else None
        record["raised"] = type(exc).__name__
        record["notes"] = getattr(exc, "__notes__", [])
    record["sent"] = len(sent)
    record["state"] = session.state.value
    report = session.report
    assert report is not None
    record["left_running"] = [str(step) for step in report.left_running]
    record["abandoned"] = [str(step) for step in report.abandoned]
    record["held"] = sorted(entry.resource.value for entry in session.ledger.held())
    one = DistributedConfig(world_size=1, rank=0, master_addr="127.0.0.1", master_port=free_port(), timeout_s=10.0)
    with Session(TorchActions(one, ParallelConfig()), label="next") as following:
        drive(following, State.TRAINING)
        value = torch.tensor([2.0])
        dist.all_reduce(value)
        record["next_sum"] = value.item()
        record["reclaimed"] = [str(step.step) for step in following.reclaimed]
    record["next_state"] = following.state.value
    record["next_done_s"] = time.monotonic() - sent[0]
    os.kill(peer, signal.SIGKILL)


def main() -> int:
    """Run this rank's part; rank 0 writes its record."""
    rank = int(os.environ["RANK"])
    results = Path(os.environ["RESULTS"])
    if rank == 1:
        session = Session(TorchActions(DistributedConfig(timeout_s=GROUP_TIMEOUT_S), ParallelConfig()), label="rank 1")
        drive(session, State.TRAINING)
        (results / "pid1").write_text(str(os.getpid()))
        dist.all_reduce(torch.ones(1))
        os.kill(os.getpid(), signal.SIGSTOP)  # killed by rank 0 while stopped
        return 1
    return record_run(lambda record: rank0(record, results), results / "rank0.json")


if __name__ == "__main__":
    sys.exit(main())
