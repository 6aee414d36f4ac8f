"""Overhead of the session: per trigger, and over a whole ``pretrain`` run.

1. Per-trigger cost: a full happy-path session (five triggers, ``RecordingActions``
   doubles for every action, so nothing but the session's own work is timed) and a
   bare ``transitions`` machine built from the same table, runs interleaved.
2. ``pretrain`` of N steps against the same loop written by hand without the
   lifecycle (``bench_pretrain``: same model, data, optimizer, gradient averaging on
   Megatron-core's data-parallel group; world size 1).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import median, table

RUNS = 2000


def session_run() -> float:
    """Seconds for one session through all five happy-path triggers, doubles for every action."""
    from lifecycle import Session
    from lifecycle.testing import RecordingActions

    session = Session(RecordingActions())
    start = time.perf_counter()
    session.init_distributed()
    session.init_globals()
    session.start_training()
    session.finish()
    session.close()
    return time.perf_counter() - start


def bare_run() -> float:
    """Seconds for the same five triggers on a bare ``transitions`` machine from the same table."""
    from transitions import Machine

    from lifecycle import State
    from lifecycle.lowlevel import TRANSITIONS

    machine = Machine(
        states=list(State),
        transitions=[{"trigger": e.trigger.value, "source": e.source, "dest": e.dest} for e in TRANSITIONS],
        initial=State.UNINITIALIZED,
        auto_transitions=False,
    )
    start = time.perf_counter()
    for trigger in ("init_distributed", "init_globals", "start_training", "finish", "close"):
        machine.trigger(trigger)
    return time.perf_counter() - start


def triggers() -> str:
    """The per-trigger table."""
    session_run(), bare_run()
    life, bare = [], []
    for _ in range(RUNS):
        life.append(session_run())
        bare.append(bare_run())
    a, b = median(life) / 5 * 1e6, median(bare) / 5 * 1e6
    return table(
        f"Per-trigger cost (median of {RUNS} interleaved runs of five triggers, µs per trigger)",
        ["Session (with teardown bookkeeping)", "bare transitions machine", "ratio", "difference per trigger (µs)"],
        [[f"{a:.1f}", f"{b:.1f}", f"{a / b:.2f}", f"{a - b:+.1f}"]],
    ) + (
        "\nWhat this shows: the price of the session's bookkeeping on each transition "
        "(validity check, ownership ledger, journal entry, and on `close` the teardown plan "
        "and its report) over the bare state machine it is built on. The ratio looks large "
        "because the bare machine does almost nothing; the difference is "
        f"{a - b:.0f} µs per transition, and a session takes five or six transitions in its "
        "whole life, against milliseconds for creating one process group.\n"
    )


def main() -> str:
    """Every overhead table."""
    parts = [triggers()]
    try:
        from bench_pretrain import main as pretrain_main
    except ImportError:
        return "\n".join(parts)
    parts.append(pretrain_main())
    return "\n".join(parts)


if __name__ == "__main__":
    print(main())
