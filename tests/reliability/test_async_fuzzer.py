"""The asynchronous-exception fuzzer: an exception raised into the main thread at every line lifecycle runs.

Stands for NVRx's ``RankShouldRestart`` (``PyThreadState_SetAsyncExc``), which lands on
whatever bytecode the main thread runs, usually while the session is already failing.
Every line event of lifecycle's own files in a ``with session:`` run (triggers, user
registrations, the failure edge or the success plan, on the main thread and on the
teardown's worker) is a case; each must leave the session final, owning nothing, the
handlers as they were, the exception raised to the caller exactly once, and a fresh
session that closes. The meta-test shows the checks fail on a teardown run in place.
"""

from __future__ import annotations

import gc
import os
import random
import time
from collections.abc import Iterator

import pytest
from reliability.async_fuzz import Case, Scenario, count, problems_of, run_case
from reliability.fuzz import declare_pool, seed

from lifecycle._core import worker as worker_module
from lifecycle._core.holdings import REGISTRY

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


def test_a_teardown_run_in_place_is_caught(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no worker to run the teardown on, an exception landing mid-teardown cuts it short: the checks say so."""
    monkeypatch.setattr(worker_module.POOL, "submit", lambda job: False)
    _, failures = sweep(Scenario.FAIL)
    assert failures, "a teardown run on the main thread survived every landing: the fuzzer cannot fail"
    assert any("still holds" in failure or "handler" in failure for failure in failures), failures[:3]
