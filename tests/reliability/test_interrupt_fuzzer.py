"""The interrupt fuzzer: a SIGINT or SIGTERM at every line lifecycle runs while it tears down, then checks.

For each line event of ``fail(error)`` from ``training`` and of ``close()`` (clean, and
with a user release that raises), a fresh session gets SIGINT, SIGTERM (the previous
handler a Python one), or SIGINT twice (N and N + k: escalation) at that line; then
``fuzz``'s checks look at the session, at what reached the caller, at the process's
signal handlers and ``LEFTOVERS``, and at the next session of the process. The meta-tests
run each check against a deliberately broken lifecycle and expect it to fail. What the
fuzzer found wrong in lifecycle (eleven bugs: signals landing between the shield's
entry and exit, escalations in bookkeeping leaving a session live or unreported, a
restore window, abandoned signal handlers) was fixed; every case of the sweep must now pass every check.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from reliability.fuzz import (
    REAL_CHECKS,
    Case,
    Lines,
    Run,
    Scenario,
    Variant,
    cases,
    check_cause,
    check_final,
    check_group,
    check_handlers,
    check_interrupts,
    check_ledger,
    check_leftovers,
    check_next,
    check_no_barrier_after_failure,
    count_lines,
    declare_pool,
    drain_leftovers,
    hits,
    problems_of,
    run_case,
    seed,
)
from support.internals import LEFTOVERS, REGISTRY, Shield, executor
from support.internals import session as session_module
from support.internals import shield as shield_module
from support.internals import teardown as runner_module

from lifecycle.lowlevel import Ledger

# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def untouched_process() -> Iterator[None]:
    """Every test ends with SIGINT/SIGTERM's handlers as it found them and no tracer set."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    after = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    tracer = sys.gettrace()
    sys.settrace(None)
    for signum, handler in before.items():
        signal.signal(signum, handler)
    assert after == before, "a test left a SIGINT/SIGTERM handler changed"
    assert tracer is None, "a test left a tracer set"


@pytest.fixture(autouse=True)
def quiet() -> Iterator[None]:
    """lifecycle's ERROR lines (one per failure teardown, thousands here) are not logged."""
    logger = logging.getLogger("lifecycle")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    yield
    logger.setLevel(level)


@pytest.fixture
def pool() -> Iterator[None]:
    """The torch-free process-wide kind ``fuzz_pool`` is declared; ``LEFTOVERS`` is empty before and after."""
    drain_leftovers()
    with declare_pool():
        yield
    drain_leftovers()


# -- the bugs the fuzzer found -----------------------------------------------------------


@dataclass(frozen=True)
class Anchor:
    """A line event found by where it is, not by its index (lifecycle's code moves)."""

    region: str
    line: str


@dataclass(frozen=True)
class Repro:
    """A case that shows a bug: signals at ``first`` (and at ``second``, found after it)."""

    scenario: Scenario
    variant: Variant
    first: Anchor
    second: Anchor | None = None

    def case(self, lines: Lines) -> Case:
        """The case on today's code (``LookupError`` if an anchor is gone)."""
        at = lines.find(self.first.region, self.first.line)
        if self.second is None:
            return Case(self.scenario, self.variant, at)
        return Case(self.scenario, self.variant, at, lines.find(self.second.region, self.second.line, at) - at)


_TEARDOWN_LINE = Anchor(
    "TeardownRunner.run_plan", "planned = teardown(self._host.ledger, self._host.restart_mode, outcome)"
)


# -- the torch-free sweep ----------------------------------------------------------------


@dataclass
class Sweep:
    """What a sweep saw: the seed, hits by region, and the problems of every case that had any."""

    seed: int
    events: int
    cases: int = 0
    regions: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        regions = ", ".join(f"{name} {count}" for name, count in self.regions.most_common())
        return f"seed {self.seed}: {self.cases} cases over {self.events} line events\n  hits by region: {regions}"


