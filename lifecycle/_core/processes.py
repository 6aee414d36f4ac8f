"""The running processes of this machine, as far as this process may see them (Linux ``/proc``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

__all__ = ["is_running", "process_environments"]


def process_environments() -> Iterator[tuple[int, list[bytes]]]:
    """Yield ``(pid, environment)`` of each running process, its environment as ``NAME=value`` byte items.

    A process that ends meanwhile, a zombie, or another user's process is skipped;
    nothing is yielded where there is no ``/proc`` (not Linux).
    """
    root = Path("/proc")
    if not root.is_dir():
        return
    for entry in root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, a zombie, or another user's
            continue
        yield int(entry.name), environ.split(b"\0")


def is_running(pid: int) -> bool:
    """True if process ``pid`` exists and has not exited (a zombie has); False where ``/proc`` cannot say.

    Reads the process's state, not its environment: a process in the middle of exiting
    (after SIGKILL, say) no longer shows its environment but still runs for a moment.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X", "")
