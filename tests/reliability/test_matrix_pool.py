"""The fault matrix's pool: start-up apart from cells, one deadline for every rank of a cell.

On a busy machine a fresh worker takes 20-80 s to import torch, Megatron-core and NVRx;
the pool must not count that against a cell, nor give each rank its own deadline in turn.
These run the pool on ``pool_double``'s light workers, so they take seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability import pool_double
from reliability.matrix_pool import Pool, PoolNotReady


@pytest.fixture
def pools() -> Iterator[list[Pool]]:
    """Pools a test starts (append them here): every one is killed at the end, whatever happened."""
    started: list[Pool] = []
    yield started
    for pool in started:
        pool.kill()


@pytest.mark.timeout(30)
def test_a_worker_slow_to_import_does_not_fail_the_cell(pools: list[Pool], tmp_path: Path) -> None:
    """A worker that gets ready after longer than a cell's deadline still runs the cell, which passes."""
    pool = Pool(2, str(tmp_path), pool_double.serve, cell_timeout_s=2.0, start_timeout_s=60.0, ready_after_s={1: 4.0})
    pools.append(pool)
    began = time.monotonic()
    results = pool.run(0.1)
    assert time.monotonic() - began >= 4.0, "the slow worker was not waited for"
    assert [r["problems"] for r in results] == [[], []]
    assert [r["rank"] for r in results] == [0, 1]


@pytest.mark.timeout(30)
def test_one_deadline_for_every_rank(pools: list[Pool], tmp_path: Path) -> None:
    """A cell on which every rank hangs fails at its one deadline, not at one deadline per rank in turn."""
    pool = Pool(3, str(tmp_path), pool_double.serve, cell_timeout_s=1.5)
    pools.append(pool)
    pool.wait_ready()
    began = time.monotonic()
    results = pool.run("hang")
    took = time.monotonic() - began
    assert 1.5 <= took < 3.0, f"the cell took {took:.1f} s to fail, with a 1.5 s deadline for 3 ranks"
    assert all(r["problems"] == ["no answer within 1.5 s of the cell's start"] for r in results)
    assert not pool.ready, "a pool with a hung worker must be restarted"


@pytest.mark.timeout(30)
def test_a_worker_that_dies_fails_the_cell_at_once(pools: list[Pool], tmp_path: Path) -> None:
    """A worker that dies during a cell fails it as soon as it is gone, not at the deadline."""
    pool = Pool(1, str(tmp_path), pool_double.serve, cell_timeout_s=20.0)
    pools.append(pool)
    pool.wait_ready()
    began = time.monotonic()
    (result,) = pool.run("exit")
    assert result["problems"] == ["its worker exited during the cell"]
    assert time.monotonic() - began < 10.0


@pytest.mark.timeout(30)
def test_start_up_has_its_own_bound(pools: list[Pool], tmp_path: Path) -> None:
    """A worker not ready within the start-up bound is named, and the pool restarts for the next cell."""
    pool = Pool(2, str(tmp_path), pool_double.serve, start_timeout_s=1.0, ready_after_s={0: 60.0})
    pools.append(pool)
    with pytest.raises(PoolNotReady, match=r"^rank 0: not ready within 1 s$"):
        pool.wait_ready()
    assert len(pool.procs) == 2 and not pool.ready


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_real_worker_slow_to_import_runs_its_cell(pools: list[Pool], tmp_path: Path) -> None:
    """A real matrix worker ready only after a cell's deadline would have passed still runs the cell, which passes."""
    from reliability.matrix_cells import CELLS
    from reliability.matrix_worker import serve

    cell = next(c for c in CELLS if c.id == "ws2-ordinary-pg_session-mp_session-step-exception")
    pool = Pool(2, str(tmp_path), serve, cell_timeout_s=15.0, ready_after_s={1: 16.0})
    pools.append(pool)
    results = pool.run(cell)
    assert [r["problems"] for r in results] == [[], []]
    assert any(r["fired"] for r in results)
