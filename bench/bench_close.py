"""A healthy close: how long a session's success teardown takes, gloo groups freed in parallel or one by one.

Every rank runs ``ROUNDS`` sessions of each side in one process, rotating (a, b, c, c, b,
a, ...: each side runs first as often), each session Session + TorchActions with the default
``ParallelConfig`` (megatron-core's groups, no gloo twins on a gloo world): init, one
all-reduce on every group, close. Timed: the ``with`` block's exit, the success plan from
``finalize_checkpoints`` to ``restore_signal_handlers``; a row gives the median over
sessions of the slowest rank's time.
  (a) lifecycle: ``destroy_process_group`` frees the gloo groups in parallel (``groups.destroy_world``),
      and ``destroy_model_parallel`` megatron-core's gloo copies (``free_in_parallel``);
  (b) one by one: the same session with torch's ``dist.destroy_process_group()`` in its place and the
      copies left to megatron-core's destroy alone (as before);
  (c) floor: a bare gloo default group (no megatron-core), ``barrier`` then ``destroy_process_group``.
The rows "gloo copies" ask megatron-core for gloo copies of its data-parallel groups
(``create_gloo_process_groups=True``, the default on an nccl world), which its own destroy
destroys one by one.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import median, paired_ratio, spawn, table

ROUNDS = 8
"""Sessions of each side per process (even: each side runs first as often)."""
SIDES = ("lifecycle", "one by one", "floor")


def _rank(rank: int, world: int, port: int, queue: Any, bare_ports: list[int], copies: bool) -> None:
    import torch
    import torch.distributed as dist

    from lifecycle import DistributedConfig, ParallelConfig, Session, TorchActions
    from lifecycle._torch import actions, megatron_actions

    config = DistributedConfig(world_size=world, rank=rank, master_addr="127.0.0.1", master_port=port, timeout_s=30)
    parallel, held = actions.destroy_world, megatron_actions._gloo_copies
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    groups = 0
    for i in range(ROUNDS):
        for side in SIDES if i % 2 == 0 else SIDES[::-1]:
            if side == "floor":
                address = f"tcp://127.0.0.1:{bare_ports[i]}"
                dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
                dist.all_reduce(torch.ones(1))
                started = time.perf_counter()
                dist.barrier()
                dist.destroy_process_group()
                times[side].append(time.perf_counter() - started)
                continue
            ours = side == "lifecycle"
            actions.destroy_world = parallel if ours else dist.destroy_process_group  # type: ignore[assignment]
            megatron_actions._gloo_copies = held if ours else list  # type: ignore[assignment]
            with Session(TorchActions(config, ParallelConfig(create_gloo_process_groups=copies))) as session:
                session.init_distributed()
                session.init_globals()
                session.start_training()
                made = list(dist.distributed_c10d._world.pg_map)
                groups = len(made)
                for group in made:
                    if rank in dist.get_process_group_ranks(group):
                        dist.all_reduce(torch.ones(1), group=group)
                del made
                started = time.perf_counter()
            times[side].append(time.perf_counter() - started)
    queue.put((rank, groups, times))


def measure(world: int, copies: bool) -> list[object]:
    """One table row at ``world`` ranks (with megatron-core's gloo copies if ``copies``)."""
    from lifecycle.testing import free_port

    results = spawn(_rank, world, [free_port() for _ in range(ROUNDS)], copies, timeout_s=300)
    groups = results[0][1]
    slowest = {side: [max(r[2][side][i] for r in results) for i in range(ROUNDS)] for side in SIDES}
    life, serial, floor = (slowest[side] for side in SIDES)
    return [
        f"{world}, gloo copies" if copies else world,
        groups,
        f"{median(life) * 1e3:.0f}",
        f"{median(serial) * 1e3:.0f}",
        f"{median(floor) * 1e3:.0f}",
        f"{median(life) / median(serial):.2f}",
        f"{paired_ratio(life, serial):.2f}",
        f"{median(life) / median(floor):.1f}",
    ]


def main() -> str:
    """Measure at 2 and 4 ranks; return the Markdown table."""
    rows = [measure(world, copies) for world in (2, 4) for copies in (False, True)]
    return table(
        f"A healthy close (gloo, the default ParallelConfig; {ROUNDS} sessions of each side per process, rotating; "
        "median of the slowest rank's close; ms)",
        [
            "ranks",
            "groups",
            "(a) lifecycle",
            "(b) one by one",
            "(c) one bare group",
            "(a)/(b)",
            "(a)/(b) back to back",
            "(a)/(c)",
        ],
        rows,
    ) + (
        "\nWhat this shows: a session's success teardown (its barrier included) is mostly freeing "
        "process groups. A gloo group's destructor closes each connection on a tick of gloo's 10 ms "
        "socket loop; torch's `destroy_process_group()` drops the groups one after the other, a tick "
        "per group and peer, so (b) grows with megatron-core's groups and the ranks. (a) holds the "
        "gloo groups and frees them in parallel, one thread each, as the failure plan does: a few "
        "ticks in all; megatron-core's gloo copies, which its own destroy destroys one by one, it holds "
        "and frees the same way. (c) is the floor: one group, no megatron-core, its barrier and destroy.\n"
    )


if __name__ == "__main__":
    print(main())
