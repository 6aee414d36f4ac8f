"""The fault matrix: every failure point × what is raised × owners × restart mode × world size.

(Less the success-plan steps of a group or globals the caller owns: the session never
runs them, so those cells do not exist; see ``matrix_cells.Cell.absent``.)

Each cell runs in long-lived worker processes (one per rank, per world size) rather
than a new interpreter per cell. A cell passes when every rank reports no problem:
the original exception reached the caller (or the documented outcome: a Wrapper
restart, a refusal up front), the final state is right, exactly what the session
owned was released, no collective ran on a failure path, the next session in the
same process closed, and the cell finished well inside its timeout.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from reliability.expected import expected, known_bug
from reliability.matrix_cells import CELLS, GLOO_COPY_CELLS, REFUSED, Cell, in_make_test
from reliability.matrix_worker import serve

from lifecycle.testing import free_ports

CELL_TIMEOUT_S = 45.0
RESULTS: dict[str, bool] = {}
"""Cell id → passed, for the summary table (see conftest.py)."""


class Pool:
    """One worker process per rank; restarted if a cell hangs or a worker dies."""

    def __init__(self, world_size: int, base: str) -> None:
        self.world_size, self.base = world_size, base
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.start()

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        for rank in range(self.world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=serve, args=(child, rank, self.world_size, self.base))
            proc.start()
            self.procs.append(proc)
            self.conns.append(parent)

    def stop(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send(None)
        for proc in self.procs:
            proc.join(timeout=10)
        self.kill()

    def kill(self) -> None:
        for proc in self.procs:
            if proc.pid is None:
                continue
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=10)
        self.procs, self.conns = [], []

    def run(self, cell: Cell) -> list[dict[str, Any]]:
        """Run ``cell`` on every rank; a rank that does not answer in time is a failed cell."""
        ports = free_ports(4)
        for conn in self.conns:
            conn.send((cell, ports))
        results = []
        for rank, conn in enumerate(self.conns):
            if conn.poll(CELL_TIMEOUT_S):
                with contextlib.suppress(EOFError):
                    results.append(conn.recv())
                    continue
            results.append(
                {"rank": rank, "problems": [f"no answer within {CELL_TIMEOUT_S} s"], "elapsed": None, "fired": False}
            )
        if any(r["elapsed"] is None for r in results):
            self.kill()  # a hung or dead worker: start the next cell on fresh ones
            self.start()
        return results


class Pools(dict[int, Pool]):
    """A worker pool per world size, started when a cell of that size first runs."""

    def __init__(self, base: str) -> None:
        super().__init__()
        self.base = base

    def __missing__(self, world: int) -> Pool:
        pool = self[world] = Pool(world, self.base)
        return pool


@pytest.fixture(scope="module")
def pools() -> Iterator[Pools]:
    """Worker pools, each started once for the whole matrix (only for the world sizes selected)."""
    base = tempfile.mkdtemp(prefix="lifecycle-matrix-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    made = Pools(base)
    try:
        yield made
    finally:
        for pool in made.values():
            pool.stop()
        shutil.rmtree(base, ignore_errors=True)


def marks(cell: Cell) -> list[Any]:
    """``slow`` outside ``make test``'s covering subset; an expected failure for a known library bug."""
    found: list[Any] = [] if in_make_test(cell) else [pytest.mark.slow]
    bug = known_bug(cell)
    if bug is not None:
        reason, every_time = bug
        found.append(pytest.mark.xfail(reason=reason, strict=every_time))
    return found


def params(cells: tuple[Cell, ...]) -> list[Any]:
    """``cells`` as parameters, with their marks."""
    return [pytest.param(c, id=c.id, marks=marks(c)) for c in cells]


@pytest.mark.timeout(CELL_TIMEOUT_S + 30)
@pytest.mark.parametrize("cell", params(CELLS))
def test_cell(cell: Cell, pools: Pools) -> None:
    """Every rank reports that this cell's outcome, state, releases, path, retry and timing are right."""
    run_and_check(cell, pools)


@pytest.mark.timeout(CELL_TIMEOUT_S + 30)
@pytest.mark.parametrize("cell", params(GLOO_COPY_CELLS))
def test_cell_with_gloo_copies(cell: Cell, pools: Pools) -> None:
    """With Megatron's gloo copies of the data-parallel groups on, the cell's outcome is as without (issue 23)."""
    run_and_check(cell, pools)


@pytest.mark.timeout(CELL_TIMEOUT_S + 30)
@pytest.mark.parametrize("cell", params(REFUSED))
def test_refused(cell: Cell, pools: Pools) -> None:
    """A configuration that cannot exist is refused up front, touching nothing the caller owns."""
    run_and_check(cell, pools)


def run_and_check(cell: Cell, pools: Pools) -> None:
    """Run ``cell`` on every rank of its pool and fail with every rank's problems."""
    results = pools[cell.world_size].run(cell)
    problems = [f"rank {r['rank']}: {p}" for r in results for p in r["problems"]]
    if cell.refusal is None and not any(r.get("fired") for r in results):
        problems.append(f"the fault fired on none of ranks {expected(cell).fault_ranks}")
    RESULTS[cell.id] = not problems
    assert not problems, "\n".join(problems)
