"""make test-slow's seeded sample (tests/conftest.py): a share of each ``sampled`` family, replayed by its seed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

FAMILY = """
import pytest

@pytest.mark.sampled("ten")
@pytest.mark.parametrize("n", range(10))
def test_member(n):
    pass

@pytest.mark.sampled("one")
def test_alone():
    pass

def test_unsampled():
    pass
"""


def _ran(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, share: str, seed: str) -> list[str]:
    """The tests an inner run with this share and seed ran."""
    monkeypatch.setenv("LIFECYCLE_SLOW_SAMPLE", share)
    monkeypatch.setenv("LIFECYCLE_SLOW_SEED", seed)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-v")
    assert result.ret == 0, result.stdout.str()
    if share:
        assert f"seed {seed}" in result.stdout.str()
    return sorted(re.findall(r"::(\S+) PASSED", result.stdout.str()))


def test_a_share_of_each_family_runs_the_same_for_a_seed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half of a family of 10 is 5, a family of 1 keeps its one, unsampled tests all run; a seed replays its choice."""
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_family=FAMILY)
    everything = _ran(pytester, monkeypatch, "", "1")
    assert len(everything) == 12
    first = _ran(pytester, monkeypatch, "0.5", "1")
    assert len([name for name in first if name.startswith("test_member")]) == 5
    assert {"test_alone", "test_unsampled"} <= set(first)
    assert _ran(pytester, monkeypatch, "0.5", "1") == first
    others = {tuple(_ran(pytester, monkeypatch, "0.5", str(seed))) for seed in range(2, 4)}
    assert others - {tuple(first)}, "two other seeds chose the same half"
