"""The pytest plugin's leak guard, run on small suites by ``pytester`` (each in its own pytest process).

Before this plugin there was nothing to report a leak: each check here failed on the old
code (a plugin module without hooks) because the inner run passed silently (no warning,
no teardown error, no release) or had no ``world`` fixture.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

# A resource kind of the inner suite's own: a session creates it (so lifecycle records who
# and where), its release never ends in time. No torch.
STUCK_KIND = """
import time
from lifecycle import Owner, Trigger
from lifecycle.lowlevel import Handler, Resource, StepKind, declare_resource

ALIVE = []
STUCK = StepKind("stuck_release")
declare_resource(
    Resource(
        "stuck",
        order=700,
        success=(STUCK,),
        failure=(STUCK,),
        acquired_by=Trigger.INIT_DISTRIBUTED,
        handler=lambda actions: Handler(lambda: (ALIVE.append(1), Owner.SESSION)[1], {STUCK: lambda: time.sleep(30)}),
        probe=lambda: bool(ALIVE),
    )
)
"""


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning", *args,
                                         timeout=90)  # fmt: skip


@pytest.mark.timeout(120)
def test_a_leak_is_named_with_its_session_and_line_and_warn_lets_the_test_pass(pytester: pytest.Pytester) -> None:
    """Default ``warn``: a test leaving a session's signal handlers and a thread gets a warning naming each.

    The warning names the test, each kind, the session and the ``file:line`` that
    installed the handlers; the test itself passes, and the next test sees no leak of its own.
    """
    pytester.makepyfile(
        test_leaky="""
        import threading, time
        from lifecycle import Session
        from lifecycle.testing import RecordingActions

        def test_leaky():
            session = Session(RecordingActions())
            session.init_distributed()
            session.install_signal_handlers()
            threading.Thread(target=time.sleep, args=(1,), name="leaky-thread").start()

        def test_next():
            pass
        """
    )
    result = _run(pytester, "-rw")
    result.assert_outcomes(passed=2, warnings=1)
    text = result.stdout.str()
    assert "LifecycleLeakWarning: lifecycle: test_leaky.py::test_leaky left 3 thing(s) alive" in text
    assert "signal_handler: SIGINT handler of the interrupt shield still installed" in text
    assert "created by session [session 1] at " in text and "test_leaky.py:7" in text
    assert "signal_handler: SIGTERM handler Session.install_signal_handlers" in text and "test_leaky.py:8" in text
    assert "thread: non-daemon thread 'leaky-thread' started during the test" in text
    assert "test_next left" not in text


@pytest.mark.timeout(120)
def test_fail_errors_in_teardown_and_releases_so_the_next_test_is_clean(pytester: pytest.Pytester) -> None:
    """``fail``: the leaking test errors in teardown naming group and store with their line; the next test is clean.

    Real gloo: the session's store and group are released by the guard (with the
    session's own failure steps), so the next test finds no process group.
    """
    pytester.makepyfile(
        test_group="""
        import torch.distributed as dist
        from lifecycle import DistributedConfig, ParallelConfig, Session, TorchActions

        def test_leaks_a_group():
            config = DistributedConfig(world_size=1, rank=0, master_addr="127.0.0.1", master_port=0, timeout_s=10)
            Session(TorchActions(config, ParallelConfig())).init_distributed()
            assert dist.is_initialized()

        def test_next_starts_clean():
            assert not dist.is_initialized()
        """
    )
    result = _run(pytester, "--lifecycle-leaks=fail")
    result.assert_outcomes(passed=2, errors=1)
    text = result.stdout.str()
    assert "ERROR at teardown of test_leaks_a_group" in text
    assert "process_group: still alive, created by session [session 1] at " in text
    assert "rendezvous_store: still alive, created by session [session 1] at " in text
    assert "test_group.py:6" in text
    assert "released by the guard" in text and "still alive:" not in text


@pytest.mark.timeout(120)
def test_a_release_past_its_bound_marks_the_process_dirty_and_fails_later_distributed_tests(
    pytester: pytest.Pytester,
) -> None:
    """A leftover whose release hangs past ``lifecycle_release_timeout``: later ``session`` tests fail at once.

    The later test's failure names the test that leaked; a test that uses no
    distributed fixture still runs.
    """
    pytester.makeini("[pytest]\nlifecycle_leaks = fail\nlifecycle_release_timeout = 0.5\n")
    pytester.makepyfile(
        test_dirty=STUCK_KIND
        + """
