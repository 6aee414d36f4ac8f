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

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from reliability.expected import expected, known_bug
from reliability.matrix_cells import CELLS, GLOO_COPY_CELLS, REFUSED, Cell, in_make_test
from reliability.matrix_pool import CELL_TIMEOUT_S, Pool
from reliability.matrix_worker import serve

RESULTS: dict[str, bool] = {}
"""Cell id → passed, for the summary table (see conftest.py)."""


class Pools(dict[int, Pool]):
    """A worker pool per world size, started when a cell of that size first needs it."""

    def __init__(self, base: str) -> None:
        super().__init__()
        self.base = base

    def __missing__(self, world: int) -> Pool:
        pool = self[world] = Pool(world, self.base, serve)
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


@pytest.fixture
def pool(cell: Cell, pools: Pools) -> Pool:
    """The pool of ``cell``'s world size, every worker ready.

    Waiting here, in the test's setup, keeps the workers' start-up (bounded by the pool's
    own start-up bound) out of the cell's timeout, which times the call only.
    """
    ready = pools[cell.world_size]
    ready.wait_ready()
    return ready


def marks(cell: Cell) -> list[Any]:
    """``slow`` (a seeded half in CI) outside ``make test``'s covering subset; an expected failure for a known bug."""
    found: list[Any] = [] if in_make_test(cell) else [pytest.mark.slow, pytest.mark.sampled("fault_matrix")]
    bug = known_bug(cell)
    if bug is not None:
        reason, every_time = bug
        found.append(pytest.mark.xfail(reason=reason, strict=every_time))
    return found


def params(cells: tuple[Cell, ...]) -> list[Any]:
    """``cells`` as parameters, with their marks."""
    return [pytest.param(c, id=c.id, marks=marks(c)) for c in cells]


@pytest.mark.timeout(CELL_TIMEOUT_S + 30, func_only=True)
@pytest.mark.parametrize("cell", params(CELLS))
def test_cell(cell: Cell, pool: Pool) -> None:
    """Every rank reports that this cell's outcome, state, releases, path, retry and timing are right."""
    run_and_check(cell, pool)


@pytest.mark.timeout(CELL_TIMEOUT_S + 30, func_only=True)
@pytest.mark.parametrize("cell", params(GLOO_COPY_CELLS))
def test_cell_with_gloo_copies(cell: Cell, pool: Pool) -> None:
    """With Megatron's gloo copies of the data-parallel groups on, the cell's outcome is as without (issue 23)."""
    run_and_check(cell, pool)


@pytest.mark.timeout(CELL_TIMEOUT_S + 30, func_only=True)
@pytest.mark.parametrize("cell", params(REFUSED))
def test_refused(cell: Cell, pool: Pool) -> None:
    """A configuration that cannot exist is refused up front, touching nothing the caller owns."""
    run_and_check(cell, pool)


def run_and_check(cell: Cell, pool: Pool) -> None:
    """Run ``cell`` on every rank of its (ready) pool and fail with every rank's problems."""
    results = pool.run(cell)
    problems = [f"rank {r['rank']}: {p}" for r in results for p in r["problems"]]
    if cell.refusal is None and not any(r.get("fired") for r in results):
        problems.append(f"the fault fired on none of ranks {expected(cell).fault_ranks}")
    RESULTS[cell.id] = not problems
    assert not problems, "\n".join(problems)


NVRX_ORDER = "ws2-inprocess-pg_session-mp_session-on_checkpoint_saved-exception"
"""The cell of issue 36: rank 1 fails in a callback; rank 0's Wrapper aborts while its main thread trains."""


@pytest.mark.timeout(CELL_TIMEOUT_S + 30, func_only=True)
@pytest.mark.parametrize("cell", [c for c in CELLS if c.id == NVRX_ORDER], ids=lambda c: c.id)
def test_training_collectives_before_the_wrapper_interrupts_pass(cell: Cell, pool: Pool) -> None:
    """A peer that starts a training collective after NVRx's abort started, before its interrupt, passes the cell."""
    results = pool.run(cell, gate=True)
    peer = results[0]
    assert peer["gate_held"] and peer["window"], f"the gate did not force NVRx's order on rank 0: {peer}"
    problems = [f"rank {r['rank']}: {p}" for r in results for p in r["problems"]]
    window = f"(rank 0's collectives between the abort's start and the interrupt: {peer['window']})"
    assert not problems, "\n".join([*problems, window])
