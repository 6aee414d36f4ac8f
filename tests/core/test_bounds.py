"""Every bound lifecycle sets on a peer's account follows from the group timeout, in its order (issue 38).

Torch-free: ``Bounds`` and its checks are plain numbers; the places that apply them
(the store, the checkpoint writer, the teardown, the monitor, torchrun's grace) read
them from ``Bounds``, and the table in docs/liveness.md is read back here.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
from support.internals import child_env

from lifecycle import DistributedConfig, LivenessConfig, PretrainConfig
from lifecycle._core.bounds import SHUTDOWN_VARIABLE, Bounds

DOC = Path(__file__).resolve().parents[2] / "docs" / "liveness.md"


def test_each_bound_at_the_demos_and_pretrains_group_timeout() -> None:
    """At 30 s and 60 s: store = T, write T/2, finalize 1.5 T, release 2 T, floor T/3, stop grace 2 T + 30 s."""
    demo, default = Bounds(30.0), Bounds(60.0)
    assert (demo.store_timeout_s, demo.write_timeout_s, demo.finalize_s, demo.release_timeout_s) == (30, 15, 45, 60)
    assert (demo.conviction_floor_s, demo.unresponsive_s, demo.stop_grace_s, demo.launcher_grace_s) == (10, 30, 90, 100)
    assert (default.store_timeout_s, default.write_timeout_s, default.release_timeout_s) == (60, 30, 120)
    assert (default.conviction_floor_s, default.stop_grace_s) == (20, 150)


@pytest.mark.parametrize("timeout_s", [0.5, 3.0, 30.0, 60.0, 600.0, 1800.0])
@pytest.mark.parametrize("patience", [0.1, 1.0, 2.0, 2.99])
def test_the_bounds_keep_their_order_at_every_timeout_and_allowed_patience(timeout_s: float, patience: float) -> None:
    """write < T = store = unresponsive; floor < T < finalize < release < stop grace < launcher; stop > T + floor."""
    b = Bounds(timeout_s, patience)
    assert b.write_timeout_s < b.group_timeout_s == b.store_timeout_s == b.unresponsive_s
    assert b.conviction_floor_s < b.group_timeout_s < b.finalize_s < b.release_timeout_s < b.stop_grace_s
    assert b.stop_grace_s < b.launcher_grace_s
    assert b.stop_grace_s > b.group_timeout_s + b.conviction_floor_s


def test_an_explicit_deadline_of_a_step_phase_at_the_group_timeout_is_warned_on_naming_both() -> None:
    """``deadlines`` (("step", 30),) at a 30 s timeout warns naming the field, the value and the timeout; no refusal."""
    with pytest.warns(RuntimeWarning, match=r"liveness\.deadlines\.step 30 is not below the group timeout \(30 s\)"):
        PretrainConfig(
            distributed=DistributedConfig(timeout_s=30.0),
            liveness=LivenessConfig(mode="kill", deadlines=(("step", 30.0),)),  # type: ignore[arg-type]
        )


def test_an_explicit_deadline_below_the_timeout_or_of_a_phase_no_peer_waits_in_is_not_warned_on() -> None:
    """A checkpoint deadline above the timeout, a step deadline below it pass silently; liveness off checks nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PretrainConfig(
            distributed=DistributedConfig(timeout_s=30.0),
            liveness=LivenessConfig(mode="kill", deadlines=(("checkpoint", 900.0), ("step", 29.0))),  # type: ignore[arg-type]
        )
        PretrainConfig(liveness=LivenessConfig(mode="off", deadlines=(("step", 900.0),)))  # type: ignore[arg-type]


def test_torchrun_gets_the_stop_grace_as_its_shutdown_timeout_unless_the_caller_set_one() -> None:
    """Unset: the stop grace in whole seconds; set: the caller's value, as it is (warned on only when shorter)."""
    assert Bounds(30.0).shutdown_timeout({}) == "90"
    assert Bounds(60.0).shutdown_timeout({}) == "150"
    assert Bounds(0.7).shutdown_timeout({}) == "32"  # 31.4 s, rounded up: torchrun reads an int
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Bounds(30.0).shutdown_timeout({SHUTDOWN_VARIABLE: "600"}) == "600"


@pytest.mark.parametrize("given", ["30", "nonsense"])
def test_a_shutdown_timeout_below_the_stop_grace_is_warned_on_naming_both_and_kept(given: str) -> None:
    """The caller's 30 s (or an unreadable value) at a 60 s timeout: warned, naming it and the 150 s grace; kept."""
    with pytest.warns(RuntimeWarning, match=rf"{SHUTDOWN_VARIABLE}='{given}' .* below .*\(150 s = 2 x the 60 s"):
        assert Bounds(60.0).shutdown_timeout({SHUTDOWN_VARIABLE: given}) == given


def test_the_launchers_environment_carries_the_stop_grace_for_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    """``child_env(addr, group_timeout_s=30)`` sets torchrun's shutdown timeout to 90; without a timeout, nothing."""
    monkeypatch.delenv(SHUTDOWN_VARIABLE, raising=False)
    assert child_env("127.0.0.1", group_timeout_s=30.0)[SHUTDOWN_VARIABLE] == "90"
    assert SHUTDOWN_VARIABLE not in child_env("127.0.0.1")
    monkeypatch.setenv(SHUTDOWN_VARIABLE, "400")
    assert child_env("127.0.0.1", group_timeout_s=30.0)[SHUTDOWN_VARIABLE] == "400"


def documented_rows() -> dict[str, tuple[float, float]]:
    """The table of docs/liveness.md's "Bounds from the group timeout": bound → (its value at 30 s, at 60 s)."""
    section = DOC.read_text(encoding="utf-8").split("### Bounds from the group timeout", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[float, float]] = {}
    for line in section.splitlines():
        found = re.match(r"\| `(\w+)` \|[^|]*\| ([\d.]+) s \| ([\d.]+) s \|", line)
        if found:
            rows[found[1]] = (float(found[2]), float(found[3]))
    return rows


def test_the_documented_table_says_what_the_code_derives() -> None:
    """Each row of docs/liveness.md's bounds table holds ``Bounds``' value at 30 s and 60 s; every bound has a row."""
    rows = documented_rows()
    named = {name for name in dir(Bounds) if name.endswith("_s") and not name.startswith("_")}
    assert set(rows) == named
    for name, (at_30, at_60) in rows.items():
        assert (getattr(Bounds(30.0), name), getattr(Bounds(60.0), name)) == (at_30, at_60), name
