"""Collective positions (issue 40): what the wrappers cost a collective, measured side by side in one run.

Two ranks, gloo, one torch thread. Rank 0 measures, rank 1 answers the collectives:

1. **The wrapper alone.** A collective that does no communication (a function with
   ``all_reduce``'s signature that returns at once), called ``CALLS`` times bare and
   through ``Positions``' wrapper on the real default group (two reads of the group's
   counter and the page writes), in alternating blocks: the difference per call is the
   wrappers' own cost.
2. **A real all_reduce.** ``dist.all_reduce`` of a one-element tensor with the wrappers
   installed and uninstalled, in alternating blocks (``BLOCKS`` of ``CALLS`` each, the
   order turning each round): the ratio, against the noise floor (two unwrapped blocks
   against each other).
3. **Next to torch's own check.** The same all_reduce loop in two more pairs of processes,
   plain and with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (torch's collective fingerprint check:
   an extra collective per collective), one after the other (the setting is read when the
   group is created, so it cannot alternate within one group).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import median, paired_ratio, spawn, table

CALLS = 500
BLOCKS = 20


def _plain(rank: int, world: int, port: int, queue: Any, detail: bool) -> None:
    """One rank of table 3: the all_reduce loop alone, ``detail``: under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``."""
    if detail:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    tensor, times = torch.ones(1), []
    for _ in range(BLOCKS):
        dist.barrier()
        began = time.perf_counter()
        for _ in range(CALLS):
            dist.all_reduce(tensor)
        times.append((time.perf_counter() - began) / CALLS)
    dist.destroy_process_group()
    queue.put((rank, times))


def _rank(rank: int, world: int, port: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    from lifecycle._liveness.collectives import Positions
    from lifecycle._liveness.rank import Marks

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    marks = Marks()
    positions = Positions(marks)
    result: dict[str, Any] = {}
    if rank == 0:

        def bare(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> None:
            return None

        wrapped = positions._wrap("all_reduce", bare)
        positions.install()  # registers the default group; the bare function is never issued on it
        tensor = torch.ones(1)
        alone: list[tuple[float, float]] = []
        for _ in range(BLOCKS):
            began = time.perf_counter()
            for _ in range(CALLS):
                bare(tensor)
            middle = time.perf_counter()
            for _ in range(CALLS):
                wrapped(tensor)
            alone.append(((middle - began) / CALLS, (time.perf_counter() - middle) / CALLS))
        positions.uninstall()
        result["alone"] = alone
    dist.barrier()
    tensor = torch.ones(1)
    on: list[float] = []
    off: list[float] = []
    off2: list[float] = []
    for block in range(BLOCKS):
        order = (off, on, off2) if block % 2 == 0 else (off2, on, off)  # on is never always first or last
        for side in order:
            if side is on:
                positions.install()
            dist.barrier()
            began = time.perf_counter()
            for _ in range(CALLS):
                dist.all_reduce(tensor)
            side.append((time.perf_counter() - began) / CALLS)
            if side is on:
                positions.uninstall()
    result.update(on=on, off=off, off2=off2)
    marks.close()
    dist.destroy_process_group()
    queue.put((rank, result))


def main() -> str:
    """Run both measurements; return the Markdown tables."""
    results = dict(spawn(_rank, 2, timeout_s=600))
    measured = results[0]
    bare = [b for b, _ in measured["alone"]]
    wrapped = [w for _, w in measured["alone"]]
    extra_us = median([(w - b) * 1e6 for b, w in measured["alone"]])
    first = table(
        f"Positions: the wrapper alone ({BLOCKS} blocks of {CALLS} calls, 2 ranks, gloo)",
        ["call", "median per call", "wrapper's cost per collective"],
        [
            ["bare (no communication)", f"{median(bare) * 1e6:.2f} µs", ""],
            ["through the wrapper", f"{median(wrapped) * 1e6:.2f} µs", f"{extra_us:.2f} µs"],
        ],
    )
    on, off, off2 = measured["on"], measured["off"], measured["off2"]
    second = table(
        f"Positions: a real all_reduce of one element, on vs off ({BLOCKS} blocks of {CALLS}, alternating)",
        ["", "median per all_reduce", "ratio to off"],
        [
            ["off", f"{median(off) * 1e6:.1f} µs", "1.000"],
            ["positions on", f"{median(on) * 1e6:.1f} µs", f"{paired_ratio(on, off):.3f}"],
            ["off again (the noise floor)", f"{median(off2) * 1e6:.1f} µs", f"{paired_ratio(off2, off):.3f}"],
        ],
    )
    plain = dict(spawn(_plain, 2, False, timeout_s=600))[0]
    detail = dict(spawn(_plain, 2, True, timeout_s=600))[0]
    third = table(
        f"Positions next to TORCH_DISTRIBUTED_DEBUG=DETAIL (a one-element all_reduce, {BLOCKS} blocks of {CALLS})",
        ["", "median per all_reduce", "cost per collective"],
        [
            ["plain (its own processes)", f"{median(plain) * 1e6:.1f} µs", ""],
            ["TORCH_DISTRIBUTED_DEBUG=DETAIL", f"{median(detail) * 1e6:.1f} µs",
             f"{(median(detail) - median(plain)) * 1e6:+.1f} µs"],
            ["positions (table 1: the wrapper alone)", "", f"{extra_us:+.2f} µs"],
        ],
    )  # fmt: skip
    return first + "\n" + second + "\n" + third + "\n" + SHOWS + "\n"


SHOWS = (
    "What this shows (issue 40): the collective positions (docs/collectives.md) cost under 2 µs a collective on the "
    "caller's thread (two reads of the group's counter, two writes into the page, a lookup of the call site), no "
    "extra collective and no store call; on a real one-element gloo all_reduce (about 0.2 ms here) that is under 1% "
    "and the on/off ratio moves with the machine (0.94 to 1.09 in three runs of 2026-12-05, the noise floor 0.93 "
    "to 0.97). torch's own desync check, TORCH_DISTRIBUTED_DEBUG=DETAIL, adds a collective and a barrier to each "
    "collective: about a thousand times the wrappers' cost. The first version of the wrappers paid 5.4 µs (a lock, "
    "a weak dictionary lookup, a second counter read on every call)."
)


if __name__ == "__main__":
    print(main())