SAMPLE = int(os.environ.get("LIFECYCLE_FUZZ_SAMPLE", "500"))
"""A seeded sample of this many cases per scenario (``make test``: the teardown runs on a worker now, and every
case of the three scenarios, about 9,000, takes about 4 minutes); 0: every case (``make fuzz-all``)."""


def sweep(scenario: Scenario) -> Sweep:
    """Run the cases of ``scenario`` (a seeded sample, or all); keep the problems of each case that has any."""
    lines = count_lines(scenario)
    assert count_lines(scenario) == lines, "two counts of the same teardown differ: the fuzzer cannot replay it"
    rng = random.Random(f"{seed()}:{scenario}")
    result = Sweep(seed(), len(lines.events))
    every = cases(scenario, lines, rng)
    if SAMPLE:
        every = sorted(rng.sample(every, min(SAMPLE, len(every))), key=lambda case: (case.at, case.variant))
    for case in every:
        run = run_case(case)
        found = problems_of(run)
        result.cases += 1
        result.regions.update(hits([run]))
        if found:
            result.failures.append(f"{run}: {found}")
    return result


@pytest.mark.parametrize("scenario", list(Scenario))
def test_an_interrupt_at_any_line_of_a_teardown_leaves_the_session_final_and_the_process_clean(
    scenario: Scenario, pool: None
) -> None:
    """At every line event: final, journaled, nothing held unreported, one interrupt, a clean next session."""
    start = time.monotonic()
    result = sweep(scenario)
    took = time.monotonic() - start
    print(f"\n{scenario}: {result.summary()}\n  took {took:.1f} s")
    assert not result.failures, f"{len(result.failures)} case(s) with problems; {result.summary()}\n" + "\n".join(
        result.failures[:15]
    )


# -- meta-tests: each check fails on a broken lifecycle ----------------------------------


def _anchored(scenario: Scenario, variant: Variant, first: Anchor, second: Anchor | None = None) -> Run:
    return run_case(Repro(scenario, variant, first, second).case(count_lines(scenario)))


_MID_TEARDOWN = Anchor("execute", "perform(step)")
_FIRST_STEP = Anchor("execute", "for step in teardown.plan:")


def _fine_then_broken(
    check: Callable[[Run], list[str]], make: Callable[[], Run], breaks: Callable[[], None]
) -> list[str]:
    """``check``'s problems on ``make()``'s run: none on today's lifecycle, then the problems once ``breaks()`` ran."""
    assert check(make()) == [], f"{check.__name__} fails on the unbroken library"
    breaks()
    problems = check(make())
    print(f"\n{check.__name__} on the broken library: {problems}")
    return problems


