"""Retry cycle: failure + teardown of a session that reached ``training``, against raw calls.

World size 1, gloo, one process. Cycles rotate through (a) the lifecycle, (b) raw and
(b') raw once more, each taking every position in turn, so that drift hits all alike;
(b')/(b) is the noise floor, how far from 1 a ratio lands for identical work.

(a) lifecycle: ``Session(TorchActions(...))`` as a context manager: ``init_distributed``
    (validate the config, a fresh ``TCPStore`` on a free port wrapped in a per-attempt
    ``PrefixStore``, ``init_process_group``), ``init_globals`` (``initialize_model_parallel``
    without gloo twins, the default on a gloo world; the microbatch calculator, the rerun
    state machine),
    ``start_training``; then a ``RuntimeError`` is raised in the block and the failure
    plan releases everything: rerun state machine, microbatch calculator,
    ``destroy_model_parallel`` + the global memory buffer + the two group references
    megatron-core 0.16.1 leaves behind, then ``_abort_process_group``, the groups freed in
    parallel threads (``lifecycle._torch.groups.abort_group``).
(b) raw: the same acquisitions with the same arguments (fresh store with the same
    timeout, same sizes, ``create_gloo_process_groups=False``, the same subgroup
    timeout), the same exception raised and caught, and the same releases by hand,
    ending in ``destroy_process_group``, which frees the groups one after the other.

The raw side clears megatron's leftover ``_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP``
references (and their gloo twin) too. Without that the raw side only defers work: the
next ``initialize_model_parallel`` overwrites them and pays for freeing those two
groups, and with interleaved cycles that next call is the lifecycle's.
An earlier version of this benchmark had that gap (and lacked
``destroy_global_memory_buffer``) and measured a ratio of 1.12. Timed on its own, what
only the lifecycle does costs about 0.6 ms a cycle: a whole failed session on recording
doubles (state machine, ledger, plan, executor, journal) about 0.4 ms, the scan for
leftover group references about 0.1 ms, config validation and the store prefix a few µs.
Aborting the default group (``_abort_process_group``) instead of destroying it costs the
same on gloo: both unregister every group and free it; what differs is that the
lifecycle frees them in parallel.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import fast_mean, median, paired_ratio, raw_release, table

CYCLES = 45
TIMEOUT_S = 60.0  # DistributedConfig's default, used by both sides


def lifecycle_cycle() -> float:
    """One failed session and its teardown; seconds."""
    from lifecycle import DistributedConfig, ParallelConfig, Session, TorchActions

    start = time.perf_counter()
    try:
        config = DistributedConfig(world_size=1, rank=0, timeout_s=TIMEOUT_S)
        with Session(TorchActions(config, ParallelConfig())) as session:
            session.init_distributed()
            session.init_globals()
            session.start_training()
            raise RuntimeError("fail")
    except RuntimeError:
        pass
    return time.perf_counter() - start


def raw_cycle() -> float:
    """The same acquisitions, failure and releases written by hand; seconds."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.num_microbatches_calculator import (
        init_num_microbatches_calculator,
    )
    from megatron.core.rerun_state_machine import (
        RerunMode,
        initialize_rerun_state_machine,
    )

    start = time.perf_counter()
    timeout = timedelta(seconds=TIMEOUT_S)
    try:
        store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout, wait_for_workers=False)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timeout)
        try:
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=1,
                pipeline_model_parallel_size=1,
                context_parallel_size=1,
                distributed_timeout_minutes=TIMEOUT_S / 60,
                create_gloo_process_groups=False,
            )
            init_num_microbatches_calculator(0, None, 1, 1, 1)
            initialize_rerun_state_machine(mode=RerunMode.DISABLED)
            raise RuntimeError("fail")
        finally:
            raw_release()
            del store
    except RuntimeError:
        pass
    return time.perf_counter() - start


def main() -> str:
    """Rotate lifecycle, raw, raw again; return the Markdown table and what it shows."""
    lifecycle_cycle(), raw_cycle()  # warm up imports and first-time setup
    cycles: dict[str, list[float]] = {"life": [], "raw": [], "again": []}
    sides = {"life": lifecycle_cycle, "raw": raw_cycle, "again": raw_cycle}
    order = list(sides)
    for i in range(CYCLES):
        for name in order[i % 3 :] + order[: i % 3]:  # each side takes each position in turn
            cycles[name].append(sides[name]())
    life, raw, again = cycles["life"], cycles["raw"], cycles["again"]
    rows = [
        [
            name,
            f"{stat(life) * 1e3:.1f}",
            f"{stat(raw) * 1e3:.1f}",
            f"{stat(life) / stat(raw):.3f}",
            f"{stat(again) / stat(raw):.3f}",
        ]
        for name, stat in (("median", median), ("mean of the fastest 90%", fast_mean))
    ]
    rows.append(
        ["median of back-to-back ratios", "–", "–", f"{paired_ratio(life, raw):.3f}", f"{paired_ratio(again, raw):.3f}"]
    )
    return table(
        f"Retry cycle (world size 1, gloo, {CYCLES} cycles of each side, rotating; ms)",
        [
            "statistic",
            "lifecycle: acquire, fail, teardown",
            "raw: the same by hand",
            "lifecycle ÷ raw (target ≤ 1.10)",
            "raw again ÷ raw (noise floor)",
        ],
        rows,
    ) + (
        "\nWhat this shows: the cost of one failed attempt before the retry can start. Both "
        "sides create and release the same default group, the same megatron-core groups "
        "(gloo, without gloo twins: the default on a gloo world) and globals, and raise the "
        "same exception; what only the lifecycle does is its bookkeeping (state machine, "
        "ledger, teardown plan, journal, store prefix), under 1 ms of a cycle when timed on "
        "its own. Most of a cycle is creating and freeing megatron-core's 18 gloo groups, on "
        "both sides; without the gloo twins a cycle takes about a third of the time it took "
        "with them, so the same bookkeeping is a larger share of it. Freeing a group waits on "
        "gloo's socket loop, which ticks every 10 ms, at random on both sides alike, so cycle "
        "times cluster around a few values; a median can land on either, and the ratio of "
        "medians can swing from one run to the next. The mean of the fastest 90% and the "
        "back-to-back ratios are steadier. The last column gives each statistic for the raw "
        "cycle against itself: how far from 1 identical work lands.\n"
    )


if __name__ == "__main__":
    print(main())
