"""Table test of ``expected(cell)``: each row pins one branch of the matrix's expected outcome.

Also pins the matrix's shape: which cells exist (1056: 18 points × 4 raises × 16
configurations, less the success steps of what the caller owns), which are refused and
which ``make test`` runs. Torch-free: runs under ``make test-unit``.
"""

from __future__ import annotations

import itertools

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
from reliability.matrix_cells import (
    ALL_CELLS,
    CELLS,
    MODES,
    OWNERS,
    POINTS,
    RAISED,
    REFUSED,
    SUCCESS_STEP_POINTS,
    WORLD_SIZES,
    Cell,
    in_make_test,
)

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
        RankOutcome(WRAPPER_STOPS, (FAILED,)),
        None,
        RankOutcome(RESTART, (FAILED_OR_CLOSED, CLOSED)),
        True,
        True,
        id="inprocess-success-teardown-step: the failure plan leaves the group to the Wrapper, whose abort fails",
    ),
    pytest.param(
        cell("success_destroy_globals", "exception"),
        (1,),
        RankOutcome(TEARDOWN_ERROR, (FAILED,)),
        None,
        RankOutcome(ERROR_OR_RESULT, (FAILED_OR_CLOSED,)),
        False,
        True,
        id="ordinary-success-step: a failed destroy in close() reaches the caller in a TeardownError",
    ),
    pytest.param(
        cell("success_destroy_group", "system_exit"),
        (1,),
        RankOutcome(ORIGINAL, (FAILED,)),
        None,
        RankOutcome(ERROR_OR_RESULT, (FAILED_OR_CLOSED,)),
        False,
        True,
        id="ordinary-success-step-interrupt: the interrupt itself",
    ),
    pytest.param(
        cell("success_barrier", "teardown_step"),
        (1,),
        RankOutcome(TEARDOWN_ERROR, (FAILED,)),
        None,
        RankOutcome(ERROR_OR_RESULT, (FAILED_OR_CLOSED,)),
        True,
        True,
        id="ordinary-success-step-teardown-step: the failure plan's first release fails too",
    ),
    pytest.param(
        cell("success_finalize_checkpoints", "teardown_step", group="caller", globals_="caller"),
        (0, 1),
        RankOutcome(TEARDOWN_ERROR, (FAILED,)),
        RankOutcome(SOME_ERROR, (FAILED,)),
        None,
        False,
        True,
        id="success-step-caller-owned: every rank armed, the session releases nothing of the caller's",
    ),
    pytest.param(
        cell("success_destroy_globals", "exception", mode="inprocess"),
        (1,),
        RankOutcome(RESTART, (FAILED, CLOSED)),
        None,
        RankOutcome(RESTART, (FAILED_OR_CLOSED, CLOSED)),
        False,
        False,
        id="inprocess-success-step: a plain restart",
    ),
    pytest.param(
        cell("success_destroy_group", "teardown_step", mode="inprocess"),
        (1,),
        RankOutcome(WRAPPER_STOPS, (FAILED,)),
        None,
        RankOutcome(RESTART, (FAILED_OR_CLOSED, CLOSED)),
        True,
        True,
        id="inprocess-success-step-teardown-step: the Wrapper's abort fails and it stops on that rank",
    ),
    pytest.param(
        cell("success_barrier", "keyboard_interrupt", mode="inprocess"),
        (0, 1),
        RankOutcome(ORIGINAL, (FAILED,)),
        RankOutcome(SOME_ERROR, (FAILED,)),
        None,
        False,
        True,
        id="inprocess-success-step-interrupt: ends the Wrapper on every rank",
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


def test_the_matrix_has_every_cell_that_exists_and_no_other() -> None:
    """1056 cells: every point × raise × configuration, less a success step of the caller's group or globals."""
    assert len(POINTS) == 18 and len(RAISED) == 4
    assert (len(ALL_CELLS), len(CELLS), len(REFUSED)) == (1056, 536, 8)
    assert len({c.id for c in ALL_CELLS}) == len(ALL_CELLS)
    for group, globals_, mode, world in itertools.product(OWNERS, OWNERS, MODES, WORLD_SIZES):
        points = {
            c.point
            for c in ALL_CELLS
            if (c.group_owner, c.globals_owner, c.mode, c.world_size) == (group, globals_, mode, world)
        }
        absent = {"success_barrier", "success_destroy_group"} if group == "caller" else set()
        absent |= {"success_destroy_globals"} if globals_ == "caller" else set()
        assert points == set(POINTS) - absent, (group, globals_, mode, world)


@pytest.mark.parametrize(
    ("c", "why"),
    [
        (cell("success_destroy_group", "exception", group="caller"), "the session never destroys the caller's group"),
        (cell("success_barrier", "exception", group="caller"), "the session never destroys the caller's group"),
        (
            cell("success_destroy_globals", "exception", group="caller", globals_="caller"),
            "the session never destroys the caller's globals",
        ),
        (cell("success_finalize_checkpoints", "exception", group="caller", globals_="caller"), None),
        (cell("success_destroy_globals", "exception", group="caller"), None),
    ],
)
def test_a_success_step_of_what_the_caller_owns_is_absent(c: Cell, why: str | None) -> None:
    """A success-plan point exists only where the session owns what its step releases; the checkpoint's always."""
    assert c.absent == why


def test_make_test_subset_covers_every_value() -> None:
    """The make-test subset has every point, raise, owner combination, mode and world size, and every refusal."""
    fast = [c for c in ALL_CELLS if c.refusal is None and in_make_test(c)]
    for field in ("point", "raised", "mode", "world_size"):
        assert {getattr(c, field) for c in fast} == {getattr(c, field) for c in CELLS}, field
    assert {(c.group_owner, c.globals_owner) for c in fast} == {(c.group_owner, c.globals_owner) for c in CELLS}
    assert all(in_make_test(c) for c in REFUSED)
    assert 0 < len(fast) < len(CELLS)
    assert len(fast) == 162


def test_make_test_keeps_a_few_cells_of_each_success_step() -> None:
    """Of the success steps' points, make test runs the ordinary two-rank session-owned exceptions and one Ctrl-C."""
    fast = {(c.point, c.raised) for c in CELLS if c.point in SUCCESS_STEP_POINTS and in_make_test(c)}
    assert fast == {(p, "exception") for p in SUCCESS_STEP_POINTS} | {("success_destroy_globals", "keyboard_interrupt")}
    for c in CELLS:
        if c.point in SUCCESS_STEP_POINTS and in_make_test(c):
            assert (c.world_size, c.mode, c.group_owner, c.globals_owner) == (2, "ordinary", "session", "session")


def test_no_cell_is_a_known_bug_any_more() -> None:
    """Every cell must pass: the success-plan switch and the wrapper races were fixed in issue 11."""
    assert [c.id for c in CELLS if known_bug(c) is not None] == []
    assert all(known_bug(c) is None for c in REFUSED)
