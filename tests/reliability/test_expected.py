"""Table test of ``expected(cell)``: each row pins one branch of the matrix's expected outcome.

Torch-free: runs under ``make test-unit``.
"""

from __future__ import annotations

import pytest
from reliability.expected import (
    CLOSED,
    ERROR_OR_RESULT,
    FAILED,
    FAILED_OR_CLOSED,
    GLOBALS,
    GROUP,
    ORIGINAL,
    REFUSAL,
    RESTART,
    SOME_ERROR,
    TEARDOWN_ERROR,
    WRAPPER_STOPS,
    RankOutcome,
    expected,
    known_bug,
)
from reliability.matrix_cells import ALL_CELLS, CELLS, REFUSED, Cell, in_make_test

from lifecycle import State


def cell(
    point: str, raised: str, group: str = "session", globals_: str = "session", mode: str = "ordinary", world: int = 2
) -> Cell:
    """A cell, with the common case as defaults."""
    return Cell(point, raised, group, globals_, mode, world)


ROWS = [
    # (cell, fault ranks, fired, preempted, peer, teardown fault, retry)
    pytest.param(
        cell("step", "exception"),
        (1,),
        RankOutcome(ORIGINAL, (FAILED,)),
        None,
        RankOutcome(ERROR_OR_RESULT, (FAILED_OR_CLOSED,)),
        False,
        True,
        id="ordinary-rank-local: rank 1 gets its error, rank 0 fails or closes",
    ),
    pytest.param(
        cell("pg_init", "keyboard_interrupt"),
        (0, 1),
        RankOutcome(ORIGINAL, (FAILED,)),
        RankOutcome(SOME_ERROR, (FAILED,)),
        None,
        False,
        True,
        id="ordinary-init-point: every rank armed, one may be pre-empted",
    ),
    pytest.param(
        cell("eval", "exception", group="caller"),
        (0, 1),
        RankOutcome(ORIGINAL, (FAILED,)),
        RankOutcome(SOME_ERROR, (FAILED,)),
        None,
        False,
        True,
        id="ordinary-caller-group: every rank armed",
    ),
    pytest.param(
        cell("step", "system_exit", world=1),
        (0,),
        RankOutcome(ORIGINAL, (FAILED,)),
        None,
        None,
        False,
        True,
        id="ordinary-one-rank: never pre-empted",
    ),
    pytest.param(
        cell("success_teardown", "exception"),
        (1,),
        RankOutcome(TEARDOWN_ERROR, (FAILED,)),
        None,
        RankOutcome(ERROR_OR_RESULT, (FAILED_OR_CLOSED,)),
        False,
        True,
        id="ordinary-success-teardown: a TeardownError carries the error",
    ),
    pytest.param(
        cell("success_teardown", "keyboard_interrupt"),
        (1,),
        RankOutcome(ORIGINAL, (FAILED,)),
        None,
        RankOutcome(ERROR_OR_RESULT, (FAILED_OR_CLOSED,)),
        False,
        True,
        id="ordinary-success-teardown-interrupt: the interrupt itself",
    ),
    pytest.param(
        cell("setup", "teardown_step"),
        (1,),
        RankOutcome(ORIGINAL, (FAILED,)),
        None,
        RankOutcome(ERROR_OR_RESULT, (FAILED_OR_CLOSED,)),
        True,
        True,
        id="ordinary-teardown-step: the teardown fault fires",
    ),
    pytest.param(
        cell("pg_init", "teardown_step"),
        (0, 1),
        RankOutcome(ORIGINAL, (FAILED,)),
        RankOutcome(SOME_ERROR, (FAILED,)),
        None,
        False,
        True,
        id="teardown-step-at-pg-init: nothing to release, no teardown fault",
    ),
    pytest.param(
        cell("step", "teardown_step", group="caller", globals_="caller"),
        (0, 1),
        RankOutcome(ORIGINAL, (FAILED,)),
        RankOutcome(SOME_ERROR, (FAILED,)),
        None,
        False,
        True,
        id="teardown-step-caller-owned: the session releases nothing, no teardown fault",
    ),
    pytest.param(
        cell("step", "exception", mode="inprocess"),
        (1,),
        RankOutcome(RESTART, (FAILED, CLOSED)),
        None,
        RankOutcome(RESTART, (FAILED_OR_CLOSED, CLOSED)),
        False,
        False,
        id="inprocess-restart: iteration 1 closes, no separate retry",
    ),
    pytest.param(
        cell("globals_init", "exception", mode="inprocess"),
        (0, 1),
        RankOutcome(RESTART, (FAILED, CLOSED)),
        RankOutcome(RESTART, (FAILED, CLOSED)),
        None,
        False,
        False,
        id="inprocess-init-point: every rank armed, all restart",
    ),
    pytest.param(
        cell("step", "keyboard_interrupt", mode="inprocess"),
        (0, 1),
        RankOutcome(ORIGINAL, (FAILED,)),
        RankOutcome(SOME_ERROR, (FAILED,)),
        None,
        False,
        True,
        id="inprocess-interrupt: ends the Wrapper on every rank, no restart",
    ),
    pytest.param(
        cell("step", "teardown_step", mode="inprocess"),
        (1,),
        RankOutcome(WRAPPER_STOPS, (FAILED,)),
        None,
        RankOutcome(RESTART, (FAILED_OR_CLOSED, CLOSED)),
        True,
        True,
        id="inprocess-teardown-step: the Wrapper's finalize raises and it stops on that rank",
    ),
    pytest.param(
        cell("success_teardown", "teardown_step", mode="inprocess"),
        (1,),
        RankOutcome(RESTART, (FAILED, CLOSED)),
        None,
        RankOutcome(RESTART, (FAILED_OR_CLOSED, CLOSED)),
        True,
        False,
        id="inprocess-success-teardown-step: the session's own step fails, a plain restart",
    ),
]


