"""One rank of ``test_a_kept_traceback_does_not_keep_the_peer_blocked``: rank 1 fails inside a torch collective.

Rank 0 waits in an all-reduce on Megatron's data-parallel group that rank 1 never
joins. Rank 1 calls the same collective wrongly, so torch raises from a frame whose
locals hold that group, and keeps the exception and its traceback alive afterwards, as
a notebook does (``sys.last_traceback``). Each rank writes one JSON line to
``$RESULTS/rank<rank>.json``: how long rank 0 stayed blocked, and (rank 1) the
connections it still had open one second after its teardown.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from support.configs import GROUP_TIMEOUT_S

from lifecycle import DistributedConfig, ParallelConfig, Session, TorchActions

rank = int(os.environ["RANK"])
session = Session(TorchActions(DistributedConfig(timeout_s=GROUP_TIMEOUT_S), ParallelConfig()))
record: dict[str, object] = {}
try:
    with session:
        session.init_distributed()
        session.init_globals()
        session.start_training()
        group = parallel_state.get_data_parallel_group()
        if rank == 0:
            start = time.monotonic()
            try:
                dist.all_reduce(torch.ones(1), group=group)
            finally:
                record["blocked_s"] = time.monotonic() - start
        else:
            time.sleep(0.3)  # rank 0 is surely waiting
            del group
            dist.all_reduce(torch.ones(1), op="not an op", group=parallel_state.get_data_parallel_group())  # type: ignore[arg-type]
except Exception as exc:  # noqa: BLE001 - the point: keep it, traceback and all
    sys.last_value, sys.last_traceback = exc, exc.__traceback__
    record["error"] = type(exc).__name__
    record["notes"] = getattr(exc, "__notes__", [])
time.sleep(1.0)
mine = os.getpid()
record["connections"] = [
    c.raddr[1] for c in psutil.Process(mine).net_connections(kind="tcp") if c.raddr and c.status == "ESTABLISHED"
]
record["state"] = session.state.value
Path(os.environ["RESULTS"], f"rank{rank}.json").write_text(json.dumps(record))
