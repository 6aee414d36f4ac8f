"""``show``'s collectives lines (issue 40): where each failing rank stood in each group, and the culprit's verdict."""

from __future__ import annotations

from lifecycle._tools.show.collectives import collective_lines
from lifecycle.journal import Collectives, GroupPosition, Origin, Verdict
from lifecycle.journal.evidence import Evidence


def _origin(rank: int) -> Origin:
    """Rank ``rank``'s origin in attempt 0 of run ``r``."""
    return Origin("r", rank, 0, "ordinary", 0)


def _stood(rank: int, *groups: tuple[str, int, int, str]) -> Collectives:
    """Rank ``rank``'s ``collectives`` record: (label, entered, left, op) per group."""
    positions = tuple(GroupPosition(label=label, entered=e, left=left, op=op) for label, e, left, op in groups)
    return Collectives(origin=_origin(rank), time=1.0, groups=positions, step=100, phase="step")


def test_the_waiting_ranks_and_the_culprits_verdict_make_one_line_per_group() -> None:
    """Ranks 0 and 2 wait in all_reduce #101 of the data-parallel group, rank 3 left #100; rank 1, killed, was stuck
    before #101 (its verdict's evidence): one line for the group, ranks that stood alike together; none for the
    default group, whose last collective every rank had left."""
    facts = Evidence(
        "stuck_outside", 1, 100, "step", "S", 10.0, 2.0, "monitor", "the data-parallel group", "all_reduce #101", (0, 2)
    )
    verdict = Verdict(
        origin=_origin(1), culprit=1, verdict="stuck_outside", phase="step", step=100, note="", time=2.0, seq=1,
        stacks="", evidence=facts, killed=True,
    )  # fmt: skip
    ranks = {
        0: [_stood(0, ("data-parallel", 101, 100, "all_reduce"), ("default", 7, 7, "all_reduce"))],
        1: [verdict],
        2: [_stood(2, ("data-parallel", 101, 100, "all_reduce"))],
        3: [_stood(3, ("data-parallel", 100, 100, "all_reduce"))],
    }
    lines = collective_lines(ranks)
    assert lines == [
        "  collectives in the data-parallel group: ranks 0, 2: in all_reduce #101; "
        "rank 1: before all_reduce #101 (stuck_outside: its verdict); rank 3: left all_reduce #100",
    ], lines  # the default group, where nobody waited, says nothing


def test_no_collectives_recorded_or_none_waited_in_means_no_lines() -> None:
    """An attempt without ``collectives`` records (liveness off, an older journal) adds nothing to the timeline; nor
    does one whose ranks had all left their groups' last collectives (a raise between collectives)."""
    assert collective_lines({0: [], 1: []}) == []
    left = {0: [_stood(0, ("data-parallel", 30, 30, "all_reduce"))], 1: [_stood(1, ("default", 34, 34, "all_reduce"))]}
    assert collective_lines(left) == []
