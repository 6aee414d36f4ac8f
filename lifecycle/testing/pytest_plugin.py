"""lifecycle's pytest plugin: a leak guard naming what each test left alive, n-rank worlds, factory fixtures.

Registered through the ``pytest11`` entry point ``lifecycle``: active wherever the package
is installed, off with ``-p no:lifecycle``. Loading it imports no torch: the guard reads
only modules already in ``sys.modules``, the fixtures import torch when called.

- Leak guard, ``--lifecycle-leaks=off|warn|fail`` (ini ``lifecycle_leaks``, default
  ``warn``): after each test's teardown, what is alive that was not before its setup: a
  process group, a Megatron-core global, a store server lifecycle hosts, a signal handler
  lifecycle installed, a non-daemon thread (ini ``lifecycle_allowed_threads``: name
  patterns to leave alone). Each is named, with the session that created it and the
  ``file:line`` that acquired it. ``warn``: a ``LifecycleLeakWarning`` (a ``Warning``,
  not a ``UserWarning``: shown by default, not hidden by ``-W ignore::UserWarning``). ``fail``: the
  test errors in teardown and the leftovers are released (within ini
  ``lifecycle_release_timeout`` seconds; past it the process is marked dirty and every
  later test that uses ``session`` or ``megatron_parallel`` fails at once, naming the
  test that leaked). What a wider-scoped fixture creates is its own until it is torn
  down. ``@pytest.mark.lifecycle_allow_leak(*kinds)`` allows a test's deliberate leaks.
  Every setting is checked when pytest configures (``check_settings``): a bad value is
  a usage error naming it, never an INTERNALERROR; so are the selected tests' markers,
  once collected, before any test runs.
- ``@pytest.mark.world(n, timeout=60)``: the test function runs on ``n`` gloo ranks,
  each in its own process (see ``lifecycle.testing.world``); it may take only ``world``,
  ``session``, ``megatron_parallel`` and its parametrize values (pickled), and every
  rank's failure is reported with its rank.
- ``session``: a factory of ``Session`` objects on real ``TorchActions``;
  ``megatron_parallel(tp=, pp=)``: Megatron-core's parallel state. Both torn down after
  the test whatever happened (``lifecycle.testing.factories``).
"""

from __future__ import annotations

import inspect
import os
import pickle
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from lifecycle._core.errors import ConfigError, check_number
from lifecycle.testing import leaks as _leaks
from lifecycle.testing.factories import MegatronParallelFactory, SessionFactory
from lifecycle.testing.leaks import THREAD, Leak, LifecycleLeakWarning, Snapshot, find_leaks, release_leaks, snapshot
from lifecycle.testing.world import FIXTURES, Call, RankOutcome, World, WorldPool

__all__ = ["LifecycleLeakWarning", "Settings", "check_settings"]

MODES = ("off", "warn", "fail")
DEFAULT_WORLD_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Settings:
    """The plugin's settings, checked: the guard's ``mode``, the world workers' ``reuse``, ``release_timeout_s``."""

    mode: str
    reuse: bool
    release_timeout_s: float
    allowed_threads: tuple[str, ...]


def check_settings(leaks: str, workers: str, release_timeout: str, allowed_threads: Iterable[str]) -> Settings:
    """Each setting as read (text), checked; ``pytest.UsageError`` naming the first bad one and what it takes.

    ``lifecycle_leaks`` (or ``--lifecycle-leaks``): off, warn or fail (empty: warn).
    ``lifecycle_world_workers``: reuse or fresh. ``lifecycle_release_timeout``: a finite
    number of seconds > 0 (``abc`` used to crash pytest with INTERNALERROR, ``-5`` to fail
    every later test). ``lifecycle_allowed_threads``: fnmatch patterns, any text.
    """
    mode = leaks.strip() or "warn"
    if mode not in MODES:
        raise pytest.UsageError(f"lifecycle_leaks (--lifecycle-leaks) must be one of {', '.join(MODES)}, got {mode!r}")
    workers = workers.strip()
    if workers not in ("reuse", "fresh"):
        raise pytest.UsageError(f"lifecycle_world_workers must be reuse or fresh, got {workers!r}")
    try:
        timeout_s = float(release_timeout)
        check_number("lifecycle_release_timeout", timeout_s, integer=False, above=0, unit="seconds")
    except (ValueError, ConfigError):
        raise pytest.UsageError(
            f"lifecycle_release_timeout must be a finite number of seconds > 0, got {release_timeout!r}"
        ) from None
    return Settings(mode, workers == "reuse", timeout_s, tuple(allowed_threads))


