"""Seeded save faults on one long-lived pair of gloo ranks: the ranks always agree, no partial step is ever latest.

``tests/workers/save_fault_worker.py`` draws, from the seed, one fault (or none) per save
and injects it at a seam: ENOSPC, EROFS or EACCES on one rank's write, a write hung past
``write_timeout_s`` (1 s), EIO at rank 0's commit of the manifest or of ``latest``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.launch import worker_reports


def _check(reports: list[dict[str, Any]]) -> None:
    """Both ranks saw the same outcome of every save; latest is always the newest committed step; resume loads it."""
    rank_0, rank_1 = reports
    newest: int | None = None
    for mine, theirs in zip(rank_0["outcomes"], rank_1["outcomes"], strict=True):
        assert mine["committed"] == theirs["committed"], (mine, theirs)  # one decision, never split
        assert (mine["error"] is None) == (theirs["error"] is None), (mine, theirs)
        assert (mine["committed"] is not None) == (mine["fault"] == "none"), mine
        if mine["committed"] is not None:
            newest = mine["committed"]
        assert mine["latest"] == theirs["latest"] == newest, (mine, theirs)  # a failed step never becomes latest
    assert any(o["error"] and "ENOSPC" in o["error"] for o in rank_0["outcomes"])  # the failures are named
    for rank, report in enumerate(reports):
        assert report["loaded"] == newest
        if newest is not None:
            assert report["w"] == [10.0 * newest + rank] * 3  # that step's own values


@pytest.mark.timeout(90)
def test_a_seeded_sample_of_save_faults_is_agreed_and_never_leaves_a_partial_latest(tmp_path: Path) -> None:
    """16 saves, seed 48 (each kind of fault drawn, on either rank): every outcome agreed, latest always committed."""
    reports = worker_reports("save_fault_worker", str(tmp_path), "48", "16", timeout_s=75)
    assert len({o["fault"] for o in reports[0]["outcomes"]}) == 7  # none and the six faults
    _check(reports)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_200_save_faults_are_agreed_and_never_leave_a_partial_latest(tmp_path: Path) -> None:
    """200 saves with seeded faults (seed 4141) on one pair of ranks: the same guarantees, within 3 minutes."""
    _check(worker_reports("save_fault_worker", str(tmp_path), "4141", "200", timeout_s=180))
