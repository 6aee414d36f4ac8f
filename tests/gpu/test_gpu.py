"""On GPUs with nccl: sessions, ``pretrain`` faults and retries, an in-process restart, device binding, health check.

Run by ``make gpu-check`` (``tools/gpu_check.py``), one rank per visible GPU: one GPU
means one rank, and the two-rank abort is then skipped as not verified. Each scenario
runs in fresh processes (``gpu_worker.py``), bounded in time so that on one GPU the
whole run fits the check's budget even when a scenario hangs (about 4 minutes).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support.launch import suite_env
from support.probes import alive

from lifecycle import restart
from lifecycle.testing import free_port, launch_ranks, run_command

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

WORKER = Path(__file__).resolve().parent / "gpu_worker.py"
RANKS = torch.cuda.device_count()
NOTHING_ALIVE = dict.fromkeys(alive(), False)
SESSION_TIMEOUT_S = 10.0  # gpu_worker.SESSION_TIMEOUT_S
WAITS = RANKS > 1
"""With peers, a rank waiting on a failed one is released by its watchdog: up to SESSION_TIMEOUT_S per failure."""
NOT_VERIFIED = "not verified: one GPU, and NCCL refuses two ranks on one device"


def reports(scenario: str, out: Path, *, timeout_s: float) -> list[dict[str, Any]]:
    """Run ``gpu_worker.py SCENARIO`` on one rank per GPU; every rank must exit 0; return each rank's report."""
    results = launch_ranks([str(WORKER), scenario, str(out)], RANKS, timeout_s=timeout_s, env=suite_env())
    assert all(result.ok for result in results), "\n".join(map(str, results))
    found = [json.loads((out / f"{scenario}-rank{rank}.json").read_text()) for rank in range(RANKS)]
    assert all(report["ok"] for report in found), found
    return found


@pytest.fixture(scope="module")
def session_reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The ``session`` scenario's reports, run once for the tests that read them."""
    return reports("session", tmp_path_factory.mktemp("session"), timeout_s=60 + 60 * WAITS)


@pytest.mark.timeout(70 + 60 * WAITS)
def test_a_session_on_nccl_fails_in_every_state_then_trains_and_closes(session_reports: list[dict[str, Any]]) -> None:
    """Every failed session releases everything; the next one all-reduces on the GPU and closes."""
    for rank, report in enumerate(session_reports):
        for failure in report["failures"]:
            assert failure["final_state"] == "failed", failure
            assert failure["alive"] == NOTHING_ALIVE, failure
        assert report["final_state"] == "closed"
        assert report["sum"] == RANKS
        assert report["alive"] == NOTHING_ALIVE
        assert report["device"] == (0 if RANKS == 1 else rank)


@pytest.mark.timeout(70 + 60 * WAITS)
def test_the_session_sets_the_nccl_defaults_and_seeds_then_releases_the_rng_tracker(
    session_reports: list[dict[str, Any]],
) -> None:
    """Unset NCCL variables become 2 and 0; the tracker is seeded while the session lives and reset after."""
    for report in session_reports:
        assert report["nccl_env"] == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2", "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0"}
        assert "model-parallel-rng" in report["seeded_during"]
        assert report["seeded_after"] == []


@pytest.mark.skipif(RANKS < 2, reason=NOT_VERIFIED)
@pytest.mark.timeout(130)
def test_two_rank_nccl_abort_releases_the_waiting_rank_without_killing_it(
    session_reports: list[dict[str, Any]],
) -> None:
    """The last rank fails; rank 0, waiting on it in an all-reduce, gets an error by its group timeout and survives."""
    for failure in session_reports[0]["failures"]:
        assert failure.get("all_reduce") != "returned", failure
        assert failure["error"], failure
        assert failure["blocked_s"] < SESSION_TIMEOUT_S + 10, failure  # released by the watchdog at the latest


@pytest.mark.timeout(95 + 100 * WAITS)
def test_pretrain_on_nccl_fails_in_each_phase_and_a_retry_in_the_same_process_finishes(tmp_path: Path) -> None:
    """A fault in each phase raises and leaves nothing alive; a retry in the same processes then trains to the end."""
    for report in reports("pretrain", tmp_path, timeout_s=85 + 100 * WAITS):
        for phase, record in report["phases"].items():
            assert record["fault"] != "did not fire", phase
            assert record["alive_after_fault"] == NOTHING_ALIVE, (phase, record)
            assert record["retry_final_step"] == 4, (phase, record)
            assert record["retry_loss_finite"], (phase, record)
        assert report["globals_left"] == []


@pytest.mark.timeout(70)
def test_an_in_process_restart_under_the_real_wrapper_on_nccl(tmp_path: Path) -> None:
    """NVRx's Wrapper restarts every rank in its process after the last rank fails once; the run then finishes."""
    for report in reports("inprocess", tmp_path, timeout_s=60):
        assert report["iterations_started"] == [0, 1], report
        assert report["final_step"] == 4
        assert report["state"] == "closed"
        assert report["group_left"] is False
        assert report["globals_left"] == []


@pytest.mark.timeout(55)
def test_one_visible_gpu_per_process_binds_device_0_whatever_local_rank_says(tmp_path: Path) -> None:
    """LOCAL_RANK=1 with CUDA_VISIBLE_DEVICES naming one GPU: the session binds device 0 (the old code refused)."""
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port("127.0.0.1")),
        "CUDA_VISIBLE_DEVICES": first,
    }
    result = run_command([sys.executable, str(WORKER), "session", str(tmp_path)], timeout_s=45, env=suite_env(env))
    assert result.ok, str(result)
    report = json.loads((tmp_path / "session-rank0.json").read_text())
    assert report["ok"], report
    assert (report["device"], report["local_rank"], report["final_state"]) == (0, "1", "closed")


def test_the_cuda_health_check_passes_on_a_healthy_device() -> None:
    """With CUDA initialized on a working device, the health check returns the Wrapper's state unchanged."""
    torch.ones(1, device="cuda").sum().item()  # initializes CUDA in this process
    state = object()
    assert restart.CudaHealthCheck(timeout_s=30.0)(state) is state
