"""The asynchronous-exception fuzzer: an exception raised into the main thread at every line lifecycle runs.

Stands for NVRx's ``RankShouldRestart`` (``PyThreadState_SetAsyncExc``), which lands on
whatever bytecode the main thread runs, usually while the session is already failing.
Every line event of lifecycle's own files in a ``with session:`` run (triggers, user
registrations, the failure edge or the success plan, on the main thread and on the
teardown's worker) is a case; each must leave the session final, owning nothing, the
handlers as they were, the exception raised to the caller exactly once, and a fresh
session that closes. The meta-test shows the checks fail on a teardown run in place.

A sweep's line numbers drift: sessions some cases leave in the holdings' registry lengthen
the later runs (2,566 line events before 800 cases, 4,204 after), so the planned tail of
``fail`` is never reached by a long sweep. The shield's removal there is targeted line by
line right after a fresh count instead.
"""

from __future__ import annotations

import gc
import os
import random
import time
from collections.abc import Iterator

import pytest
from reliability.async_fuzz import Case, Scenario, count, lines, problems_of, run_case
from reliability.fuzz import declare_pool, seed
from support.internals import REGISTRY, WORKERS

SAMPLE = int(os.environ.get("LIFECYCLE_ASYNC_FUZZ_SAMPLE", "400"))
"""A seeded sample of this many line events per scenario (``make test``); 0: every one (``make fuzz-all``)."""


@pytest.fixture
def pool() -> Iterator[None]:
    """The torch-free process-wide kind is declared; the registry of holdings holds only this test's sessions.

    Earlier tests' sessions (live ones a test kept, or not yet collected) lengthen the
    registry's scans by a number of lines that changes as they are collected: counts
    would not replay.
    """
    gc.collect()
    with REGISTRY._lock:
        kept, REGISTRY._all = REGISTRY._all, {}
    try:
        with declare_pool():
            yield None
    finally:
        with REGISTRY._lock:
            REGISTRY._all = {**kept, **REGISTRY._all}


def sweep(scenario: Scenario) -> tuple[int, list[str]]:
    """Run the cases of ``scenario`` (all, or a seeded sample); the problems of each case that has any."""
    total = count(scenario)
    assert count(scenario) == total, "two counts of one run differ: the fuzzer cannot replay it"
    indices = list(range(total))
    if SAMPLE:
        indices = sorted(random.Random(f"{seed()}:async:{scenario}").sample(indices, min(SAMPLE, total)))
    failures = []
    for at in indices:
        run = run_case(Case(scenario, at))
        found = problems_of(run)
        if found:
            failures.append(f"{run}: {found}")
    return len(indices), failures


@pytest.mark.timeout(200)
@pytest.mark.parametrize("scenario", list(Scenario))
def test_an_exception_landing_at_any_line_leaves_the_session_final_and_the_process_clean(
    scenario: Scenario, pool: None
) -> None:
    """At every line event: final, nothing held, handlers as before, the exception raised once, a clean next session."""
    start = time.monotonic()
    cases, failures = sweep(scenario)
    assert cases >= min(SAMPLE or 100, 100)
    assert not failures, f"{len(failures)} of {cases} cases failed (seed {seed()}):\n" + "\n".join(failures[:20])
    print(f"{scenario}: {cases} cases in {time.monotonic() - start:.1f} s")


@pytest.mark.slow  # the fuzzer's own check (it fails on a build that runs the teardown in place): 34 s
def test_a_teardown_run_in_place_is_caught(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no worker to run the teardown on, an exception landing mid-teardown cuts it short: the checks say so."""
    monkeypatch.setattr(WORKERS, "submit", lambda job: False)
    _, failures = sweep(Scenario.FAIL)
    assert failures, "a teardown run on the main thread survived every landing: the fuzzer cannot fail"
    assert any("still holds" in failure or "handler" in failure for failure in failures), failures[:3]


SHIELD_REMOVAL = frozenset(
    {
        "Shield.remove",
        "Shield._restore",
        "_blocked",
        "Link.deactivate",
        "Link.uninstall",
        "Link.active",
        "_runs",
        "resolve",
    }
)
"""The functions that put the handlers back once the session is final (``Session._end_shield``)."""


def test_an_exception_landing_while_the_shield_is_removed_leaves_the_handlers_as_before(pool: None) -> None:
    """Each line of the shield's removal at the end of ``fail``: the handlers are the ones from before, once final."""
    events = lines(Scenario.FAIL)
    waited = max(i for i, event in enumerate(events) if event.startswith("TeardownRunner.wait:"))
    tail = [i for i, event in enumerate(events) if i > waited and event.split(":")[0] in SHIELD_REMOVAL]
    assert len(tail) >= 10, events[waited:]
    runs = [run_case(Case(Scenario.FAIL, i)) for i in tail]
    failures = [f"{run}: {found}" for run in runs if (found := problems_of(run))]
    assert not failures, f"{len(failures)} of {len(tail)} cases failed:\n" + "\n".join(failures[:10])
    # Sessions a case leaves in the registry lengthen later runs: the planned line must still be the one hit.
    planned = sum(run.where.split(" on ")[0] == events[i] for i, run in zip(tail, runs, strict=True))
    assert planned >= len(tail) * 3 // 4, [(events[i], run.where) for i, run in zip(tail, runs, strict=True)]
