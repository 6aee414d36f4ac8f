"""The plugin's settings are checked when pytest configures, and its leak warnings survive ``-W ignore::UserWarning``.

Before: ``lifecycle_release_timeout = abc`` crashed pytest with INTERNALERROR (a bare
``float()``), ``-5`` was accepted and then failed every later test, and the leak warning
was a ``PytestWarning`` (a ``UserWarning``): ``-W ignore::UserWarning``, common to hide
Megatron-core's import warnings, hid the guard's reports too.
"""

from __future__ import annotations

import pytest

from lifecycle.testing import LifecycleLeakWarning
from lifecycle.testing.pytest_plugin import check_settings

pytest_plugins = ["pytester"]

GOOD = {"leaks": "warn", "workers": "reuse", "release_timeout": "10", "allowed_threads": ()}


@pytest.mark.parametrize(
    ("setting", "key", "value"),
    [
        ("lifecycle_leaks", "leaks", "loud"),
        ("lifecycle_world_workers", "workers", "shared"),
        ("lifecycle_release_timeout", "release_timeout", "abc"),
        ("lifecycle_release_timeout", "release_timeout", "-5"),
        ("lifecycle_release_timeout", "release_timeout", "0"),
        ("lifecycle_release_timeout", "release_timeout", "nan"),
        ("lifecycle_release_timeout", "release_timeout", "inf"),
        ("lifecycle_release_timeout", "release_timeout", ""),
    ],
)
def test_a_bad_value_of_each_setting_is_a_usage_error_naming_it(setting: str, key: str, value: str) -> None:
    """Each setting's bad value raises ``pytest.UsageError`` whose message names the setting and the value."""
    with pytest.raises(pytest.UsageError) as refused:
        check_settings(**{**GOOD, key: value})  # type: ignore[arg-type]
    assert str(refused.value).startswith(setting) and repr(value) in str(refused.value)


def test_good_values_are_read_as_what_they_say() -> None:
    """Defaults and explicit good values come back typed: the mode, reuse, the timeout in seconds, the patterns."""
    assert check_settings("", " fresh ", "0.5", ["pool-*"]) == (check_settings("warn", "fresh", "0.5", ("pool-*",)))
    settings = check_settings("fail", "reuse", "2.5", ["pool-*"])
    assert (settings.mode, settings.reuse, settings.release_timeout_s, settings.allowed_threads) == (
        "fail",
        True,
        2.5,
        ("pool-*",),
    )


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("ini", "named"),
    [
        ("lifecycle_release_timeout = abc", "lifecycle_release_timeout"),  # the unit test above has every setting
        ("lifecycle_world_workers = shared", "lifecycle_world_workers"),
    ],
)
def test_a_bad_ini_value_ends_pytest_with_a_usage_error_not_an_internal_error(
    pytester: pytest.Pytester, ini: str, named: str
) -> None:
    """A bad ini value: pytest exits 4 (usage error) with ``ERROR: <setting> ...``, no INTERNALERROR, no test run."""
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_plain="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=60)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines([f"ERROR: {named} *"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("marker", "named"),
    [
        ("world(0)", "@pytest.mark.world(n=...): "),
        ("world(2, timeout=-1)", "@pytest.mark.world(timeout=...): "),
        ('lifecycle_allow_leak("thraed")', "@pytest.mark.lifecycle_allow_leak: unknown kind(s) 'thraed'; "),
    ],
    ids=["world-0", "world-timeout", "unknown-kind"],
)
def test_a_bad_marker_ends_pytest_with_a_usage_error_naming_the_test_before_any_runs(
    pytester: pytest.Pytester, marker: str, named: str
) -> None:
    """A bad marker: exit 4 when pytest starts, ``ERROR: <test>: <marker> ...``; no test runs, no traceback."""
    source = f"import pytest\n\ndef test_first():\n    pass\n\n@pytest.mark.{marker}\ndef test_bad(world):\n    pass\n"
    pytester.makepyfile(test_marked=source)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=60)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output
    assert f"ERROR: test_marked.py::test_bad: {named}" in result.stderr.str(), output
    assert "passed" not in output and "Traceback" not in output and "INTERNALERROR" not in output, output


@pytest.mark.timeout(90)
def test_ignoring_user_warnings_leaves_the_guards_report_visible(pytester: pytest.Pytester) -> None:
    """``-W ignore::UserWarning``: leaked signal handlers are still reported as leaks (before: hidden)."""
    assert not issubclass(LifecycleLeakWarning, UserWarning) and issubclass(LifecycleLeakWarning, Warning)
    pytester.makepyfile(
        test_leaky="""
        from lifecycle import Session
        from lifecycle.testing import RecordingActions

        def test_leaks_signal_handlers():
            Session(RecordingActions()).install_signal_handlers()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "ignore::UserWarning", "-rw", timeout=60)
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(
        ["*LifecycleLeakWarning: lifecycle: test_leaky.py::test_leaks_signal_handlers left * alive*"]
    )
