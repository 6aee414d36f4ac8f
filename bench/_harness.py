"""Shared helpers for the benchmarks: free ports, spawning ranks, printing tables."""

from __future__ import annotations

import logging
import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "error")
# megatron-core logs "RerunStateMachine initialized ..." as a warning on every session.
logging.getLogger("megatron.core.rerun_state_machine").setLevel(logging.ERROR)


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120.0) -> list[Any]:
    """Run ``fn(rank, world_size, port, queue, *args)`` in ``world_size`` processes; return what each put on the queue.

    Every rank must put exactly one item. Processes still alive after ``timeout_s`` are killed.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    from lifecycle.testing import free_port

    port = free_port()
    procs = [ctx.Process(target=fn, args=(rank, world_size, port, queue, *args)) for rank in range(world_size)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=timeout_s) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return results


def median(values: Sequence[float]) -> float:
    """The median of ``values``."""
    return statistics.median(values)


def fast_mean(values: Sequence[float], keep: float = 0.9) -> float:
    """The mean of the fastest ``keep`` share of ``values``: drops the stalls another process causes."""
    kept = sorted(values)[: max(1, round(len(values) * keep))]
    return statistics.fmean(kept)


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """The median of ``a[i] / b[i]``: each pair ran back to back, so a burst of load hits both."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table under a ``### title`` heading."""
    out = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def raw_release() -> None:
    """Release by hand what a session acquires: rerun state machine, calculator, Megatron state, default group."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.num_microbatches_calculator import destroy_num_microbatches_calculator
    from megatron.core.rerun_state_machine import destroy_rerun_state_machine

    destroy_rerun_state_machine()
    destroy_num_microbatches_calculator()
    parallel_state.destroy_model_parallel()
    parallel_state.destroy_global_memory_buffer()
    # megatron-core 0.16.1 leaves these two set after destroy_model_parallel.
    parallel_state._INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP = None
    parallel_state._INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO = None
    dist.destroy_process_group()
