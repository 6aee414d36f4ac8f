"""NVRx's own ``RankShouldRestart`` landing at seeded lines of a failure teardown, under the real Wrapper (slow).

The in-process asynchronous-exception fuzzer (``test_async_fuzzer.py``) lands a stand-in at
every line; this is its seeded sample under NVIDIA Resiliency Extension's real
``inprocess.Wrapper`` on CPU (gloo, a world of one): at a sampled line event of the
failure edge (half on the main thread, half on the teardown's worker) NVRx is asked for a
restart as a failed peer asks, and its monitor thread aborts the group and raises
``RankShouldRestart`` into the main thread with ``PyThreadState_SetAsyncExc``
(``tests/workers/nvrx_landing_worker.py``). Every Wrapper call runs in a child process:
NVRx's monitor process SIGTERMs a process whose main thread stops running Python for
``hard_timeout``, and that must not be pytest.

``LIFECYCLE_FUZZ_SEED`` picks the sample (as for the other fuzzers); ``LIFECYCLE_NVRX_LANDINGS``
its size (default 16).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from reliability.fuzz import seed
from support.launch import run_workers

SAMPLE = int(os.environ.get("LIFECYCLE_NVRX_LANDINGS", "16"))
"""How many line events the sample lands on (one Wrapper call each, about 2.5 s)."""


def landings(
    tmp_path: Path, sample: int, *, timeout_s: float, env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Run the worker (the counting case, then ``sample`` landings); every case it reported, in order.

    Fails naming the case that was running if the child did not end by itself with 0.
    """
    out = tmp_path / "cases.jsonl"
    [result] = run_workers(
        "nvrx_landing_worker", str(out), str(seed()), str(sample), world_size=1, timeout_s=timeout_s, env=env
    )
    cases = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    assert result.ok, f"the child ended after {len(cases)} case(s) (seed {seed()}): {result}"
    return cases


def problems(case: dict[str, Any]) -> list[str]:
    """What is wrong with one case: the attempt's session, its releases, handlers, the restart, and leaks."""
    found = []
    expected = {
        "result": "closed",
        "states": ["failed", "closed"],
        "user_releases": [0, 1],
        "checkpoint_calls": [["abort_checkpoints"], ["finalize_checkpoints"]],
        "handlers_at_iteration_1": True,
        "handlers_after": True,
        "held_at_iteration_1": [],
        "group_left": False,
        "globals_left": [],
        "leftovers": [],
        "leaks": [],
        "monitors_left": [],
    }
    for key, value in expected.items():
        if case[key] != value:
            found.append(f"{key}: {case[key]!r}, expected {value!r}")
    if case["at"] is not None:
        if not (case["fired"] and case["nvrx_raised"]):
            found.append(f"NVRx did not raise at the case's line (fired {case['fired']}, raised {case['nvrx_raised']})")
        once = case["escaped_is_restart"] and case["restart_cause_is_fault"] and case["restarts_in_chain"] == 1
        # Requested on the worker, NVRx may raise only once the attempt returned: it lands in its own code then.
        after = case["escaped"] == ["InjectedFault"] and "on MainThread" not in case["requested_at"]
        if not (once or after):
            found.append(
                f"the Wrapper got {case['escaped']}, RankShouldRestart {case['restarts_in_chain']} time(s) in the"
                " chain: expected it once, from the injected fault"
            )
    return found


def report(cases: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each case that has problems: ``"at N (requested at …, landed at …)"`` → its problems."""
    return {
        f"at {c['at']} (requested at {c['requested_at'] or '-'}, landed at {c['landed_at'] or '-'})": found
        for c in cases
        if (found := problems(c))
    }


@pytest.mark.slow
@pytest.mark.timeout(170)
def test_nvrx_restart_requests_landing_in_a_failure_teardown_leave_nothing_behind(tmp_path: Path) -> None:
    """At seeded lines: the attempt ends failed, every release ran, no dead handler, the restart closes, no leak."""
    cases = landings(tmp_path, SAMPLE, timeout_s=150)
    assert len(cases) == SAMPLE + 1, f"{len(cases) - 1} of {SAMPLE} landings reported"
    bad = report(cases)
    assert not bad, f"{len(bad)} of {len(cases)} cases failed (seed {seed()}):\n" + "\n".join(
        f"{name}: {found}" for name, found in bad.items()
    )
    requested = {c["requested_at"] for c in cases[1:]}
    on_main = {r for r in requested if r.endswith("on MainThread")}
    inside = [c for c in cases[1:] if c["landed_at"]]  # landed in lifecycle's frames: the session was failing
    assert len(on_main) >= SAMPLE // 4 and len(requested - on_main) >= SAMPLE // 4, sorted(requested)
    assert len({c["landed_at"] for c in inside}) >= SAMPLE // 4, [c["landed_at"] for c in cases[1:]]
    print(f"seed {seed()}: {len(requested)} distinct lines, landed at {sorted({c['landed_at'] for c in inside})}")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_teardown_run_in_place_fails_the_sample(tmp_path: Path) -> None:
    """Broken build: with ``Session.fail`` running its plan on the main thread, the sample's checks fail."""
    cases = landings(tmp_path, 6, timeout_s=100, env={"LIFECYCLE_TEARDOWN_IN_PLACE": "1"})
    bad = report(cases)
    assert bad, "a teardown run on the main thread survived every landing: the sample cannot fail"
    assert any("user_releases" in p or "handlers" in p or "leaks" in p for found in bad.values() for p in found), bad
