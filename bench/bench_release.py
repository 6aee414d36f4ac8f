"""Release after a rank-local failure: how long until every rank has left teardown.

One rank raises while every other rank is blocked in an all-reduce. Measured from the
raise until the last rank has left its cleanup, on gloo, for:
  (a) lifecycle: Session + TorchActions with the default ``ParallelConfig`` (failure plan
      on every rank: abort the groups, no barrier);
  (b) naive: cleanup calls barrier() then destroy_process_group() (bounded here by a
      short group timeout: with gloo's default it would be 30 minutes);
  (c) floor: the failing rank just exits; the others leave as soon as they notice.
A second row per world size runs (a) with Megatron-core's gloo copies of the
data-parallel groups (``create_gloo_process_groups=True``) and the failing rank's
all-reduce still pending on one of them when it raises: Megatron's own destroy would
wait the group timeout on it; the failure plan aborts the groups first.
(a) and (c) alternate (a, c, c, a, a, c, c, a: each runs first as often), so that load
from elsewhere hits both alike; (b) runs once, it only shows the order of
magnitude. For (a) the failing rank's own teardown is also reported: from its raise
until it has left its cleanup (the failure plan, run by ``Session.__exit__``).
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import median, paired_ratio, spawn, table

FAILING_RANK = 1
NAIVE_TIMEOUT_S = 5.0
PAIRS = 4
"""(a), (c) pairs per world size (even: each side runs first as often)."""
TARGET_RATIO = 3.0
"""Target for (a)/(c): every rank has left its cleanup within 3× the time a crash takes."""
OWN_AIM_MS = 50.0
"""Aim for the failing rank's own teardown."""


def _rank(rank: int, world: int, port: int, queue: Any, variant: str) -> None:
    import torch
    import torch.distributed as dist

    stamp = {"raised": float("nan")}
    try:
        if variant.startswith("lifecycle"):
            # Imported here only: megatron-core takes seconds of CPU to import, in every rank.
            from megatron.core import parallel_state

            from lifecycle import DistributedConfig, ParallelConfig, Session, TorchActions

            config = DistributedConfig(
                world_size=world, rank=rank, master_addr="127.0.0.1", master_port=port, timeout_s=NAIVE_TIMEOUT_S
            )
            copies = variant == "lifecycle-copies"
            with Session(TorchActions(config, ParallelConfig(create_gloo_process_groups=copies))) as session:
                session.init_distributed()
                session.init_globals()
                session.start_training()
                dist.barrier()
                if copies and rank == FAILING_RANK:  # work the others never join, pending when it raises
                    dist.all_reduce(torch.ones(4), group=parallel_state.get_data_parallel_group_gloo(), async_op=True)
                _work(rank, dist, torch, queue, stamp)
        else:
            store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=NAIVE_TIMEOUT_S))
            dist.init_process_group(
                "gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=NAIVE_TIMEOUT_S)
            )
            dist.barrier()
            try:
                _work(rank, dist, torch, queue, stamp, exit_instead=variant == "floor")
            except Exception:
                if variant == "naive":
                    try:
                        dist.barrier()
                    finally:
                        dist.destroy_process_group()
                raise
    except Exception:  # noqa: BLE001 - every rank reports when it left, whatever it raised
        pass
    queue.put((rank, stamp["raised"], time.time()))


def _work(rank: int, dist: Any, torch: Any, queue: Any, stamp: dict[str, float], exit_instead: bool = False) -> None:
    if rank == FAILING_RANK:
        time.sleep(0.3)  # let the others block in the all-reduce
        raised_at = stamp["raised"] = time.time()
        if exit_instead:
            import os

            queue.put((rank, raised_at, raised_at))
            queue.close()
            queue.join_thread()
            os._exit(1)
        raise RuntimeError("rank-local failure")
    dist.all_reduce(torch.ones(4))


def run_once(world: int, variant: str) -> tuple[float, float]:
    """One run: seconds from the raise to the last rank leaving cleanup, and to the failing rank leaving it."""
    results = spawn(_rank, world, variant, timeout_s=60)
    raised_at, failing_left = next((r[1], r[2]) for r in results if r[0] == FAILING_RANK)
    return max(r[2] for r in results) - raised_at, failing_left - raised_at


def measure(world: int, lifecycle: str, naive: float) -> list[object]:
    """One table row: (a) as ``lifecycle`` and (c) alternating ``PAIRS`` times; ``naive`` is (b)'s time."""
    life: list[float] = []
    own: list[float] = []
    floor: list[float] = []
    for i in range(PAIRS):
        for variant in (lifecycle, "floor") if i % 2 == 0 else ("floor", lifecycle):
            everyone, failing = run_once(world, variant)
            if variant == lifecycle:
                life.append(everyone)
                own.append(failing)
            else:
                floor.append(everyone)
    ratio = median(life) / median(floor)
    return [
        world if lifecycle == "lifecycle" else f"{world}, gloo copies, work pending",
        f"{median(life):.3f}",
        f"{naive:.3f}",
        f"{median(floor):.3f}",
        f"{ratio:.2f}",
        f"{paired_ratio(life, floor):.2f}",
        f"≤ {TARGET_RATIO:.0f}",
        f"{median(life) / naive:.3f}",
        f"{median(own) * 1e3:.0f}",
        f"≤ {OWN_AIM_MS:.0f}",
    ]


def main() -> str:
    """Run every variant at 2 and 4 ranks; return the Markdown table."""
    rows = []
    for world in (2, 4):
        naive, _ = run_once(world, "naive")
        rows += [measure(world, variant, naive) for variant in ("lifecycle", "lifecycle-copies")]
    return table(
        f"Release after a rank-local failure (gloo, group timeout {NAIVE_TIMEOUT_S:.0f} s, "
        f"median of {PAIRS} interleaved runs of (a) and (c), one of (b); seconds unless marked)",
        [
            "ranks",
            "(a) lifecycle",
            "(b) barrier then destroy",
            "(c) failing rank exits",
            "(a)/(c)",
            "(a)/(c) back to back",
            "target (a)/(c)",
            "(a)/(b)",
            "(a) failing rank's own teardown (ms)",
            "aim (ms)",
        ],
        rows,
    ) + (
        "\nWhat this shows: how long the ranks stay stuck after one rank raised while the "
        "others wait in an all-reduce, measured from the raise until the last rank has left "
        "its cleanup. (c) is the floor: the failing process simply exits and the others leave "
        "when they notice. (a)/(c) is how much longer than such a crash the lifecycle's "
        "failure teardown keeps the ranks (all of them: the failing one, and the others, which "
        "get a connection error and run their own failure teardown); the target is 3. The "
        "failing rank's own teardown is its share: from its raise until it has left its "
        "cleanup. Most of a teardown is freeing process groups: a gloo group's connections "
        "close when the group is freed, and each close waits for a tick of gloo's 10 ms socket "
        "loop. The lifecycle frees the groups in parallel and, with the default "
        "`ParallelConfig`, creates no gloo twins of groups that are gloo already, so a "
        "teardown costs a few ticks (about one per peer, plus one) however many groups "
        "megatron-core made (one after the other, it cost about one per group and peer). The "
        "rows with gloo copies and work pending on one: Megatron's own destroy would destroy "
        "the copy gracefully and wait the group timeout on that work; the failure plan aborts "
        "every Megatron group first. (b), "
        "a cleanup that calls `barrier()`, holds every "
        f"rank until the group timeout ({NAIVE_TIMEOUT_S:.0f} s here, 30 minutes with gloo's "
        "default), so (a)/(b) is tiny.\n"
    )


if __name__ == "__main__":
    print(main())
