"""Release after a rank-local failure: how long until every rank has left teardown.

One rank raises while every other rank is blocked in an all-reduce. Measured from the
raise until the last rank has left its cleanup, on gloo, for:
  (a) lifecycle: Session + TorchActions (failure plan: abort the group, no barrier);
  (b) naive: cleanup calls barrier() then destroy_process_group() (bounded here by a
      short group timeout: with gloo's default it would be 30 minutes);
  (c) floor: the failing rank just exits; the others leave as soon as they notice.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import median, spawn, table

FAILING_RANK = 1
NAIVE_TIMEOUT_S = 5.0


def _rank(rank: int, world: int, port: int, queue: Any, variant: str) -> None:
    import torch
    import torch.distributed as dist

    stamp = {"raised": float("nan")}
    try:
        if variant == "lifecycle":
            # Imported here only: megatron-core takes seconds of CPU to import, in every rank.
            from lifecycle import DistributedConfig, ParallelConfig, Session, TorchActions

            config = DistributedConfig(
                world_size=world, rank=rank, master_addr="127.0.0.1", master_port=port, timeout_s=NAIVE_TIMEOUT_S
            )
            with Session(TorchActions(config, ParallelConfig())) as session:
                session.init_distributed()
                session.init_globals()
                session.start_training()
                dist.barrier()
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


def measure(world: int, variant: str, repeats: int) -> float:
    """Median seconds from the raise to the last rank leaving cleanup."""
    times = []
    for _ in range(repeats):
        results = spawn(_rank, world, variant, timeout_s=60)
        raised_at = next(r[1] for r in results if r[0] == FAILING_RANK)
        times.append(max(r[2] for r in results) - raised_at)
    return median(times)


def main() -> str:
    """Run every variant at 2 and 4 ranks; return the Markdown table."""
    rows = []
    for world in (2, 4):
        life = measure(world, "lifecycle", 3)
        floor = measure(world, "floor", 3)
        naive = measure(world, "naive", 1)
        rows.append(
            [world, f"{life:.3f}", f"{naive:.3f}", f"{floor:.3f}", f"{life / floor:.2f}", f"{life / naive:.3f}"]
        )
    return table(
        f"Release after a rank-local failure (gloo, group timeout {NAIVE_TIMEOUT_S:.0f} s, seconds)",
        ["ranks", "(a) lifecycle", "(b) barrier then destroy", "(c) failing rank exits", "(a)/(c)", "(a)/(b)"],
        rows,
    ) + (
        "\nWhat this shows: how long the ranks that did not fail stay stuck after one rank "
        "raised while they wait in an all-reduce, measured from the raise until the last "
        "rank has left its cleanup. (c) is the floor: the failing process simply exits. "
        "(a)/(c) is how much longer than such a crash the lifecycle's failure teardown keeps "
        "the other ranks waiting (both well under a second); (b), a cleanup that calls "
        "`barrier()`, holds every rank until the group timeout "
        f"({NAIVE_TIMEOUT_S:.0f} s here, 30 minutes with gloo's default), so (a)/(b) is tiny.\n"
    )


if __name__ == "__main__":
    print(main())
