"""Standard tools read lifecycle's checkpoints: ``dcp.load`` and ``dcp_to_torch_save`` in a process without lifecycle.

The writers are lifecycle's (in this process, or real gloo ranks running
``tests/workers/checkpoint_worker.py``); the readers run ``tests/workers/dcp_reader.py``,
which imports torch only, and report whether every tensor came back byte-equal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from support.launch import WORKERS, run_bounded, run_workers, worker_reports
from workers.dcp_reader import expected_state

from lifecycle.checkpoint import AsyncCheckpointer

READER = WORKERS / "dcp_reader.py"
MODEL_KEYS = ["model.bias", "model.weight"]
OPTIMIZER_KEYS = [f"optimizer.state.{p}.{k}" for p in (0, 1) for k in ("exp_avg", "exp_avg_sq", "step")]


def _read_alone(mode: str, folder: Path, *args: str) -> dict[str, Any]:
    """Run the reader in one fresh process (``mode`` plain, slices or convert); return its report."""
    done = run_bounded([sys.executable, str(READER), mode, str(folder), *args], timeout=60, cwd=folder)
    assert done.returncode == 0, done.stdout
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def _read_on_ranks(folder: Path, world_size: int) -> list[dict[str, Any]]:
    """Run the reader's ``ranks`` mode on ``world_size`` gloo ranks; return each rank's report."""
    reports = []
    for result in run_workers("dcp_reader", "ranks", str(folder), world_size=world_size, timeout_s=60):
        assert result.ok, str(result)
        reports.append(json.loads(result.output.strip().splitlines()[-1]))
    return reports


def _clean(report: dict[str, Any], keys: list[str]) -> None:
    """Every tensor read byte-equal, exactly ``keys``, lifecycle never imported."""
    assert report["bad"] == [], report
    assert report["keys"] == sorted(keys), report
    assert report["lifecycle_imported"] is False


@pytest.mark.timeout(120)
def test_a_one_rank_checkpoint_loads_with_dcp_load_and_converts_without_lifecycle(tmp_path: Path) -> None:
    """World 1: dcp.load(no_dist) and dcp_to_torch_save give every tensor back byte-equal, under its own key."""
    writer = AsyncCheckpointer(tmp_path / "ckpt")
    writer.save(4, expected_state(0))
    assert writer.finalize() == 4
    folder = tmp_path / "ckpt" / "step_0000000004"
    _clean(_read_alone("plain", folder), MODEL_KEYS + OPTIMIZER_KEYS)
    _clean(_read_alone("convert", folder, str(tmp_path / "one.pt")), MODEL_KEYS + OPTIMIZER_KEYS)


@pytest.mark.slow  # the one-rank checkpoint's standard readers stay in make test
@pytest.mark.timeout(180)
def test_a_tensor_parallel_checkpoint_loads_on_one_and_two_ranks_and_converts(tmp_path: Path) -> None:
    """TP2 (2 gloo ranks): dcp.load at world 1 (no_dist) and at 2 ranks, and dcp_to_torch_save, are byte-equal."""
    reports = worker_reports("checkpoint_worker", "tensor_parallel_save", str(tmp_path), timeout_s=60)
    assert [r["committed"] for r in reports] == [4, 4]
    folder = tmp_path / "step_0000000004"
    both = [f"tp{r}_pp0.{k}" for r in (0, 1) for k in MODEL_KEYS + OPTIMIZER_KEYS]
    _clean(_read_alone("slices", folder), both)
    _clean(_read_alone("convert", folder, str(tmp_path / "tp2.pt")), both)
    for rank, report in enumerate(_read_on_ranks(folder, 2)):
        _clean(report, [f"tp{rank}_pp0.{k}" for k in MODEL_KEYS + OPTIMIZER_KEYS])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_tp2_dp2_checkpoint_loads_at_dp1_and_dp2_and_converts(tmp_path: Path) -> None:
    """4 ranks, TP2 x DP2 (only DP replica 0 writes): dcp.load at TP2 x DP1 and TP2 x DP2, and the conversion, match."""
    results = run_workers("checkpoint_worker", "tensor_parallel_save", str(tmp_path), world_size=4, timeout_s=120)
    assert all(r.ok for r in results), [str(r) for r in results]
    folder = tmp_path / "step_0000000004"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [(s["shard"], s["rank"]) for s in manifest["shards"]] == [(0, 0), (1, 1)]
    for world_size in (2, 4):
        for rank, report in enumerate(_read_on_ranks(folder, world_size)):
            _clean(report, [f"tp{rank % 2}_pp0.{k}" for k in MODEL_KEYS + OPTIMIZER_KEYS])
    both = [f"tp{r}_pp0.{k}" for r in (0, 1) for k in MODEL_KEYS + OPTIMIZER_KEYS]
    _clean(_read_alone("convert", folder, str(tmp_path / "tp2dp2.pt")), both)
