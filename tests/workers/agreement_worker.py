"""One rank of ``tests/distributed/test_agreement.py``: ranks that disagree, and a store host that fails.

``python agreement_worker.py SCENARIO OUT_DIR``, with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set. Each rank writes one JSON object to ``OUT_DIR/rank<rank>.json``.

- ``behind``: rank 1 fails at once in its first attempt while rank 0 is still in a long
  setup; rank 1's second attempt gives up (its timeout is shorter than rank 0's setup),
  so it has made two attempts rank 0 never made. Both retry until one closes.
- ``host-fails``: rank 0, which hosts the store, fails inside the group's creation; rank
  1 is waiting in the rendezvous. Then both retry with the roles swapped (the process
  that was rank 1 is rank 0 and hosts on the same port), and close.
- ``host-lingers``: rank 1 closes its first session and starts its second while rank
  0 still holds its first session's store; both second sessions must close.
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
from support.session import PlannedFailure

from lifecycle import DistributedConfig, ParallelConfig, Session, TorchActions
from lifecycle.testing import sockets

SETUP_S = 6.0  # rank 0's first setup, longer than rank 1's timeout
SHORT_TIMEOUT_S = 4.0
LINGER_S = 2.0  # how long rank 0 keeps its first session's store after rank 1 closed its own


def listening(port: int) -> bool:
    """True if this process listens on ``port``."""
    return any(s.status == "LISTEN" and s.local[1] == port for s in sockets())


def attempt(config: DistributedConfig, work: Any) -> dict[str, Any]:
    """One session: init, ``work(actions)``, an all-reduce, close; return what happened."""
    actions = TorchActions(config, ParallelConfig())
    started = time.monotonic()
    record: dict[str, Any] = {"rank": config.rank}
    try:
        with Session(actions) as session:
            session.init_distributed()
            record["prefix"] = actions.store_prefix
            record["attempt"] = getattr(actions, "attempt", None)
            work(actions)
            dist.all_reduce(torch.ones(1))
            session.init_globals()
            session.start_training()
            session.finish()
        record["state"] = session.state.value
    except Exception as exc:  # noqa: BLE001 - reported to the test
        record.update(state="failed", error=type(exc).__name__, message=str(exc), notes=getattr(exc, "__notes__", []))
    record["seconds"] = time.monotonic() - started
    return record


def behind(rank: int, port: int) -> dict[str, Any]:
    """Rank 1 makes two attempts rank 0 does not; every rank retries until an attempt closes."""
    timeout = 20.0 if rank == 0 else SHORT_TIMEOUT_S
    config = DistributedConfig(world_size=2, rank=rank, master_addr="127.0.0.1", master_port=port, timeout_s=timeout)
    attempts: list[dict[str, Any]] = []

    def work(actions: TorchActions) -> None:
        if rank == 0 and len(attempts) == 0:
            time.sleep(SETUP_S)  # still in setup when rank 1 fails and retries
        if rank == 1 and len(attempts) == 0:
            raise PlannedFailure("rank 1 fails at once")

    for _ in range(6):
        attempts.append(attempt(config, work))
        if attempts[-1]["state"] == "closed":
            break
    return {"attempts": attempts, "listening_after": listening(port)}


def host_fails(rank: int, port: int) -> dict[str, Any]:
    """Rank 0 fails inside the group's creation while rank 1 waits in the rendezvous; then roles swap."""
    config = DistributedConfig(world_size=2, rank=rank, master_addr="127.0.0.1", master_port=port, timeout_s=30.0)
    first: dict[str, Any]
    if rank == 0:
        real = dist.init_process_group

        def failing(**kwargs: Any) -> None:
            time.sleep(0.5)  # rank 1 is in the rendezvous by now
            kwargs.clear()  # this frame stays in the traceback: it must not hold the store as torch's would
            raise PlannedFailure("rank 0 fails while creating its group")

        dist.init_process_group = failing  # type: ignore[assignment]
        try:
            first = attempt(config, lambda actions: None)
        finally:
            dist.init_process_group = real
    else:
        first = attempt(config, lambda actions: None)
    first["listening_after"] = listening(port)
    # Roles move: the process that was rank 1 now hosts the store on the same port.
    swapped = DistributedConfig(world_size=2, rank=1 - rank, master_addr="127.0.0.1", master_port=port, timeout_s=30.0)
    second = attempt(swapped, lambda actions: None)
    second["listening_after"] = listening(port)
    return {"first": first, "second": second}


def host_lingers(rank: int, port: int) -> dict[str, Any]:
    """Rank 1 closes and starts its next session while rank 0 still holds its first session's store."""
    config = DistributedConfig(world_size=2, rank=rank, master_addr="127.0.0.1", master_port=port, timeout_s=20.0)
    close_store = TorchActions.close_store

    def slow_close_store(actions: TorchActions) -> None:
        time.sleep(LINGER_S)  # a slow teardown: rank 1 has closed and started its next session
        close_store(actions)

    if rank == 0:
        TorchActions.close_store = slow_close_store  # type: ignore[method-assign]
    try:
        sessions = [attempt(config, lambda actions: None)]
    finally:
        TorchActions.close_store = close_store  # type: ignore[method-assign]
    sessions.append(attempt(config, lambda actions: None))
    return {"sessions": sessions, "listening_after": listening(port)}


def main() -> None:
    """Run the scenario named by argv[1]; write this rank's result to argv[2]/rank<rank>.json."""
    scenario, out = sys.argv[1], Path(sys.argv[2])
    rank, port = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"])
    result = {"behind": behind, "host-fails": host_fails, "host-lingers": host_lingers}[scenario](rank, port)
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
