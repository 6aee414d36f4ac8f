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
from lifecycle import Owner, Resource, StepKind, Trigger, declare_resource

ALIVE = []
STUCK = StepKind("stuck_release")
declare_resource(
    Resource(
        "stuck",
        order=700,
        success=(STUCK,),
        failure=(STUCK,),
        acquired_by=Trigger.INIT_DISTRIBUTED,
        init=lambda actions: (ALIVE.append(1), Owner.SESSION)[1],
        release=lambda actions: {STUCK: lambda: time.sleep(30)},
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
