"""Leaks: 100 fail-then-retry cycles in one process.

Each cycle runs a session to ``training``, raises, and lets the failure plan release
everything; the next cycle is the retry. After each cycle we count threads, open file
descriptors, resident memory, live process groups and child processes, and report the
growth from the end of the first cycle to the end of the last.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import table
from bench_retry import lifecycle_cycle as cycle

CYCLES = 100


def snapshot() -> dict[str, float]:
    """The process's resource counts now."""
    from torch.distributed import distributed_c10d

    page = os.sysconf("SC_PAGE_SIZE")
    rss_pages = int(Path("/proc/self/statm").read_text().split()[1])
    me = str(os.getpid())
    children = sum(1 for stat in Path("/proc").glob("[0-9]*/stat") if _ppid(stat) == me)
    return {
        "threads": threading.active_count(),
        "os threads": len(os.listdir("/proc/self/task")),
        "file descriptors": len(os.listdir("/proc/self/fd")),
        "RSS (MB)": rss_pages * page / 2**20,
        "live process groups": len(distributed_c10d._world.pg_map),
        "child processes": children,
    }


def _ppid(stat: Path) -> str:
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return ""


def main() -> str:
    """Run the cycles; return the Markdown table of growth after the first."""
    cycle()
    first = snapshot()
    for _ in range(CYCLES - 1):
        cycle()
    last = snapshot()
    rows = [[name, f"{first[name]:.1f}", f"{last[name]:.1f}", f"{last[name] - first[name]:+.1f}"] for name in first]
    return table(
        f"Leaks over {CYCLES} fail-then-retry cycles (world size 1, gloo)",
        ["resource", "after cycle 1", f"after cycle {CYCLES}", "growth"],
        rows,
    ) + (
        "\nWhat this shows: whether a process that keeps failing and retrying accumulates "
        "anything. The baseline is taken after the first cycle (imports and first-time "
        "setup done); growth of 0 threads, file descriptors, process groups and child "
        "processes means each failure plan released everything its session acquired. "
        "Resident memory moves by allocator noise of a few MB at most.\n"
    )


if __name__ == "__main__":
    print(main())
