"""The collective positions' wrappers on a real two-rank gloo group (issue 40)."""

from __future__ import annotations

import re

import pytest
import torch.distributed as dist
from support.launch import worker_reports

from lifecycle._liveness.collectives import Positions
from lifecycle._liveness.rank import Marks


@pytest.mark.timeout(180)
def test_the_wrappers_write_each_groups_entered_and_left_and_see_a_bypass() -> None:
    """Sync: entered = left = 1; async: entered 2, left 1 until its wait; an object collective counts once (its two
    inner all_gathers move the counter to 4); each position names its caller's file, line and function; a
    coalescing manager's queued collectives count once, as one operation (async: left at ``cm.wait()``), never
    blind; a second group gets its own slot; a call past the wrappers makes the group blind at the next mark; a
    destroyed group is freed (never kept alive); uninstall puts every name back, and a wrapper a module kept from
    before works as the original and writes nothing."""
    for report in worker_reports("positions_worker", timeout_s=150):
        assert report["sync"] == [["0", 1, 1, "all_reduce", False]], report
        assert report["issued"] == [["0", 2, 1, "all_reduce", False]], report
        assert report["waited"] == [["0", 2, 2, "all_reduce", False]], report
        assert report["object"] == [["0", 4, 4, "all_gather_object", False]], report
        assert re.fullmatch(r"workers/positions_worker\.py:\d+ in main", report["site"]), report
        assert report["coalesced"] == [["0", 5, 5, "all_reduce", False]], report
        assert re.fullmatch(r"workers/positions_worker\.py:\d+ in main", report["coalesced_site"]), report
        assert report["coalesced_site"] != report["site"], report
        assert report["coalesced_issued"] == [["0", 6, 5, "all_reduce", False]], report
        assert report["coalesced_waited"] == [["0", 6, 6, "all_reduce", False]], report
        assert report["second_group"][1][1:] == [1, 1, "barrier", False], report
        assert report["bypassed"][0] == ["0", 6, 6, "all_reduce", True], report
        assert report["group_freed"] and report["restored"] and report["bound_after_uninstall"], report


def test_megatron_ddps_own_name_for_the_coalescing_manager_is_wrapped_and_put_back() -> None:
    """Megatron-core's DDP bound ``_coalescing_manager`` at import: ``install`` wraps that name too (one wrapper for
    it and torch's), ``uninstall`` puts the original back."""
    import megatron.core.distributed.param_and_grad_buffer as buffer

    original = buffer._coalescing_manager
    marks = Marks()
    positions = Positions(marks)
    try:
        positions.install()
        assert buffer._coalescing_manager is dist._coalescing_manager is not original
        assert buffer._coalescing_manager.__wrapped__ is original
    finally:
        positions.uninstall()
        marks.close()
    assert buffer._coalescing_manager is original is dist._coalescing_manager
