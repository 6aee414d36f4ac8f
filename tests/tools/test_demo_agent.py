"""The demo's launcher and a faulty torchrun agent: a stopped agent is noticed, killed, and nothing of the run is left.

A stopped agent (SIGSTOP) hosts the store: the ranks' monitors fail them (``StoreHostLost``),
and they exit as zombies their stopped parent never collects. The old launcher then
printed nothing and waited for its 30-minute cap, leaving the agent and the zombies.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from support.launch import marked_processes, started_demo
from support.processes import stop_process

from lifecycle.journal import RunEnd, read

TRAINING = "tokens/s"
"""Rank 0's progress line: training has started on every rank."""


def _tree(pid: int) -> dict[int, bytes]:
    """``pid`` and its descendants now, each with its start time (``/proc/<pid>/stat`` field 22): who it is."""
    found: dict[int, bytes] = {}
    todo = [pid]
    while todo:
        one = todo.pop()
        try:
            found[one] = _started(one)
            children = Path(f"/proc/{one}/task/{one}/children").read_text().split()
        except OSError:
            continue
        todo += [int(child) for child in children]
    return found


def _started(pid: int) -> bytes:
    """The start time of process ``pid`` (raises ``OSError`` if there is none)."""
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return stat[stat.rfind(b")") + 2 :].split()[19]


def _still_there(tree: dict[int, bytes]) -> list[int]:
    """The processes of ``tree`` that still exist (zombies included), the same process by its start time."""
    left = []
    for pid, started in tree.items():
        try:
            if _started(pid) == started:
                left.append(pid)
        except OSError:
            pass
    return left


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_stopped_torchrun_agent_is_said_killed_and_collected_once_every_rank_has_ended(tmp_path: Path) -> None:
    """torchrun's agent SIGSTOPped mid-training: the ranks fail on the lost store, the demo says the agent is stopped,
    exits within 15 s of the last rank's end, and no process of that run (agent, ranks, monitors) is left."""
    journal = tmp_path / "journal"
    args = ["--steps=5000", "--log-interval=20", "--eval-interval=0", "--checkpoint-interval=0"]
    with started_demo(*args, f"--journal-dir={journal}", cwd=tmp_path) as demo:
        demo.wait_for(TRAINING, timeout=120)
        (agent,) = [
            pid
            for pid in marked_processes("LIFECYCLE_DEMO_TEST", demo.mark)
            if b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        tree = _tree(agent)
        assert len(tree) >= 5, tree  # the agent, two ranks, their monitors
        stop_process(agent)
        done = demo.finish(timeout=120)
        exited = time.time()
        assert demo.left_running() == [], done.stdout[-3000:]
    assert "torchrun's agent" in done.stdout and "is stopped" in done.stdout, done.stdout[-3000:]
    ends = [r for r in read([journal]) if isinstance(r, RunEnd)]
    assert sorted(r.origin.rank for r in ends) == [0, 1], done.stdout[-3000:]
    assert all(r.error is not None and "StoreHostLost" in r.error for r in ends), ends
    last = max(r.end or 0.0 for r in ends)
    assert exited - last <= 15.0, (exited - last, done.stdout[-3000:])
    assert _still_there(tree) == [], (tree, done.stdout[-3000:])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