from lifecycle import Session
from lifecycle.testing import RecordingActions

def test_leaks_stuck():
    Session(RecordingActions()).init_distributed()

def test_plain():
    pass

def test_distributed(session):
    raise AssertionError("never reached: the process is dirty")
"""
    )
    result = _run(pytester)
    result.assert_outcomes(passed=2, errors=2)
    text = result.stdout.str()
    assert "stuck: still alive, created by session [session 1] at " in text
    assert "did not finish within 0.5 s" in text
    assert "ERROR at setup of test_distributed" in text
    assert "this process is dirty: test_dirty.py::test_leaks_stuck left" in text
    assert "never reached" not in text


@pytest.mark.timeout(120)
def test_allowed_leaks_are_left_alone(pytester: pytest.Pytester) -> None:
    """``lifecycle_allow_leak`` and the ``lifecycle_allowed_threads`` ini keep deliberate leaks out of the report."""
    pytester.makeini("[pytest]\nlifecycle_leaks = fail\nlifecycle_allowed_threads =\n    pool-*\n")
    pytester.makepyfile(
        test_allowed="""
        import threading, time
        import pytest

        @pytest.mark.lifecycle_allow_leak("thread", reason="a deliberate one")
        def test_marked():
            threading.Thread(target=time.sleep, args=(1,)).start()

        def test_pool_thread():
            threading.Thread(target=time.sleep, args=(1,), name="pool-1").start()

        def test_other_thread():
            threading.Thread(target=time.sleep, args=(1,), name="other").start()
        """
    )
    result = _run(pytester)
    result.assert_outcomes(passed=3, errors=1)
    assert "ERROR at teardown of test_other_thread" in result.stdout.str()


@pytest.mark.timeout(120)
def test_p_no_lifecycle_disables_the_guard_the_markers_and_the_fixtures(pytester: pytest.Pytester) -> None:
    """With ``-p no:lifecycle``: no leak is reported even under ``fail``, and ``world`` is no fixture."""
    pytester.makeini("[pytest]\nlifecycle_leaks = fail\n")
    pytester.makepyfile(
        test_off="""
        import threading, time
        import pytest

        def test_leaks_a_thread():
            threading.Thread(target=time.sleep, args=(1,)).start()

        @pytest.mark.world(2)
        def test_world(world):
            pass
        """
    )
    on = _run(pytester)
    on.assert_outcomes(passed=2, errors=1)
    off = _run(pytester, "-p", "no:lifecycle")
    off.assert_outcomes(passed=1, errors=1, warnings=2)  # unknown ini option, unknown marker
    text = off.stdout.str()
    assert "fixture 'world' not found" in text and "lifecycle:" not in text


@pytest.mark.timeout(60)
def test_loading_the_plugin_imports_no_torch(pytester: pytest.Pytester) -> None:
    """Collecting a torch-free suite with the plugin active leaves torch and megatron-core out of ``sys.modules``.

    Checked to fail with a plugin that imports torch at its top.
    """
    pytester.makeconftest(
        """
        import sys

        def pytest_sessionfinish(session):
            assert session.config.pluginmanager.has_plugin("lifecycle")
            heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "megatron"))
            print("HEAVY", heavy)
        """
    )
    pytester.makepyfile(test_plain="def test_x():\n    pass\n")
    result = _run(pytester, "--co", "-s")
    result.stdout.fnmatch_lines(["HEAVY []"])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_second_leaked_store_is_reported_compared_by_object(pytester: pytest.Pytester) -> None:
    """A store hosted while another is alive (an earlier test's, a module fixture's) is a leak of its own.

    Stores are told apart by object, not by "some store is hosted": the test that hosts
    the second one is named, a test that hosts none is not.
    """
    pytester.makepyfile(
        test_stores="""
        import pytest
        from lifecycle import DistributedConfig, ParallelConfig, TorchActions

        KEPT = []

        def host():
            config = DistributedConfig(world_size=1, rank=0, master_addr="127.0.0.1", master_port=0, timeout_s=10)
            actions = TorchActions(config, ParallelConfig())
            actions.init_store()
            KEPT.append(actions)

        @pytest.fixture(scope="module")
        def module_store():
            host()
            yield

        def test_first():
            host()

        def test_second():
            host()

        def test_hosts_nothing(module_store):
            pass

        def test_beside_the_module_store(module_store):
            host()
        """
    )
    result = _run(pytester, "-rw")
    result.assert_outcomes(passed=4)  # torch's import warnings vary: count the guard's own
    text = result.stdout.str()
    assert text.count("LifecycleLeakWarning: lifecycle: ") == 3
    for name in ("test_first", "test_second", "test_beside_the_module_store"):
        assert f"test_stores.py::{name} left 1 thing(s) alive" in text
    assert "test_hosts_nothing left" not in text
    assert "rendezvous_store: still alive (besides those alive before the test)" in text


# A module-scoped session (its shield installed for the whole module) and a test that leaks
# a second session's shield above it.
WIDER_SESSION = """
import signal
import pytest
from lifecycle import Session
from lifecycle.testing import RecordingActions

