"""Issue 41's costs: the non-finite loss check per step, and the stall of a failed save against a committed one.

Non-finite check. ``pretrain`` decides on the loss in the all-reduce every step already
runs: each step adds three float64s to that all-reduce (6 instead of 3), one
``math.isfinite`` and one ``NonfiniteGuard.apply``. The loop cannot run without it, so
the two sides are timed apart, in one world-1 gloo group: (a) ``pretrain``'s step (400
steps of the default tiny model, 1 torch thread, wall seconds / steps, median of 5 runs); (b) the step's
reduction with the check (6 values, isfinite, apply) minus the same without it (3
values), median of 7 rounds of 5000 each. The cost ratio is (a + b) / a (target ≤ 1.01).

Save stall. What ``finalize()`` costs the training loop when the save it commits
succeeded against when the rank's write failed at once (``ENOSPC`` at the writer's
seam): ``save()`` of 16 MiB (16 tensors), the write given time to end, then the
``finalize()`` timed; world size 1 without a process group, median of 9 rotating runs.
A write hung past ``write_timeout_s`` stalls the commit by that bound, by design.
"""

from __future__ import annotations

import errno
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib

from _harness import table

STEPS = 400


def step_seconds() -> float:
    """``pretrain``'s wall seconds per step (world 1, the default tiny model, no checkpoints), median of 5 runs."""
    import torch
    from bench_pretrain import lifecycle_run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as bench_pretrain measures the loop
    try:
        return statistics.median(lifecycle_run(STEPS)[0] / STEPS for _ in range(5))
    finally:
        torch.set_num_threads(threads)


def check_seconds() -> float:
    """The non-finite check's own seconds per step: the reduction with it minus without it (module docstring)."""
    import torch
    import torch.distributed as dist

    from lifecycle._training.config import TrainingConfig
    from lifecycle._training.nonfinite import NonfiniteGuard

    class _NoJournal:
        origin = None

        def write(self, record: object) -> None:
            """Nothing: the check never writes on a finite loss."""

    guard = NonfiniteGuard(TrainingConfig(), _NoJournal())  # type: ignore[arg-type]
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    try:
        n, loss = 5000, 2.5

        def without() -> float:
            start = time.perf_counter()
            for _ in range(n):
                flags = torch.tensor([loss, 0.0, 0.0], dtype=torch.float64)
                dist.all_reduce(flags)
                flags[0].item()
            return time.perf_counter() - start

        def with_check() -> float:
            start = time.perf_counter()
            for step in range(n):
                bad = (1.0, 1.0, loss) if not math.isfinite(loss) else (0.0, 0.0, 0.0)
                flags = torch.tensor([loss, 0.0, 0.0, *bad], dtype=torch.float64)
                dist.all_reduce(flags)
                flags[0].item()
                count = int(flags[3].item())
                guard.apply(step, loss, count, None, flags[5].item())
            return time.perf_counter() - start

        rounds = [(with_check() - without()) / n for _ in range(7)]
    finally:
        dist.destroy_process_group()
    return statistics.median(rounds)


def save_stalls() -> tuple[float, float]:
    """Median seconds ``finalize()`` takes after a committed write and after a write that failed (ENOSPC)."""
    import torch

    from lifecycle.checkpoint import AsyncCheckpointer, SaveFailed

    def enospc() -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    state = {f"t{i}": torch.randn(256 * 1024) for i in range(16)}
    times: dict[str, list[float]] = {"ok": [], "failed": []}
    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parents[1]) as folder:
        writer = AsyncCheckpointer(folder, keep_last=1)
        step = 0
        for round_ in range(9):
            for side in ("ok", "failed") if round_ % 2 == 0 else ("failed", "ok"):
                step += 1
                writer._before_write = enospc if side == "failed" else None
                writer.save(step, state)
                time.sleep(0.3)  # the write has ended: what is left is the commit itself
                start = time.perf_counter()
                with contextlib.suppress(SaveFailed):
                    writer.finalize()
                times[side].append(time.perf_counter() - start)
    return statistics.median(times["ok"]), statistics.median(times["failed"])


def main() -> str:
    """Both tables, as markdown."""
    per_step = step_seconds()
    check = check_seconds()
    ok, failed = save_stalls()
    return "\n\n".join(
        [
            table(
                f"Non-finite loss check (world size 1, gloo, {STEPS} steps; µs per step)",
                ["(a) pretrain step", "(b) the check", "(a + b) / a", "target"],
                [[f"{per_step * 1e6:.0f}", f"{check * 1e6:.1f}", f"{(per_step + check) / per_step:.4f}", "≤ 1.01"]],
            ),
            table(
                "Stall of finalize() after a committed save and after a failed one (16 MiB, world size 1; ms)",
                ["committed", "failed (ENOSPC)", "failed ÷ committed"],
                [[f"{ok * 1e3:.2f}", f"{failed * 1e3:.2f}", f"{failed / ok:.2f}"]],
            ),
        ]
    )


if __name__ == "__main__":
    print(main())