@pytest.mark.parametrize(("c", "ranks", "fired", "preempted", "peer", "teardown", "retry"), ROWS)
def test_expected_row(
    c: Cell,
    ranks: tuple[int, ...],
    fired: RankOutcome,
    preempted: RankOutcome | None,
    peer: RankOutcome | None,
    teardown: bool,
    retry: bool,
) -> None:
    """Each kind of real cell expects exactly this per-role outcome, fault ranks, teardown fault and retry."""
    got = expected(c)
    assert (got.refusal, got.fault_ranks, got.fired, got.preempted, got.peer) == (None, ranks, fired, preempted, peer)
    assert (got.teardown_fault, got.retry) == (teardown, retry)


@pytest.mark.parametrize(
    ("c", "refusal", "sessions"),
    [
        pytest.param(Cell("refused", "-", "session", "caller", "ordinary", 2), "stale", (FAILED,), id="stale"),
        pytest.param(Cell("refused", "-", "caller", "session", "inprocess", 1), "inprocess", (), id="inprocess"),
    ],
)
def test_expected_refusal(c: Cell, refusal: str, sessions: tuple[frozenset[State], ...]) -> None:
    """A refused configuration arms nothing, refuses with its reason, and is followed by a retry."""
    got = expected(c)
    assert (got.refusal, got.fault_ranks, got.fired, got.preempted) == (refusal, (), None, None)
    assert got.peer == RankOutcome(REFUSAL, sessions)
    assert got.retry and not got.teardown_fault


@pytest.mark.parametrize(
    ("group", "globals_", "live"),
    [
        ("session", "session", frozenset()),
        ("caller", "session", frozenset({GROUP})),
        ("caller", "caller", frozenset({GROUP}) | GLOBALS),
        ("session", "caller", GLOBALS),
    ],
)
def test_expected_live_after(group: str, globals_: str, live: frozenset[str]) -> None:
    """What stays live after a run is exactly what the caller created."""
    assert expected(Cell("step", "exception", group, globals_, "ordinary", 2)).live_after == live


def test_every_cell_has_a_consistent_expectation() -> None:
    """Every cell's fault ranks exist, and a role is None exactly when no rank can take it."""
    for c in CELLS:
        got = expected(c)
        assert got.fault_ranks and set(got.fault_ranks) <= set(range(c.world_size)), c.id
        assert (got.peer is None) == (len(got.fault_ranks) == c.world_size), c.id
        assert (got.preempted is None) == (c.world_size == 1 or got.peer is not None), c.id
    assert all(expected(c).refusal == c.refusal for c in REFUSED)


def test_make_test_subset_covers_every_value() -> None:
    """The make-test subset has every point, raise, owner combination, mode and world size, and every refusal."""
    fast = [c for c in ALL_CELLS if c.refusal is None and in_make_test(c)]
    for field in ("point", "raised", "mode", "world_size"):
        assert {getattr(c, field) for c in fast} == {getattr(c, field) for c in CELLS}, field
    assert {(c.group_owner, c.globals_owner) for c in fast} == {(c.group_owner, c.globals_owner) for c in CELLS}
    assert all(in_make_test(c) for c in REFUSED)
    assert 0 < len(fast) < len(CELLS)


def test_the_only_known_bug_left_is_the_wrapper_race() -> None:
    """No cell is expected to fail every time; the two wrapper-race cells may (issue 11 fixed the success-plan switch)."""
    bugs = {c.id: known_bug(c) for c in CELLS if known_bug(c) is not None}
    assert not [i for i, (_, strict) in bugs.items() if strict]
    assert set(bugs) == {
        "ws2-inprocess-pg_session-mp_session-on_train_end-exception",
        "ws2-inprocess-pg_session-mp_session-on_train_end-teardown_step",
    }
    assert all(known_bug(c) is None for c in REFUSED)