@pytest.fixture(scope="module")
def outer():
    session = Session(RecordingActions())
    session.init_distributed()
    yield {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    session.fail(RuntimeError("module done"))

def test_sets_up_the_module_session(outer):
    pass

def test_leaks_a_shield(outer):
    LEAKED.append(Session(RecordingActions()))
    LEAKED[-1].init_distributed()

def test_ctrl_c_still_raises(outer):
    assert {s: signal.getsignal(s) for s in outer} == outer
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)

LEAKED = []
"""


@pytest.mark.timeout(120)
def test_releasing_a_leaked_shield_puts_back_the_handler_from_before_the_test_even_lifecycles(
    pytester: pytest.Pytester,
) -> None:
    """``fail``: the released shield's signals get exactly the wider session's handlers back; Ctrl-C still raises.

    Before, the guard put back only handlers that were not lifecycle's, and ``SIG_DFL``
    for the others: a Ctrl-C then killed the pytest process.
    """
    pytester.makepyfile(test_wider=WIDER_SESSION)
    result = _run(pytester, "--lifecycle-leaks=fail")
    result.assert_outcomes(passed=3, errors=1)
    text = result.stdout.str()
    assert "ERROR at teardown of test_leaks_a_shield" in text
    assert "SIGINT handler of the interrupt shield still installed" in text
    assert "test_sets_up_the_module_session left" not in text and "test_ctrl_c_still_raises left" not in text


@pytest.mark.timeout(120)
def test_handlers_put_back_by_other_code_after_their_session_ended_are_no_leak(pytester: pytest.Pytester) -> None:
    """A final session's handlers that other code installed again only pass signals on: not reported.

    Code saved the session's handlers, installed its own, and restored the saved ones
    after the session failed; SIGTERM and Ctrl-C still reach the handlers from before.
    """
    pytester.makepyfile(
        test_restored="""
        import os, signal
        import pytest
        from lifecycle import Session
        from lifecycle.testing import RecordingActions

        RECEIVED = []

        def test_restores_a_final_sessions_handlers():
            signal.signal(signal.SIGTERM, lambda signum, frame: RECEIVED.append(signum))
            session = Session(RecordingActions())
            session.init_distributed()
            session.install_signal_handlers()
            saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
            session.fail(RuntimeError("boom"))
            for signum, handler in saved.items():
                signal.signal(signum, handler)
            signal.raise_signal(signal.SIGTERM)
            assert RECEIVED == [signal.SIGTERM] and session.exit_requested is None
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        """
    )
    result = _run(pytester, "--lifecycle-leaks=fail")
    result.assert_outcomes(passed=1)
