"""The collective positions' wrappers on a real two-rank gloo group (issue 40)."""

from __future__ import annotations

import pytest
from support.launch import worker_reports


@pytest.mark.timeout(180)
def test_the_wrappers_write_each_groups_entered_and_left_and_see_a_bypass() -> None:
    """Sync: entered = left = 1; async: entered 2, left 1 until its wait; an object collective counts once (its two
    inner all_gathers move the counter to 4); a second group gets its own slot; a call past the wrappers makes the
    group blind at the next mark; a destroyed group is freed (never kept alive); uninstall puts every name back, and
    a wrapper a module kept from before works as the original and writes nothing."""
    for report in worker_reports("positions_worker", timeout_s=150):
        assert report["sync"] == [["0", 1, 1, "all_reduce", False]], report
        assert report["issued"] == [["0", 2, 1, "all_reduce", False]], report
        assert report["waited"] == [["0", 2, 2, "all_reduce", False]], report
        assert report["object"] == [["0", 4, 4, "all_gather_object", False]], report
        assert report["second_group"][1][1:] == [1, 1, "barrier", False], report
        assert report["bypassed"][0] == ["0", 4, 4, "all_gather_object", True], report
        assert report["group_freed"] and report["restored"] and report["bound_after_uninstall"], report