def test_shield_off_is_caught_by_the_interrupt_check(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the shield never seeing a teardown on the stack, a Ctrl-C mid-teardown reaches the handler while live."""
    problems = _fine_then_broken(
        check_interrupts,
        lambda: _anchored(Scenario.FAIL, Variant.SIGINT, _MID_TEARDOWN),
        lambda: monkeypatch.setattr(shield_module, "_on_stack", lambda frame, codes, owner: False),
    )
    assert any("while the session was training" in p for p in problems), problems


def test_reclaim_off_is_caught_by_the_next_session_check(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``LEFTOVERS.take`` returning None, the pool an escalation left live is not reclaimed by the next session."""
    problems = _fine_then_broken(
        check_next,
        lambda: _anchored(Scenario.FAIL, Variant.DOUBLE, _TEARDOWN_LINE, _FIRST_STEP),
        lambda: monkeypatch.setattr(LEFTOVERS, "take", lambda resource: None),
    )
    assert any("not reclaimed" in p or "did not reach training" in p for p in problems), problems


def test_barrier_after_a_failed_success_step_is_caught(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``stop_at_failure`` ignored, the success plan runs on past the failed user release into the barrier."""
    real = executor.execute

    def execute_all(*args: Any, **kwargs: Any) -> Any:
        kwargs["stop_at_failure"] = False
        return real(*args, **kwargs)

    problems = _fine_then_broken(
        check_no_barrier_after_failure,
        lambda: _anchored(Scenario.CLOSE_FAULTY, Variant.SIGTERM, _MID_TEARDOWN),
        lambda: monkeypatch.setattr(runner_module, "execute", execute_all),
    )
    assert any("barrier" in p for p in problems), problems


def test_journal_off_is_caught_by_the_final_check(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``_journal_move`` a no-op, the journal does not end with the move to ``failed``."""
    problems = _fine_then_broken(
        check_final,
        lambda: _anchored(Scenario.FAIL, Variant.SIGINT, _MID_TEARDOWN),
        lambda: monkeypatch.setattr(session_module.Session, "_journal_move", lambda self, *args: None),
    )
    assert any("journal" in p for p in problems), problems


def test_ledger_bookkeeping_off_is_caught_by_the_ledger_check(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``Ledger.release`` recording nothing, released resources look held though nothing was abandoned."""
    problems = _fine_then_broken(
        check_ledger,
        lambda: _anchored(Scenario.FAIL, Variant.SIGINT, _MID_TEARDOWN),
        lambda: monkeypatch.setattr(Ledger, "release", lambda self, entry: self),
    )
    assert any("neither abandoned nor released" in p for p in problems), problems


def test_leftovers_unrecorded_is_caught_by_the_leftovers_check(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With holdings never registered process-wide, what an escalation abandons is held but not recorded."""
    problems = _fine_then_broken(
        check_leftovers,
        lambda: _anchored(Scenario.FAIL, Variant.DOUBLE, _TEARDOWN_LINE, _FIRST_STEP),
        lambda: monkeypatch.setattr(REGISTRY, "add", lambda holdings: None),
    )
    assert any("not recorded in LEFTOVERS" in p for p in problems), problems


def test_handlers_left_installed_is_caught_by_the_handler_check(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``Shield._restore`` a no-op, the shield's handlers outlive the session."""
    problems = _fine_then_broken(
        check_handlers,
        lambda: _anchored(Scenario.FAIL, Variant.SIGTERM, _MID_TEARDOWN),
        lambda: monkeypatch.setattr(Shield, "_restore", lambda self: self._links.clear()),
    )
    assert problems, problems


def test_interrupt_raised_twice_is_caught_by_the_interrupt_check(pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``Shield.remove`` delivering the deferred signal twice, the previous handler runs twice for one Ctrl-C."""
    real = Shield.remove

    def remove_twice(self: Shield, cause: BaseException | None = None) -> Any:
        pending, links = self._pending, dict(self._links)
        with contextlib.suppress(KeyboardInterrupt):
            real(self, cause)
        link = links.get(pending[0]) if pending is not None else None
        if pending is not None and link is not None:
            link(*pending)  # deactivated by now: it passes the signal to the previous handler

    problems = _fine_then_broken(
        check_interrupts,
        lambda: _anchored(Scenario.FAIL, Variant.SIGINT, _MID_TEARDOWN),
        lambda: monkeypatch.setattr(Shield, "remove", remove_twice),
    )
    assert any("reached the previous handler 2 time(s)" in p for p in problems), problems


def test_an_unchained_deferred_interrupt_is_caught_by_the_cause_check(
    pool: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``fail`` raising the deferred Ctrl-C without its cause, ``check_cause`` fails."""
    real = session_module.Session.fail

    def unchained(self: session_module.Session, error: BaseException) -> Any:
        try:
            return real(self, error)
        except KeyboardInterrupt as interrupt:
            interrupt.__cause__ = None
            interrupt.__suppress_context__ = True
            raise interrupt from None

    problems = _fine_then_broken(
        check_cause,
        lambda: _anchored(Scenario.FAIL, Variant.SIGINT, _MID_TEARDOWN),
        lambda: monkeypatch.setattr(session_module.Session, "fail", unchained),
    )
    assert problems, problems


# -- real gloo ---------------------------------------------------------------------------

GLOO_SAMPLES = 30


def _gloo_actions(calls: list[str]) -> Any:
    from support.configs import ONE

    from lifecycle import ParallelConfig, TorchActions

    return TorchActions(ONE, ParallelConfig())


def _gloo_run(case: Case) -> Run:
    import torch.distributed as dist

    from lifecycle.testing import alive

    return run_case(case, _gloo_actions, world=alive, is_initialized=dist.is_initialized)


@pytest.fixture
def gloo() -> Iterator[Callable[[], list[str]]]:
    """Nothing alive before or after; yields ``release_everything`` for use between cases."""
    from lifecycle.testing import release_everything

    drain_leftovers()
    release_everything()
    yield release_everything
    release_everything()
    drain_leftovers()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_interrupts_on_real_gloo_leave_nothing_alive_after_the_next_session(gloo: Callable[[], list[str]]) -> None:
    """A seeded sample of line events on a 1-rank gloo world: final, group gone or reclaimed, nothing left alive."""
    rng = random.Random(seed())
    lines = {scenario: count_lines(scenario, _gloo_actions) for scenario in Scenario}
    gloo()
    sample = []
    for _ in range(GLOO_SAMPLES):
        scenario = rng.choice(list(Scenario))
        variant = rng.choice(list(Variant))
        at = rng.choice(lines[scenario].targets)
        sample.append(Case(scenario, variant, at, rng.randint(1, 60) if variant is Variant.DOUBLE else 0))
    failures, regions, group_left = [], Counter[str](), 0
    start = time.monotonic()
    for case in sample:
        run = _gloo_run(case)
        gloo()
        left = problems_of(run, REAL_CHECKS)
        regions.update(hits([run]))
        group_left += bool(run.dist_initialized)
        if left:
            failures.append(f"{run}: {left}")
        del run  # it holds the fuzzed session, and so its group's store
    summary = (
        f"seed {seed()}: {len(sample)} cases; hits by region: {dict(regions.most_common())}; "
        f"{group_left} left the default group initialized for the next session to reclaim"
    )
    print(f"\ngloo: {summary}; took {time.monotonic() - start:.1f} s")
    assert not failures, f"{summary}\n" + "\n".join(failures)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_reclaim_off_on_real_gloo_is_caught(gloo: Callable[[], list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``LEFTOVERS.take`` returning None, the group an escalation left is adopted as the caller's: caught."""
    lines = count_lines(Scenario.FAIL, _gloo_actions)
    case = Repro(Scenario.FAIL, Variant.DOUBLE, _TEARDOWN_LINE, _FIRST_STEP).case(lines)
    checks = (check_next, check_group)
    gloo()
    assert problems_of(_gloo_run(case), checks) == {}
    gloo()
    monkeypatch.setattr(LEFTOVERS, "take", lambda resource: None)
    found = problems_of(_gloo_run(case), checks)
    assert "check_group" in found, found
    assert any("caller" in p for p in found.get("check_next", [])), found


# -- a stuck peer ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_failing_rank_tears_down_and_releases_a_peer_stuck_in_a_collective(tmp_path: Path) -> None:
    """Rank 1 fails while rank 0 waits in an all-reduce on the default group: both get out well inside the timeout."""
    from support.configs import GROUP_TIMEOUT_S
    from support.launch import run_workers

    results = run_workers("stuck_peer_worker", timeout_s=60, env={"RESULTS": str(tmp_path)})
    assert all(result.ok for result in results), "\n".join(map(str, results))
    stuck, failing = (json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1))
    print(f"\nstuck peer: rank 0 {stuck}\n            rank 1 {failing}")
    assert failing["error"] == "PlannedFailure" and failing["same_object"], failing
    assert failing["teardown_s"] < 2.0 < GROUP_TIMEOUT_S, failing  # no wait on the peer, nor for the timeout
    assert stuck["error"] is not None and "all_reduce" not in stuck, stuck
    released_s = stuck["error_at"] - failing["raised_at"]
    assert released_s < 2.0, (released_s, stuck)  # released by rank 1's abort, not by the group timeout
    assert stuck["teardown_s"] < 2.0, stuck
    assert failing["state"] == stuck["state"] == "failed"
    assert not any(failing["alive"].values()) and not any(stuck["alive"].values()), (stuck, failing)
