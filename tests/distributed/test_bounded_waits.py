"""Every wait on a failure path is bounded (issue 23), on real gloo worlds.

A failure with asynchronous work pending on Megatron's gloo copies of the data-parallel
groups: the failure plan aborts every Megatron group before Megatron's own destroy
(which would destroy the gloo copies gracefully and wait the group timeout), so the
failing rank and its peer, waiting in a collective, are both out within seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.launch import run_workers
from support.probes import NOTHING_ALIVE

BOUND_S = 2.0
"""Both ranks final within this long after rank 0 failed (group timeout 15 s)."""


@pytest.mark.timeout(90)
def test_work_pending_on_megatrons_gloo_copies_does_not_hold_either_rank(tmp_path: Path) -> None:
    """Rank 0 fails, work pending on a gloo copy: no graceful destroy; both ranks (one in a collective) out in 2 s."""
    results = run_workers("gloo_copy_worker", timeout_s=75, env={"RESULTS": str(tmp_path)})
    assert all(result.ok for result in results), "\n".join(map(str, results))
    records: list[dict[str, Any]] = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for record in records:
        assert "crash" not in record, record.get("traceback")
        assert record["gloo_copy"] and record["state"] == "failed", record
        assert not record["dist_initialized"] and record["alive"] == NOTHING_ALIVE and record["left"] == [], record
    first, peer = records
    assert first["pending"], "rank 0's all-reduce on the gloo copy completed: nothing was pending"
    for record in records:  # Megatron's graceful destroy of a gloo copy would wait on the pending work
        assert "destroy_process_group" not in record["releases"], record["releases"]
    waited = {rank: record["final_at"] - first["failed_at"] for rank, record in enumerate(records)}
    assert max(waited.values()) < BOUND_S, f"final this long after rank 0 failed: {waited}; steps {first['steps']}"
    assert "rank 0 fails" in first["error"] and peer["error"], records


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_second_sigint_leaves_a_release_blocked_inside_gloo(tmp_path: Path) -> None:
    """A barrier blocked on a stopped peer: a second SIGINT returns in 1 s, naming it; the next session reclaims."""
    results = run_workers("blocked_release_worker", timeout_s=100, env={"RESULTS": str(tmp_path)})
    by_rank = {result.rank: result for result in results}
    assert by_rank[0].ok, "\n".join(map(str, results))
    record: dict[str, Any] = json.loads((tmp_path / "rank0.json").read_text())
    assert "crash" not in record, record.get("traceback")
    assert record["sent"] == 2 and record["raised"] == "TeardownInterrupted", record
    assert record["returned_after_second_s"] < 1.0, record
    assert any("left running: barrier" in note for note in record["notes"]), record["notes"]
    assert record["state"] == "failed" and record["left_running"] == ["barrier"], record
    assert record["held"] == ["process_group", "rendezvous_store"], record
    assert "abort_process_group" in record["reclaimed"] and "close_store" in record["reclaimed"], record
    assert record["next_state"] == "closed" and record["next_sum"] == 2.0, record
    assert not record["dist_initialized"] and record["alive"] == NOTHING_ALIVE and record["left"] == [], record
