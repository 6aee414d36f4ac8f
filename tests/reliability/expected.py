"""What each cell of the fault matrix must end in: a pure function of the cell, torch-free.

``expected(cell)`` says, for each role a rank can have in the cell, what its caller
receives and the final state of each session it ran; plus where the fault is injected,
whether the injected teardown-step fault fires, whether the next session in the process
must be tried, and what must still be live afterwards. The matrix worker compares what
it observed with it; ``test_expected.py`` pins it row by row.

Roles: ``fired`` (the fault fired on this rank), ``preempted`` (the fault was armed but a
peer's failure reached this rank first: only where every rank of a multi-rank world is
armed), ``peer`` (no fault armed on this rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from reliability.matrix_cells import INIT_POINTS, INTERRUPTS, SUCCESS_POINTS, Cell

from lifecycle import State

# What the caller of pretrain / wrapped_pretrain receives.
ORIGINAL = "original"  # the injected exception object itself
TEARDOWN_ERROR = "teardown_error"  # a TeardownError carrying the injected exception object
RESTART = "restart"  # a PretrainResult: the Wrapper restarted, and its next iteration closed
WRAPPER_STOPS = (
    "wrapper_stops"  # the Wrapper's finalize raised a TeardownError naming the failed step (from the original)
)
REFUSAL = "refusal"  # a LifecycleError raised before anything ran (see Expectation.refusal)
SOME_ERROR = "some_error"  # an exception, whichever (a peer's failure reached this rank)
ERROR_OR_RESULT = "error_or_result"  # a peer of a failing rank: it fails, or it was done and closed

FAILED = frozenset({State.FAILED})
CLOSED = frozenset({State.CLOSED})
FAILED_OR_CLOSED = frozenset({State.FAILED, State.CLOSED})

GROUP = "process_group"
GLOBALS = frozenset({"model_parallel", "microbatch_calculator", "rerun_state_machine"})


@dataclass(frozen=True)
class RankOutcome:
    """What one rank's caller receives, and the allowed final states of its sessions, in order."""

    gets: str
    sessions: tuple[frozenset[State], ...]


@dataclass(frozen=True)
class Expectation:
    """Everything the matrix checks about one cell, before it runs."""

    refusal: str | None
    """``stale`` / ``inprocess``: the run is refused up front; None for a real cell."""
    fault_ranks: tuple[int, ...]
    fired: RankOutcome | None
    preempted: RankOutcome | None
    """None: every armed rank must fire its own fault."""
    peer: RankOutcome | None
    """None: every rank is armed."""
    teardown_fault: bool
    """The injected ``teardown_step`` fault fires: the first release after the fault raises."""
    retry: bool
    """The next session in the process must be tried (an ordinary pretrain that must close);
    False where the Wrapper's next iteration was that next session."""
    live_after: frozenset[str]
    """What must still be live after the run: exactly what the caller created."""


def fault_ranks(cell: Cell) -> tuple[int, ...]:
    """The ranks the fault is injected on.

    Rank 1 alone wherever a rank-local failure can be survived: that is the case the
    lifecycle exists for. Every rank where one rank alone would leave its peers waiting
    for the group timeout by design: a failure before the group or the globals exist
    (peers wait in rendezvous), a failure with a caller-owned group (the session never
    aborts it: the caller's peers stay in their collective), and Ctrl-C / SystemExit
    under the Wrapper (they end the Wrapper, which then waits in its own barrier for
    the other ranks).
    """
    everyone = tuple(range(cell.world_size))
    if cell.refusal is not None:
        return ()
    if cell.world_size == 1 or cell.point in INIT_POINTS or cell.group_owner == "caller":
        return everyone
    if cell.mode == "inprocess" and cell.raised in INTERRUPTS:
        return everyone
    return (1,)


def caller_owned(cell: Cell) -> frozenset[str]:
    """The resources the caller creates before the run (and that must outlive it)."""
    owned: set[str] = set()
    if cell.group_owner == "caller":
        owned.add(GROUP)
    if cell.globals_owner == "caller":
        owned |= GLOBALS
    return frozenset(owned)


def teardown_fault_fires(cell: Cell) -> bool:
    """Whether a release of the session's (or the Wrapper's) actions follows the fault.

    The teardown-step fault is raised by the first release the actions perform after
    the fault fired: there is one only if the session created the group or the globals
    before the fault (nothing exists yet at ``pg_init``; caller-owned state is never
    released).
    """
    created = "session" in (cell.group_owner, cell.globals_owner)
    return cell.raised == "teardown_step" and cell.point != "pg_init" and created


def expected(cell: Cell) -> Expectation:
    """The outcome the matrix requires of ``cell``."""
    live = caller_owned(cell)
    if cell.refusal is not None:
        # Stale globals: the session creates the group, then refuses the globals and fails.
        # In-process with caller state: refused before the Wrapper starts a session.
        sessions = (FAILED,) if cell.refusal == "stale" else ()
        refused = RankOutcome(REFUSAL, sessions)
        return Expectation(cell.refusal, (), None, None, refused, False, True, live)
    ranks = fault_ranks(cell)
    everyone = len(ranks) == cell.world_size
    may_be_preempted = everyone and cell.world_size > 1
    teardown = teardown_fault_fires(cell)
    if cell.mode == "inprocess" and teardown:
        # The failed step of the Wrapper's abort makes its finalize raise: the Wrapper
        # stops on this rank instead of restarting on top of live state; peers restart.
        # At a success-plan point too: the session's failure plan, switched to, leaves
        # the group to the Wrapper, so the Wrapper's abort is the release that fails.
        stopped = RankOutcome(WRAPPER_STOPS, (FAILED,))
        peer = None if everyone else RankOutcome(RESTART, (FAILED_OR_CLOSED, CLOSED))
        return Expectation(None, ranks, stopped, stopped if may_be_preempted else None, peer, True, True, live)
    if cell.mode == "inprocess" and cell.raised not in INTERRUPTS:
        # The Wrapper restarts every rank; iteration 1 is the next session and closes. A
        # peer may have closed iteration 0 before the restart reached it.
        restarted = RankOutcome(RESTART, (FAILED, CLOSED))
        peer = None if everyone else RankOutcome(RESTART, (FAILED_OR_CLOSED, CLOSED))
        return Expectation(None, ranks, restarted, restarted if may_be_preempted else None, peer, teardown, False, live)
    # A failed success-plan step reaches the caller in a TeardownError (an interrupt as itself),
    # after the session switched to the failure plan: no barrier, no collective after it.
    gets = TEARDOWN_ERROR if cell.point in SUCCESS_POINTS and cell.raised not in INTERRUPTS else ORIGINAL
    fired = RankOutcome(gets, (FAILED,))
    preempted = RankOutcome(SOME_ERROR, (FAILED,)) if may_be_preempted else None
    peer = None if everyone else RankOutcome(ERROR_OR_RESULT, (FAILED_OR_CLOSED,))
    return Expectation(None, ranks, fired, preempted, peer, teardown, True, live)


def known_bug(cell: Cell) -> tuple[str, bool] | None:
    """Why ``cell`` fails on today's library, and whether it fails every time; None if it must pass.

    The matrix runs such a cell as an expected failure (strict where it fails every time,
    so the fix has to remove the entry). None are left: the races between a rank's
    success plan and the Wrapper's abort in its monitor thread were fixed by claiming
    each entry before a release (``TeardownRunner._perform``).
    """
    del cell
    return None
