"""The liveness monitors' load on the store is bounded per rank, whatever the world size.

W monitors (their store clients real, against one ``TCPStore`` server) make their steady
ticks: each beats (one write) and reads, in one request, its neighbour's beat and whether
a verdict is out. Before issue 29 a tick was four requests (a read was a ``check``, then a
``get``); before this round's last change, three (two reads). When every rank is stale and
asleep, which one is behind is found by one rank per count of marks reading every beat in
one request, never by every rank reading every beat (W² reads before).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from support.counting_store import server as store_server

from lifecycle._liveness import monitor
from lifecycle._liveness.rank import Marks
from lifecycle._liveness.settings import Settings


@contextmanager
def _monitors(world: int) -> Iterator[tuple[list[monitor.Monitor], Marks, mmap.mmap]]:
    """``world`` monitors (not started: their parts are called by the test) on one store, sharing one marks page."""
    server = store_server()  # its resolver set not to stall a connect 5 s (see support.counting_store)
    marks = Marks()
    monitors: list[monitor.Monitor] = []
    with open(marks.path, "r+b") as file:
        page = mmap.mmap(file.fileno(), monitor.PAGE_SIZE)
    try:
        for rank in range(world):
            settings = Settings(
                rank=rank, world_size=world, pid=os.getpid(), host="127.0.0.1",
                port=server.port, prefix="p", interval_s=1.0, floor_s=1.0, default_deadline_s=600.0,
                mode="report", stacks="/dev/null", store_timeout_s=5.0,
            )  # fmt: skip
            monitors.append(monitor.Monitor(settings, page, wake=-1))
        yield monitors, marks, page
    finally:
        for one in monitors:
            one.store.close()
        page.close()
        marks.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [64, 256])
def test_each_monitor_makes_one_write_and_one_read_a_tick(world: int) -> None:
    """After start-up (the neighbour's first beat), every monitor's tick is 2 requests: 1 write, 1 read."""
    with _monitors(world) as (monitors, marks, page):
        for tick in range(4):
            marks.mark("step", tick + 1)
            position = monitor.read_marks(page)
            before = [one.store.calls for one in monitors]
            for one in monitors:
                assert one.beat(position)
            for one, calls in zip(monitors, before, strict=True):
                one.look(now=float(tick))
                assert not one.seen
                requests = one.store.calls - calls
                # Tick 0: the beat, the verdict key's creation, two reads (the neighbour not yet seen beating).
                assert requests == (4 if tick == 0 else 2), (tick, one.s.rank, requests)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [64, 256])
def test_one_rank_per_count_reads_every_position_when_all_are_stale(world: int) -> None:
    """Every rank stale and asleep, rank 5 two marks behind: one gather per count (3 requests), 2 for every other
    rank, once a round; only rank 5 is behind, with the ranks past it counted and the first ones named."""
    behind_rank = 5
    with _monitors(world) as (monitors, _, _):
        positions = [monitor.Position(38 if r == behind_rank else 40, 0, 12, "step") for r in range(world)]
        for one, position in zip(monitors, positions, strict=True):
            assert one.beat(position)
        requests, reasons = [], []
        for one, position in zip(monitors, positions, strict=True):
            before = one.store.calls
            reasons.append(one.behind(position, age=3.0)[1])
            requests.append(one.store.calls - before)
        # The first rank at count 40 (rank 0) and rank 5 (count 38) each gather: add, multi_get, set.
        assert sorted(requests) == [2] * (world - 2) + [3, 3], requests
        assert [r for r, reason in enumerate(reasons) if reason] == [behind_rank]
        ahead = ", ".join(str(r) for r in [0, 1, 2, 3, 4, 6, 7, 8])
        went_on = f"{world - 1} ranks went on past it ({ahead}, …)"
        assert reasons[behind_rank] == f"it sleeps in step 12, phase step; {went_on}"
        for one, position in zip(monitors, positions, strict=True):  # the same round: answered from memory
            before = one.store.calls
            one.behind(position, age=3.5)
            assert one.store.calls == before
