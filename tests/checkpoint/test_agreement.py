"""Resume by agreement: every rank loads exactly the same checkpoint, or all start from scratch together.

Each test runs ``tests/workers/checkpoint_worker.py`` as two real gloo ranks; each rank
prints one JSON line with what it loaded and the RuntimeWarnings it got.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.launch import worker_reports


def _two_ranks(scenario: str, *args: str) -> list[dict[str, Any]]:
    """Run ``checkpoint_worker.py SCENARIO ARGS`` on 2 ranks; return each rank's last JSON report."""
    return worker_reports("checkpoint_worker", scenario, *args, timeout_s=45)


@pytest.mark.timeout(60)
def test_a_rank_with_a_stale_view_makes_every_rank_resume_from_the_step_it_sees(tmp_path: Path) -> None:
    """Rank 1's copy lacks step 4: both ranks load step 2 with a warning (was: rank 0 step 4, rank 1 step 2)."""
    shared, stale = tmp_path / "ckpt", tmp_path / "stale-copy"
    rank_0, rank_1 = _two_ranks("stale_view", str(shared), str(stale), "1")
    for rank, report in enumerate((rank_0, rank_1)):
        assert report["error"] is None, report
        assert report["loaded"] == 2, report
        assert report["w"] == [20.0 + rank] * 3  # its own shard of step 2
        (warning,) = report["warnings"]
        assert "step 4 is unusable on every rank (on rank 1:" in warning
        assert str(stale / "step_0000000004" / "manifest.json") in warning
        assert warning.endswith("every rank resumes from step 2")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_stale_rank_0_proposes_the_older_step_and_every_rank_takes_it(tmp_path: Path) -> None:
    """Rank 0's copy lacks step 4: rank 0 proposes step 2 and rank 1, which sees step 4, loads step 2 too."""
    shared, stale = tmp_path / "ckpt", tmp_path / "stale-copy"
    reports = _two_ranks("stale_view", str(shared), str(stale), "0")
    assert [r["loaded"] for r in reports] == [2, 2]
    assert [r["w"][0] for r in reports] == [20.0, 21.0]


@pytest.mark.timeout(60)
def test_a_shard_corrupt_in_place_on_one_rank_makes_all_fall_back_together(tmp_path: Path) -> None:
    """Rank 1's step-4 shard has a flipped byte: both load step 2, warned with its path (was: rank 1 always failed)."""
    reports = _two_ranks("corrupt_shard", str(tmp_path), "4")
    for rank, report in enumerate(reports):
        assert (report["loaded"], report["error"]) == (2, None), report
        assert report["w"] == [20.0 + rank] * 3
        (warning,) = report["warnings"]
        (shard,) = (tmp_path / "step_0000000004").glob("__1_*_0.distcp")
        assert f"step 4 is unusable on every rank (on rank 1: shard {shard} is corrupt" in warning
        assert warning.endswith("every rank resumes from step 2")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_when_no_step_is_intact_on_every_rank_all_start_from_scratch(tmp_path: Path) -> None:
    """Rank 1's shards of steps 4 and 2 are corrupt: no rank loads anything and each says so."""
    reports = _two_ranks("corrupt_shard", str(tmp_path), "4,2")
    for report in reports:
        assert (report["loaded"], report["error"], report["w"]) == (None, None, [0.0] * 3), report
        (warning,) = report["warnings"]
        assert "step 4 is unusable on every rank" in warning and "step 2 is unusable on every rank" in warning
        assert warning.endswith("no usable checkpoint is left: every rank starts from scratch")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_state_dict_that_does_not_fit_on_one_rank_is_refused_on_every_rank(tmp_path: Path) -> None:
    """Rank 1's tensor has another shape: both ranks raise CheckpointMismatch naming rank 1; nothing is loaded."""
    rank_0, rank_1 = _two_ranks("mismatch", str(tmp_path))
    assert rank_1["error"]["type"] == rank_0["error"]["type"] == "CheckpointMismatch"
    assert rank_1["error"]["what"] == "state_dict['w']"
    assert rank_0["error"]["what"] == "state_dict['w'] on rank 1"
    assert "torch.float32[3] in the checkpoint, torch.float32[5] in this run" in rank_0["error"]["text"]
    assert rank_0["w"] == [0.0] * 3 and rank_1["w"] == [0.0] * 5


@pytest.mark.timeout(60)
def test_a_commit_refuses_shards_rank_0_cannot_see(tmp_path: Path) -> None:
    """Rank 1 writes where rank 0 cannot see: every rank's finalize fails naming the missing shard (was: committed)."""
    mine, elsewhere = tmp_path / "ckpt", tmp_path / "elsewhere"
    reports = _two_ranks("own_folders", str(mine), str(elsewhere))
    (shard,) = (elsewhere / "step_0000000001").glob("__1_*.json")
    missing = mine / "step_0000000001" / shard.name
    for report in reports:
        assert report["committed"] is None
        assert f"rank 0 does not see 1 of the 2 shards: {missing} ([Errno 2 ENOENT]" in report["error"]
    assert not (mine / "latest").exists()
    assert not (mine / "step_0000000001" / "manifest.json").exists()
