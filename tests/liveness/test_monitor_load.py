"""The liveness monitors' steady load on the store is three requests a rank an interval, whatever the world size.

W monitors (their store clients real, against one ``TCPStore`` server) make their steady
ticks: each beats (one write), looks for a verdict (one read) and reads its neighbour's
beat (one read). Before issue 29 a read was two requests (``check``, then ``get``): four
a tick.
"""

from __future__ import annotations

import mmap
import os

import pytest
from support.counting_store import server as store_server

from lifecycle._liveness import monitor
from lifecycle._liveness.rank import Marks


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [64, 256])
def test_each_monitor_makes_three_store_requests_a_tick(world: int) -> None:
    """W monitors tick three times each; every one makes 3 requests a tick (1 write, 2 reads), none more."""
    server = store_server()  # its resolver set not to stall a connect 5 s (see support.counting_store)
    marks = Marks()
    monitors: list[monitor.Monitor] = []
    try:
        with open(marks.path, "r+b") as file:
            page = mmap.mmap(file.fileno(), monitor.PAGE_SIZE)
        for rank in range(world):
            settings = monitor.Settings(
                rank=rank, world_size=world, pid=os.getpid(), marks=marks.path, host="127.0.0.1",
                port=server.port, prefix="p", interval_s=1.0, floor_s=1.0, default_s=600.0, explicit={},
                mode="report", dump_signal=0, stacks="/dev/null", store_timeout_s=5.0,
            )  # fmt: skip
            monitors.append(monitor.Monitor(settings, page, wake=-1))
        for tick in range(3):
            marks.mark("step", tick + 1)
            position = monitor.read_marks(page)
            for one in monitors:
                before = one.store.calls
                assert one.beat(position)
                assert not one.seen
                one.see()
                one.watch(now=float(tick))
                assert one.store.calls - before == 3, (one.s.rank, one.store.calls - before)
        page.close()
    finally:
        for one in monitors:
            one.store.close()
        marks.close()
