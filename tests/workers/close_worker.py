"""One rank of ``test_a_healthy_close_frees_the_gloo_groups_in_parallel``: two sessions in a row.

Each session trains one all-reduce on every group it made (megatron-core's included) and
closes; the second also has megatron-core's gloo copies of its data-parallel groups, which
megatron-core's own destroy destroys one by one. A weak reference to each group records
the thread that dropped its last reference, which is the thread that ran gloo's
destructor (its socket loop's ticks). Prints one JSON line, ``{"sessions": [...]}``: per
session, its final state, whether a default group is left, how many groups it made, how
many are still alive after the close (and its freeing threads still running, ``late``,
waited for), and the threads that freed them.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from typing import Any

import torch
import torch.distributed as dist
from support.configs import GROUP_TIMEOUT_S

from lifecycle import DistributedConfig, ParallelConfig, Session, TorchActions

rank = int(os.environ["RANK"])


def one_session(parallel: ParallelConfig) -> dict[str, Any]:
    """Train on every group, close, and say what became of the groups."""
    freed: dict[int, str] = {}
    refs: list[weakref.ref[Any]] = []
    session = Session(TorchActions(DistributedConfig(timeout_s=GROUP_TIMEOUT_S), parallel))
    with session:
        session.init_distributed()
        session.init_globals()
        session.start_training()
        groups = list(dist.distributed_c10d._world.pg_map)
        backends = {str(dist.distributed_c10d._world.pg_map[group][0]) for group in groups}
        for index, group in enumerate(groups):
            if rank in dist.get_process_group_ranks(group):
                dist.all_reduce(torch.ones(1), group=group)
            refs.append(weakref.ref(group, lambda _, i=index: freed.setdefault(i, threading.current_thread().name)))
        del group, groups
    # The close waits up to 1 s for them (groups.FREE_WAIT_S); a loaded machine may take longer: wait, bounded.
    late = [t for t in threading.enumerate() if t.name == "lifecycle-free-group"]
    for thread in late:
        thread.join(30)
    return {
        "state": session.state.value,
        "initialized": dist.is_initialized(),
        "groups": len(refs),
        "backends": sorted(backends),
        "alive": sum(ref() is not None for ref in refs),
        "threads": sorted(set(freed.values())),
        "freed": len(freed),
        "late": len(late),
    }


sessions = [one_session(ParallelConfig()), one_session(ParallelConfig(create_gloo_process_groups=True))]
print(json.dumps({"sessions": sessions}), flush=True)
