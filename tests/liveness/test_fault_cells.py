"""Silent faults become failure edges: a stopped, spinning, hung or dead rank is named and every rank fails in time.

Two or four gloo ranks train with a liveness monitor each (0.25 s interval, 2 s floor,
patience 0.5: a 10 s conviction floor) and a 60 s group timeout, so only the monitor can
release them in time. One rank stops,
spins in C holding the GIL, hangs in the batch provider, or dies, at step 60.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from support.launch import run_workers, steps_for

from lifecycle import journal

DEADLINE_S = 2.0
"""The loop's suspicion deadline in these runs: the floor (the steps are far shorter than 0.4 s)."""
CONVICTION_S = 10.0
"""The conviction deadline: max(DEADLINE_S, patience 0.5 x the 60 s group timeout / 3)."""
INTERVAL_S = 0.25
SLACK_S = 2.0
BOUND_S = CONVICTION_S + 2 * INTERVAL_S + SLACK_S
"""Every rank fails within the conviction deadline + 2 intervals + 2 s of the fault (issue 38)."""

CELLS = [
    pytest.param("hang", "batch", 0, 2, id="hang-in-batch-rank0-of-2"),
    *(
        pytest.param(kind, phase, faulty, world, id=f"{kind}-{'rank0' if faulty == 0 else 'last'}-of-{world}",
                     marks=[pytest.mark.slow, pytest.mark.sampled("liveness_cells")])
        for world in (2, 4)
        for kind, phase in (("stop", "step"), ("spin", "step"), ("hang", "batch"), ("crash", "step"))
        for faulty in (0, world - 1)
        if (kind, phase, faulty, world) != ("hang", "batch", 0, 2)
    ),
]  # fmt: skip
"""{stop, spin, hang in the batch provider, crash} x {rank 0, the last rank} x {2, 4 ranks}: one in make test (a
stopped rank's cell, 17 s, went to the sampled family to keep make test in its 8 minutes)."""

VERDICTS = {"stop": "stopped", "spin": "spinning", "hang": "hang", "crash": "died"}
"""The verdict record's word for each fault kind."""

KIND_WORDS = {"stop": "stopped", "spin": "was spinning", "hang": "hung", "crash": "died"}


def _marks_pages() -> set[str]:
    """The liveness marks pages in /dev/shm now."""
    return {path.name for path in Path("/dev/shm").glob("lifecycle-marks-*")}


def _report(output: str) -> dict[str, object]:
    lines = [line for line in output.splitlines() if line.startswith("{")]
    assert lines, output[-3000:]
    found: dict[str, object] = json.loads(lines[-1])
    return found


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("kind", "phase", "faulty", "world"), CELLS)
def test_a_silent_fault_is_named_and_releases_every_rank(
    tmp_path: Path, kind: str, phase: str, faulty: int, world: int
) -> None:
    """Every rank fails within BOUND_S (conviction + 2 intervals + 2 s); notes name the faulty rank, never itself."""
    pages_before = _marks_pages()
    args = (str(tmp_path), kind, phase, str(faulty), "400")
    results = run_workers("liveness_worker", *args, world_size=world, timeout_s=100)
    by_rank = {result.rank: result for result in results}
    assert not any(result.timed_out for result in results), [str(r) for r in results]
    assert by_rank[faulty].returncode == -9, by_rank[faulty].output[-3000:]  # killed by its monitor, or itself
    for survivor in range(world):
        if survivor == faulty:
            continue
        report = _report(by_rank[survivor].output)
        assert report["error"] is not None, report
        took = float(str(report["failed_at"])) - float(str(report["last_step_end"]))
        print(f"{kind} in {phase}, rank {faulty} of {world}: rank {survivor} released {took:.2f} s after the fault")
        assert took <= BOUND_S, (survivor, took, report)
        notes = " ".join(str(note) for note in report["notes"])  # type: ignore[attr-defined]
        if kind == "crash" and faulty == 0:
            # Rank 0 hosts the store: it died with it, no verdict could be published; the store's error names its host.
            assert "hosted by rank 0, is unreachable" in notes, notes
        else:
            assert f"rank {faulty} {KIND_WORDS[kind]}" in notes, notes
        for victim in range(world):
            if victim == faulty:
                continue
            for named in (f"rank {victim} is ", f"rank {victim} died", f"rank {victim} failed first"):
                assert named not in notes, (survivor, notes)
    if kind != "crash":
        stacks = (tmp_path / f"rank{faulty}.stacks.txt").read_text()
        assert re.search(r'faults\.py", line \d+ in fire', stacks), stacks[-2000:]
    # No marks page left in /dev/shm: a page has no name there (a memfd), whoever dies.
    deadline = time.monotonic() + 10.0
    while _marks_pages() - pages_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _marks_pages() - pages_before, sorted(_marks_pages() - pages_before)
    # Always in the journals, also when the store died with its host: the faulty rank's monitor wrote the verdict.
    verdicts = [r for r in journal.read([tmp_path]) if isinstance(r, journal.Verdict)]
    assert [(v.origin.rank, v.culprit, v.verdict) for v in verdicts] == [(faulty, faulty, VERDICTS[kind])], verdicts


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_no_verdict_over_many_healthy_jittered_steps(tmp_path: Path) -> None:
    """1,000 healthy steps (400 in sampled test-slow) of 0-3 base steps, one of ten (a slow save's stand-in): both
    ranks close, no verdict."""
    steps = str(steps_for(1000, 400))
    results = run_workers("liveness_worker", str(tmp_path), "none", "step", "0", steps, "3", timeout_s=220)
    for result in results:
        assert result.ok, str(result)
        assert _report(result.output)["error"] is None
        assert "lifecycle liveness" not in result.output, result.output[-3000:]