def pytest_addoption(parser: pytest.Parser) -> None:
    """The guard's command-line option and the plugin's ini options."""
    group = parser.getgroup("lifecycle", "lifecycle: leak guard and n-rank worlds")
    group.addoption(
        "--lifecycle-leaks",
        choices=MODES,
        default=None,
        help="after each test, report what it left alive (warn), also error and release it (fail), or not (off). "
        "Default: the lifecycle_leaks ini value, else warn.",
    )
    parser.addini("lifecycle_leaks", "off, warn or fail: see --lifecycle-leaks", default="warn")
    parser.addini(
        "lifecycle_allowed_threads",
        "name patterns (fnmatch) of non-daemon threads a test may leave running (long-lived pools)",
        type="linelist",
        default=[],
    )
    parser.addini(
        "lifecycle_release_timeout",
        "seconds the guard's release of a test's leftovers may take before the process is marked dirty",
        default="10",
    )
    parser.addini(
        "lifecycle_world_workers",
        "reuse (a world's worker processes run the next test when the last one left nothing alive) or fresh",
        default="reuse",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers, and the guard unless it is off."""
    config.addinivalue_line(
        "markers",
        "world(n, timeout=60): run the test function on n gloo ranks, one process each (lifecycle plugin)",
    )
    config.addinivalue_line(
        "markers",
        "lifecycle_allow_leak(*kinds, reason=''): the test may leave these kinds alive (all if none named); "
        "kinds: process_group, model_parallel, microbatch_calculator, rerun_state_machine, rendezvous_store, "
        "signal_handler, thread",
    )
    settings = check_settings(
        config.getoption("lifecycle_leaks") or str(config.getini("lifecycle_leaks")),
        str(config.getini("lifecycle_world_workers")),
        str(config.getini("lifecycle_release_timeout")),
        config.getini("lifecycle_allowed_threads"),
    )
    state = _State(settings.mode, settings.reuse)
    config.stash[_STATE] = state
    if settings.mode != "off":
        guard = _Guard(state, settings.allowed_threads, settings.release_timeout_s)
        config.pluginmanager.register(guard, "lifecycle-leak-guard")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop every world's workers."""
    state = config.stash.get(_STATE, None)
    if state is not None:
        state.close_pools()


class _State:
    """Per run: the guard's mode, the dirty mark, the worlds' worker pools."""

    def __init__(self, mode: str, reuse: bool) -> None:
        self.mode = mode
        self.reuse = reuse
        self.dirty: str | None = None
        """Why this process is dirty: the test that leaked and what could not be released in time."""
        self.pools: dict[int, WorldPool] = {}

    def pool(self, size: int, config: pytest.Config) -> WorldPool:
        found = self.pools.get(size)
        if found is not None and found.alive():
            return found
        if found is not None:
            found.kill()
        made = WorldPool(size, sys_path=list(sys.path), cwd=os.getcwd())
        self.pools[size] = made
        return made

    def discard(self, size: int) -> None:
        pool = self.pools.pop(size, None)
        if pool is not None:
            pool.kill()

    def close_pools(self) -> None:
        while self.pools:
            _, pool = self.pools.popitem()
            pool.close()


_STATE = pytest.StashKey[_State]()


def _state(config: pytest.Config) -> _State:
    return config.stash[_STATE]


def _allowed(item: pytest.Item) -> set[str] | None:
    """The kinds ``lifecycle_allow_leak`` markers allow (None: every kind)."""
    kinds: set[str] = set()
    for marker in item.iter_markers("lifecycle_allow_leak"):
        if not marker.args:
            return None
        kinds.update(str(kind) for kind in marker.args)
    return kinds


def _report(nodeid: str, leaks: list[Leak] | list[str], released: str = "") -> str:
    lines = [f"lifecycle: {nodeid} left {len(leaks)} thing(s) alive:"]
    lines += [f"  - {leak}" for leak in leaks]
    if released:
        lines.append(released)
    return "\n".join(lines)


class _Guard:
    """The leak guard's hooks (registered only when it is on)."""

    def __init__(self, state: _State, allowed_threads: tuple[str, ...], bound_s: float) -> None:
        self.state = state
        self.allowed_threads = allowed_threads
        self.bound_s = bound_s
        self.before: dict[str, Snapshot] = {}
        self.held: dict[int, Snapshot] = {}
        """What each wider-scoped fixture set up (by the fixture definition's id), until it is finalized."""

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        """Record what is alive before the test's fixtures are set up."""
        self.before[item.nodeid] = snapshot()
        return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Iterator[Any]:
        """What a fixture wider than a function creates is its own, not a leak of the test that set it up."""
        if fixturedef.scope == "function":
            return (yield)
        before = snapshot()
        try:
            return (yield)
        finally:
            self.held[id(fixturedef)] = snapshot().added_since(before)

    def pytest_fixture_post_finalizer(self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> None:
        """A wider-scoped fixture's teardown ran: what it held counts as a leak again."""
        self.held.pop(id(fixturedef), None)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        """After every fixture's teardown: report what the test left alive; under ``fail``, error and release it."""
        try:
            result = yield
        except BaseException:
            self._check(item, raise_error=False)
            raise
        self._check(item, raise_error=True)
        return result

    def _check(self, item: pytest.Item, *, raise_error: bool) -> None:
        before = self.before.pop(item.nodeid, None)
        if before is None:
            return
        for held in self.held.values():
            before = before | held
        allowed = _allowed(item)
        if allowed is None:
            return
        leaks = [leak for leak in find_leaks(before, allowed_threads=self.allowed_threads) if leak.kind not in allowed]
        if not leaks:
            return
        if self.state.mode == "warn":
            item.warn(LifecycleLeakWarning(_report(item.nodeid, leaks)))
            return
        released = release_leaks(leaks, before, self.bound_s)
        if released:
            still = find_leaks(before, allowed_threads=self.allowed_threads, wait_threads=False)
            threads = [leak for leak in still if leak.kind == THREAD]
            others = [leak for leak in still if leak.kind != THREAD]
            note = "released by the guard" if len(threads) < len(leaks) else "nothing released"
            if others:
                note += f"; still alive: {', '.join(map(str, others))}"
            if threads:
                note += "; a thread cannot be stopped from outside: left running"
        else:
            note = (
                f"releasing them did not finish within {self.bound_s:g} s (lifecycle_release_timeout): this process "
                "is dirty, later tests that use session or megatron_parallel fail at once"
            )
            self.state.dirty = (
                f"{item.nodeid} left {', '.join(leak.kind for leak in leaks)} alive, and releasing it did not "
                f"finish within {self.bound_s:g} s"
            )
        if raise_error:
            pytest.fail(_report(item.nodeid, leaks, note), pytrace=False)


# -- fixtures -----------------------------------------------------------------------------------


def _refuse_if_dirty(request: pytest.FixtureRequest) -> None:
    dirty = _state(request.config).dirty
    if dirty is not None:
        pytest.fail(f"lifecycle: this process is dirty: {dirty}", pytrace=False)


class _InWorld:
    """What a ``world`` test's fixtures are in the test process: the ranks get the real ones."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: object, **kwargs: object) -> Any:
        raise RuntimeError(f"{self.name} of a world test exists only in its ranks")


@pytest.fixture
def world(request: pytest.FixtureRequest) -> World:
    """This rank's ``World`` (``rank``, ``size``, ``config()``) in a test marked ``@pytest.mark.world(n)``."""
    marker = request.node.get_closest_marker("world")
    if marker is None:
        pytest.fail("the world fixture needs the test marked @pytest.mark.world(n)", pytrace=False)
    size, timeout_s = _world_of(marker)
    return World(-1, size, "", 0, timeout_s)  # the test process's stand-in: never reaches the test function


@pytest.fixture
def session(request: pytest.FixtureRequest) -> Iterator[SessionFactory | _InWorld]:
    """``session(distributed=None, parallel=None, **options)`` → a ``Session`` on real ``TorchActions``.

    Every session made is torn down after the test whatever happened (the failure plan
    if still live). Defaults: gloo, a world of one on loopback (in a ``world`` test, the
    rank's world). Fails at once in a process the guard marked dirty.
    """
    if request.node.get_closest_marker("world") is not None:
        yield _InWorld("session")
        return
    _refuse_if_dirty(request)
    factory = SessionFactory()
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def megatron_parallel(request: pytest.FixtureRequest) -> Iterator[MegatronParallelFactory | _InWorld]:
    """``megatron_parallel(tp=1, pp=1, cp=1, **parallel_fields)`` → ``megatron.core.parallel_state``, initialised.

    Always destroyed after the test, with the default group if it created one.
    """
    if request.node.get_closest_marker("world") is not None:
        yield _InWorld("megatron_parallel")
        return
    _refuse_if_dirty(request)
    factory = MegatronParallelFactory()
    try:
        yield factory
    finally:
        factory.close()


# -- world tests --------------------------------------------------------------------------------


def _world_of(marker: pytest.Mark) -> tuple[int, float]:
    """(size, timeout) of a ``world`` marker; ``UsageError`` for a bad one."""
    size = marker.args[0] if marker.args else marker.kwargs.get("n", marker.kwargs.get("size"))
    timeout_s = marker.kwargs.get("timeout", DEFAULT_WORLD_TIMEOUT_S)
    try:
        check_number("n", size, at_least=1)
        check_number("timeout", timeout_s, integer=False, above=0, unit="seconds")
    except ConfigError as exc:
        raise pytest.UsageError(f"@pytest.mark.world({exc.field}=...): {exc.message}") from None
    return size, float(timeout_s)


def _argnames(item: pytest.Function) -> tuple[str, ...]:
    """The test function's own arguments (those without a default)."""
    parameters = inspect.signature(item.obj).parameters.values()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in parameters if p.kind in kinds and p.default is inspect.Parameter.empty)


def _params(item: pytest.Function) -> dict[str, Any]:
    callspec = getattr(item, "callspec", None)
    return dict(callspec.params) if callspec is not None else {}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Check the selected tests' ``world`` and ``lifecycle_allow_leak`` markers before any test runs.

    A bad one (``world(0)``, a timeout that is no positive number, an unknown leak kind)
    ends pytest with one usage error (exit code 4) naming each such test and its marker,
    as a bad setting does; no test runs.
    """
    problems = []
    for item in items:
        marker = item.get_closest_marker("world")
        if marker is not None:
            try:
                _world_of(marker)
            except pytest.UsageError as exc:
                problems.append(f"{item.nodeid}: {exc}")
        for marker in item.iter_markers("lifecycle_allow_leak"):
            unknown = [repr(kind) for kind in marker.args if kind not in _leaks.KINDS]
            if unknown:
                problems.append(
                    f"{item.nodeid}: @pytest.mark.lifecycle_allow_leak: unknown kind(s) {', '.join(unknown)}; "
                    f"kinds: {', '.join(_leaks.KINDS)}"
                )
    if problems:
        raise pytest.UsageError("\n".join(problems))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Refuse, before any fixture, a world test that asks for fixtures its ranks cannot have."""
    marker = item.get_closest_marker("world")
    if marker is None or not isinstance(item, pytest.Function):
        return
    _world_of(marker)
    params = _params(item)
    refused = [name for name in _argnames(item) if name not in FIXTURES and name not in params]
    if refused:
        pytest.fail(
            f"{item.nodeid}: a @pytest.mark.world test runs in other processes, one per rank: it may take only "
            f"{', '.join(sorted(FIXTURES))} and its parametrize values; it asks for the fixture(s) "
            f"{', '.join(refused)}, which cannot reach the ranks (make them inside the test, or parametrize)",
            pytrace=False,
        )


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run a world test's function on its ranks instead of here; fail naming every rank that failed."""
    marker = pyfuncitem.get_closest_marker("world")
    if marker is None:
        return None
    size, timeout_s = _world_of(marker)
    argnames = _argnames(pyfuncitem)
    params = _params(pyfuncitem)
    values = {name: params[name] for name in argnames if name in params}
    try:
        pickled = pickle.dumps(values)
    except Exception as exc:  # noqa: BLE001 - any pickling error: name it
        pytest.fail(f"parametrize values of a world test must pickle to reach the ranks: {exc}", pytrace=False)
    module = pyfuncitem.module
    assert module is not None and module.__file__ is not None
    qualname = pyfuncitem.obj.__qualname__
    call = Call(pyfuncitem.nodeid, module.__name__, module.__file__, qualname, argnames, pickled)
    state = _state(pyfuncitem.config)
    pool = state.pool(size, pyfuncitem.config)
    outcomes = pool.run(call, timeout_s=timeout_s)
    if not state.reuse or not pool.alive() or not all(o.reusable for o in outcomes):
        state.discard(size)
    pyfuncitem.user_properties.append(("lifecycle_world_pids", tuple(o.pid for o in outcomes)))
    for outcome in outcomes:
        if outcome.output.strip():
            pyfuncitem.add_report_section("call", f"rank {outcome.rank} output", outcome.output)
    _judge(pyfuncitem, size, timeout_s, outcomes, state.mode)
    return True


def _in_failure_order(bad: list[RankOutcome]) -> list[RankOutcome]:
    """The failed ranks in the order they failed, by ``show``'s rule (``verdict.order``): the cause first (a rank
    whose exception's note names another as first, or that failed on a broken connection, is a consequence; a
    crashed rank is placed before its peers' connection errors), then by the time each raised; timed out last."""
    from lifecycle._tools.show import claims, verdict  # only a failing world test needs it

    ends = {
        o.rank: claims.claim(o.rank, o.summary, time=o.failed_at, note=o.notes, killed=o.outcome == "crashed")
        for o in bad
        if o.outcome != "timed_out"
    }
    ordered = [e.rank for e in verdict.order(ends)]
    ordered += [rank for rank in ends if rank not in ordered]  # crashed and not the cause
    by_rank = {o.rank: o for o in bad}
    return [by_rank[rank] for rank in ordered] + [o for o in bad if o.outcome == "timed_out"]


def _judge(item: pytest.Function, size: int, timeout_s: float, outcomes: list[RankOutcome], mode: str) -> None:
    """Pass, skip or fail the test from its ranks' outcomes; report what ranks left alive as the guard does."""
    bad = _in_failure_order([o for o in outcomes if o.outcome in ("failed", "crashed", "timed_out")])
    if bad:
        head = ", ".join(
            f"rank {o.rank} {o.outcome.replace('_', ' ')}" + (" first" if i == 0 and len(bad) > 1 else "")
            for i, o in enumerate(bad)
        )
        parts = [f"world of {size}: {head}"]
        if any(o.outcome == "timed_out" for o in bad):
            parts.append(f"(timeout {timeout_s:g} s; every rank still running was killed, its Python stack below)")
        for o in bad:
            first = " (failed first)" if o is bad[0] and len(bad) > 1 else ""
            parts.append(f"\n--- rank {o.rank}{first}: {o.summary} ---")
            if o.detail:
                parts.append(o.detail.rstrip())
            if o.outcome == "crashed" and o.output.strip():
                parts.append(f"rank {o.rank} output (last 3000 characters):\n{o.output[-3000:]}")
        pytest.fail("\n".join(parts), pytrace=False)
    leaks = [f"rank {o.rank}: {leak}" for o in outcomes for leak in o.leaks]
    allowed = _allowed(item)
    if allowed is not None:
        leaks = [leak for leak in leaks if leak.split(": ", 2)[1] not in allowed]
    if leaks and mode != "off":
        message = _report(item.nodeid, leaks, "(those ranks' processes exited: the next world test gets fresh ones)")
        if mode == "fail":
            pytest.fail(message, pytrace=False)
        item.warn(LifecycleLeakWarning(message))
    skipped = [o for o in outcomes if o.outcome == "skipped"]
    if skipped:
        pytest.skip(f"rank {skipped[0].rank}: {skipped[0].summary}")
