"""Journal fixtures shared by the journal and ``show`` tests (torch-free)."""

from __future__ import annotations


def v1_failed_call() -> list[dict[str, object]]:
    """A version 1 journal of one failed call, as the v1 writer wrote it."""
    base = {"rank": 0, "attempt": 0}
    return [
        {"kind": "run", **base, "format": 1, "world_size": 1, "restart_mode": "ordinary", "iteration": 0,
         "pid": 7, "host": "h", "start": 10.0},
        {"kind": "transition", **base, "source": "uninitialized", "dest": "dist_ready",
         "trigger": "init_distributed", "at": 10.5, "duration_s": 0.25, "detail": ""},
        {"kind": "teardown", **base, "outcome": "failure", "step": "abort_process_group",
         "resource": "process_group", "owner": "session", "at": 11.0, "duration_s": 0.5, "error": None},
        {"kind": "left", **base, "resource": "x", "owner": "caller", "reason": "owned by the caller"},
        {"kind": "transition", **base, "source": "dist_ready", "dest": "failed", "trigger": "fail",
         "at": 11.6, "duration_s": 0.7, "detail": "InjectedFault: boom"},
        {"kind": "end", **base, "state": "failed", "exit_reason": None, "error": "InjectedFault: boom",
         "final_step": 2, "losses": [[1, 3.0], [2, 2.5]], "eval_losses": [[2, 2.75]], "checkpoint_step": None},
    ]  # fmt: skip