@pytest.mark.slow  # 20 s; test_monitor_survival keeps a lost monitor's fast checks in make test
@pytest.mark.timeout(120)
def test_a_killed_monitor_is_said_started_again_and_the_run_finishes_with_no_verdict(tmp_path: Path) -> None:
    """Rank 1's monitor SIGKILLed at step 60 of 300: its rank says so in its log and journal, starts another once,
    and both ranks train to the end; no verdict on rank 1 (its neighbour's watch saw the new monitor beat)."""
    steps = 300
    results = run_workers("liveness_worker", str(tmp_path), "monitor-kill", "step", "1", str(steps), timeout_s=100)
    for result in results:
        assert result.ok, str(result)
        assert _report(result.output)["error"] is None
    killed = int((tmp_path / "monitor").read_text())
    by_rank = {result.rank: result for result in results}
    assert f"rank 1's liveness monitor (pid {killed}) was killed by SIGKILL" in by_rank[1].output, by_rank[1].output
    records = journal.read([tmp_path])
    lost = [r for r in records if isinstance(r, journal.MonitorLost)]
    assert [(r.origin.rank, r.pid, r.action) for r in lost] == [(1, killed, "restarted")], lost
    assert not [r for r in records if isinstance(r, journal.Verdict)]
    ends = sorted((r.origin.rank, r.final_step, r.error) for r in records if isinstance(r, journal.RunEnd))
    assert ends == [(0, steps, None), (1, steps, None)]


@pytest.mark.slow  # 14 s
@pytest.mark.timeout(120)
def test_a_monitor_lost_twice_fails_its_rank_in_kill_mode_naming_the_loss(tmp_path: Path) -> None:
    """Rank 1's monitor SIGKILLed, then the new one too: rank 1 fails with ``MonitorLost`` (journaled: restarted,
    then failed), and rank 0 fails naming rank 1 first; no verdict."""
    results = run_workers("liveness_worker", str(tmp_path), "monitor-kill-twice", "step", "1", "300", timeout_s=100)
    by_rank = {result.rank: result for result in results}
    assert not any(result.timed_out for result in results), [str(r) for r in results]
    failed = _report(by_rank[1].output)
    assert str(failed["error"]).startswith("MonitorLost: rank 1's liveness monitor"), failed
    survivor = _report(by_rank[0].output)
    assert "rank 1 failed first" in " ".join(map(str, survivor["notes"])), survivor  # type: ignore[call-overload]
    records = journal.read([tmp_path])
    actions = [r.action for r in records if isinstance(r, journal.MonitorLost)]
    assert actions == ["restarted", "failed"], actions
    assert not [r for r in records if isinstance(r, journal.Verdict)]


STORE_MARGIN_S = 4 * 0.25
"""The monitor's margin past the conviction deadline before a silent store's host is reported: 4 intervals."""


@pytest.mark.slow
@pytest.mark.sampled("store_host")
@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["agent-stop", "agent-kill"])
def test_a_store_host_that_stops_or_dies_fails_every_rank_naming_it(tmp_path: Path, kind: str) -> None:
    """torchrun's agent (the store's host) stopped or killed at step 60, the ranks training on without it: every rank
    fails within the conviction deadline + 4 intervals + 2 s of that, and names torchrun's agent (its StoreHostLost,
    or the store's error)."""
    args = (str(tmp_path), kind, "step", "0", "2000")
    run_workers("liveness_worker", *args, world_size=2, timeout_s=120, torchrun=True, grace_s=30)
    reports = [json.loads((tmp_path / f"report-{rank}.json").read_text()) for rank in range(2)]
    fault_at = float((tmp_path / "agent").read_text())
    for report in reports:
        assert report["error"] is not None, report
        took = float(report["failed_at"]) - fault_at
        # Past the monitor's deadline: its next look (0.25 s), the store's timeout (0.125 s), the failure path (its
        # notice waits 0.75 s on a frozen store), the teardown: SLACK_S + 1 s.
        assert took <= CONVICTION_S + STORE_MARGIN_S + SLACK_S + 1.0, (took, report)
        said = " ".join([str(report["error"]), *map(str, report["notes"])])
        assert "torchrun's agent" in said, report
    assert any(str(report["error"]).startswith("StoreHostLost: ") for report in reports), reports


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_pretrain_on_a_thread_outlives_a_stalled_store_host_and_journals_its_end(tmp_path: Path) -> None:
    """``pretrain`` off the main thread (no handler), torchrun's agent stopped 12 s at step 60: no rank dies of the
    monitor's signal (it reports the store only), both train to the end, and each journals its outcome."""
    steps = 900
    args = (str(tmp_path), "agent-stall", "step", "0", str(steps))
    results = run_workers("liveness_worker", *args, world_size=2, timeout_s=200, torchrun=True, grace_s=30)
    output = "\n".join(result.output for result in results)
    assert [result.returncode for result in results] == [0], output[-3000:]
    assert "has not answered" in output, output[-3000:]  # the stall was long enough to be noticed
    assert "Signal" not in output, output[-3000:]  # torchrun: "Signal 41 (SIGRTMIN+7) received by PID ..."
    reports = [json.loads((tmp_path / f"report-{rank}.json").read_text()) for rank in range(2)]
    assert [report["error"] for report in reports] == [None, None], reports
    ends = [r for r in journal.read([tmp_path]) if isinstance(r, journal.RunEnd)]
    assert sorted((end.origin.rank, end.final_step, end.error) for end in ends) == [(0, steps, None), (1, steps, None)]
