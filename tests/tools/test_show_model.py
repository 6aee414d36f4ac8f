"""``show``'s model: journal records grouped into runs, jobs and attempts under named keys, verdicts as enums.

Torch-free; the views built on it (text, charts, page) are pinned in ``test_show.py`` and ``test_show_verdict.py``.
"""

from __future__ import annotations

import pytest
from support.internals import synthetic

from lifecycle._tools.show import model as show_model
from lifecycle._tools.show.verdict import Decided, Outcome
from lifecycle.journal import Origin, Record, TeardownStep
from lifecycle.lowlevel import declared_resources

RunKey, AttemptKey = show_model.RunKey, show_model.AttemptKey  # the keys a view never indexes


def flat(ranks: dict[int, list[Record]]) -> list[Record]:
    """Every rank's records, rank after rank (as the reader returns a folder's journals)."""
    return [r for records in ranks.values() for r in records]


def test_attempts_are_keyed_by_name_not_by_tuple_position() -> None:
    """An attempt's key names its run, job, torchrun restart, attempt, restart mode and iteration; it is no tuple."""
    model = show_model.build(flat(synthetic.failing_run("r", 2, 2)))
    (run,) = model.runs
    assert run.key == RunKey("r", 0) and run.jobs == 1
    assert [a.key for a in run.attempts] == [AttemptKey(RunKey("r", 0), 0, n, "ordinary", 0) for n in (0, 1)]
    with pytest.raises(TypeError):
        run.attempts[0].key[0]  # type: ignore[index]  # a view cannot index it by position
    assert [d.stem for d in run.drawn] == ["attempt0", "attempt1"]


def test_a_restarted_workers_attempts_are_numbered_on_and_iterations_drawn_together() -> None:
    """torchrun restart 1's attempt 0 is attempt 2 after attempts 0-1; two in-process iterations make one drawing."""
    records: list[Record] = []
    start = 1_000.0
    for restarts, attempt, iteration in [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 0, 1)]:
        origin = Origin("r", 0, attempt, "inprocess" if iteration else "ordinary", iteration, restart_count=restarts)
        records += synthetic.rank_call(origin, 1, start, steps=2, end="failed", error="E: x")
        start += 10
    (run,) = show_model.build(records).runs
    assert [(a.number, a.label) for a in run.attempts] == [
        (0, "attempt 0 (torchrun restart 0)"),
        (1, "attempt 1 (torchrun restart 0)"),
        (2, "attempt 2 (torchrun restart 1)"),
        (2, "attempt 2 (torchrun restart 1, restart mode inprocess, iteration 1)"),
    ]
    assert [d.stem for d in run.drawn] == ["attempt0", "attempt1", "attempt2"]
    assert len(run.drawn[2].ranks[0]) == len(run.attempts[2].ranks[0]) + len(run.attempts[3].ranks[0])


def test_jobs_that_shared_a_run_id_are_runs_of_their_own_with_a_warning() -> None:
    """A rank starting the same attempt again begins the next job: two RunKeys, a warning, job-named drawings."""
    first = synthetic.rank_call(Origin("r", 0, 0, "ordinary", 0), 1, 1_000.0, steps=2)
    second = synthetic.rank_call(Origin("r", 0, 0, "ordinary", 0), 1, 2_000.0, steps=2)
    model = show_model.build(first + second)
    assert [(run.key, run.jobs) for run in model.runs] == [(RunKey("r", 0), 2), (RunKey("r", 1), 2)]
    assert [d.stem for run in model.runs for d in run.drawn] == ["job1-attempt0", "job2-attempt0"]
    assert model.warnings == (
        "run id r was used by 2 jobs (a rank started the same attempt again): each is shown as a run of its own,"
        " in order of start time",
    )


def test_verdicts_and_rank_outcomes_are_enums() -> None:
    """How the first failure was decided and how each rank ended are enum members, not strings to compare."""
    ranks = synthetic.failing_run("r", 4, 1)
    ranks[3] = ranks[3][:5]  # killed before it failed
    (run,) = show_model.build(flat(ranks)).runs
    verdict = run.attempts[0].verdict
    assert verdict.decided is Decided.BY_SEQUENCE and verdict.first is not None and verdict.first.rank == 1
    assert {rank: end.outcome for rank, end in verdict.ends.items()} == {
        0: Outcome.FAILED,
        1: Outcome.FAILED,
        2: Outcome.FAILED,
        3: Outcome.CUT,
    }
    assert [g.outcome for g in verdict.groups] == [Outcome.FAILED, Outcome.CUT]
    closed = show_model.build(synthetic.rank_call(Origin("c", 0, 0, "ordinary", 0), 2, 1.0, steps=1)).runs[0]
    assert closed.attempts[0].verdict.decided is Decided.NO_FAILURE
    assert [g.outcome for g in closed.attempts[0].verdict.groups] == [Outcome.ENDED, Outcome.MISSING]


def test_synthetic_journals_name_each_teardown_step_and_resource_as_declared() -> None:
    """Each synthetic teardown step names the resource kind that declares it (close_store: rendezvous_store)."""
    records = flat(synthetic.failing_run("r", 2, 1)) + synthetic.rank_call(
        Origin("c", 0, 0, "ordinary", 0), 1, 1.0, steps=1
    )
    steps = {(r.step, r.resource) for r in records if isinstance(r, TeardownStep)}
    declared = {(kind.value, resource.value) for resource in declared_resources() for kind in resource.steps}
    assert steps <= declared and ("close_store", "rendezvous_store") in steps
