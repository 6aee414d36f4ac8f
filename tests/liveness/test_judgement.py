"""Suspicion, then conviction: the monitor's decision rules on a real process, a real store, no ranks."""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.stores import settled_set

from lifecycle._liveness import judgement, monitor
from lifecycle._liveness.rank import Marks
from lifecycle._liveness.settings import Settings
from lifecycle.journal.evidence import Evidence, Kind


def _records(path: Path) -> list[str]:
    """The kinds of the records in the journal at ``path``."""
    if not path.exists():
        return []
    return [json.loads(line)["kind"] for line in path.read_text().splitlines() if line.strip()]


def _wait_state(pid: int, states: str) -> None:
    """Wait (at most 5 s) until ``pid``'s ``/proc`` state is one of ``states``."""
    deadline = time.monotonic() + 5.0
    while monitor.process_state(pid) not in tuple(states) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert monitor.process_state(pid) in tuple(states)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process that sleeps for a minute (the watched rank); killed afterwards whatever happened."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def _monitor(port: int, marks: Marks, pid: int, journal: Path, *, world: int = 1, **more: float) -> monitor.Monitor:
    """A kill-mode monitor of rank 0 watching ``pid``: a 1 s deadline on ``step``, a 3 s conviction floor."""
    with open(marks.path, "r+b") as file:
        page = mmap.mmap(file.fileno(), monitor.PAGE_SIZE)
    settings = Settings(
        rank=0, world_size=world, pid=pid, host="127.0.0.1", port=port, prefix="p", mode="kill",
        interval_s=0.25, floor_s=1.0, default_deadline_s=600.0, deadlines=(("step", 1.0),),
        stacks="/dev/null", store_timeout_s=0.5, journal=str(journal), dump_signal=int(signal.SIGURG),
        conviction_floor_s=more.get("conviction_floor_s", 3.0), group_timeout_s=more.get("group_timeout_s", 0.0),
    )  # fmt: skip
    return monitor.Monitor(settings, page, wake=-1)


def _stopped(marks: Marks, watcher: monitor.Monitor, pid: int) -> monitor.Position:
    """Put the rank at step 60 (seen at time 0) and stop its process; its position."""
    marks.mark("step", 60)
    position = monitor.read_marks(watcher.page)
    watcher.observe(position, now=0.0)
    os.kill(pid, signal.SIGSTOP)
    _wait_state(pid, "Tt")
    return position


@pytest.mark.timeout(60)
def test_a_stopped_rank_is_suspected_at_its_deadline_and_convicted_only_at_the_conviction_floor(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """Past the 1 s deadline: a journaled suspicion, no notice, no kill; still stopped at 3 s: verdict and kill."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    marks, journal = Marks(), tmp_path / "rank0.jsonl"
    try:
        watcher = _monitor(server.port, marks, sleeper.pid, journal)
        position = _stopped(marks, watcher, sleeper.pid)
        watcher.classify(position, now=1.5)
        assert not watcher.judged and watcher.suspect is not None and watcher.suspect.kind is Kind.STOPPED
        assert not server.check(["p/failures/count"]) and sleeper.poll() is None
        assert _records(journal) == ["suspicion"]
        watcher.classify(position, now=3.5)
        assert watcher.judged and sleeper.wait(timeout=5) == -signal.SIGKILL
        assert json.loads(server.get("p/failures/1"))["kind"] == "stopped"
        assert _records(journal) == ["suspicion", "verdict"]
        watcher.page.close()
    finally:
        marks.close()


@pytest.mark.timeout(60)
def test_a_rank_resumed_before_the_conviction_deadline_is_withdrawn_and_never_signalled(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """Stopped past its deadline, then SIGCONT: at the conviction deadline the suspicion is withdrawn, nothing sent."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    marks, journal = Marks(), tmp_path / "rank0.jsonl"
    try:
        watcher = _monitor(server.port, marks, sleeper.pid, journal)
        position = _stopped(marks, watcher, sleeper.pid)
        watcher.classify(position, now=1.5)
        os.kill(sleeper.pid, signal.SIGCONT)
        _wait_state(sleeper.pid, "S")
        watcher.classify(position, now=3.5)
        assert not watcher.judged and watcher.suspect is None and sleeper.poll() is None
        assert not server.check(["p/failures/count"])
        assert _records(journal) == ["suspicion", "withdrawal"]
        watcher.page.close()
    finally:
        marks.close()


@pytest.mark.timeout(60)
def test_a_rank_that_moved_since_its_suspicion_is_not_convicted_on_the_fresh_read(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """The marks moved after the last look: the conviction's fresh read sees it; no verdict, no signal."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    marks, journal = Marks(), tmp_path / "rank0.jsonl"
    try:
        watcher = _monitor(server.port, marks, sleeper.pid, journal)
        position = _stopped(marks, watcher, sleeper.pid)
        watcher.classify(position, now=1.5)
        marks.mark("step", 61)  # it moved (then stopped again) between two looks
        watcher.classify(position, now=3.5)
        assert not watcher.judged and not server.check(["p/failures/count"])
        assert monitor.process_state(sleeper.pid) in ("T", "t")
        assert _records(journal) == ["suspicion", "withdrawal"]
        watcher.page.close()
    finally:
        marks.close()


@pytest.mark.timeout(60)
def test_a_rank_resumed_during_the_acknowledgement_wait_is_never_signalled(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """Convicted and published, it resumes while the peers acknowledge: the re-read before any signal spares it."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    marks, journal = Marks(), tmp_path / "rank0.jsonl"
    try:
        watcher = _monitor(server.port, marks, sleeper.pid, journal)
        position = _stopped(marks, watcher, sleeper.pid)
        watcher.classify(position, now=1.5)

        def resumed() -> None:
            os.kill(sleeper.pid, signal.SIGCONT)
            _wait_state(sleeper.pid, "S")

        watcher.wait_until_seen = resumed  # type: ignore[method-assign]
        watcher.classify(position, now=3.5)
        assert watcher.judged and server.check(["p/failures/count"])
        time.sleep(0.2)
        assert sleeper.poll() is None and monitor.process_state(sleeper.pid) == "S"
        assert _records(journal) == ["suspicion", "verdict", "withdrawal"]
        watcher.page.close()
    finally:
        marks.close()


@pytest.mark.timeout(60)
def test_a_silent_neighbour_monitor_is_a_suspicion_withdrawn_when_it_beats_and_published_only_past_the_group_timeout(
    tmp_path: Path,
) -> None:
    """A neighbour's monitor silent past the floor: journaled suspicion, no notice; it beats: withdrawal; silent past
    the group timeout: notice 1."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    marks, journal = Marks(), tmp_path / "rank0.jsonl"
    try:
        watcher = _monitor(server.port, marks, os.getpid(), journal, world=2, group_timeout_s=6.0)
        settled_set(server, "p/liveness/hb/1", '[7, 40, 0, 12, "step"]')
        watcher.look(now=0.0)
        watcher.look(now=5.0)  # silent for 5 s: a suspicion only
        assert not server.check(["p/failures/count"]) and _records(journal) == ["suspicion"]
        settled_set(server, "p/liveness/hb/1", '[8, 40, 0, 12, "step"]')
        watcher.look(now=5.5)
        assert _records(journal) == ["suspicion", "withdrawal"]
        watcher.look(now=7.0)
        watcher.look(now=13.0)  # silent for 7.5 s, past the 6 s group timeout
        notice = json.loads(server.get("p/failures/1"))
        assert (notice["rank"], notice["kind"]) == (1, "unresponsive")
        watcher.page.close()
    finally:
        marks.close()


def test_evidence_holds_only_at_the_same_count_in_a_matching_state() -> None:
    """Moved, done, gone, or in another state: the suspicion's evidence no longer holds."""
    suspect = judgement.Suspect(Kind.STOPPED, 0.0, 5, Evidence("stopped", 0))
    assert judgement.holds(suspect, 5, False, "T")
    assert not judgement.holds(suspect, 6, False, "T")
    assert not judgement.holds(suspect, 5, True, "T")
    assert not judgement.holds(suspect, 5, False, None)
    assert not judgement.holds(suspect, 5, False, "S")
    assert judgement.conviction_deadline(2.0, 10.0) == 10.0 and judgement.conviction_deadline(12.0, 10.0) == 12.0


def test_a_conviction_floor_is_a_third_of_the_group_timeout_scaled_by_patience_and_refused_at_it() -> None:
    """10 s at 30 s, 20 s at 60 s; patience scales it; it or floor_s at the timeout refused; the interval warned."""
    from lifecycle import ConfigError, DistributedConfig, LivenessConfig, PretrainConfig

    assert LivenessConfig(mode="kill").conviction_floor_s(30.0) == 10.0  # type: ignore[arg-type]
    assert LivenessConfig(mode="kill", patience=1.5).conviction_floor_s(60.0) == 30.0  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"liveness\.patience"):
        PretrainConfig(
            distributed=DistributedConfig(timeout_s=30.0),
            liveness=LivenessConfig(mode="kill", patience=3.0),  # type: ignore[arg-type]
        )
    with pytest.raises(
        ConfigError, match=r"liveness\.floor_s: 30: the least calibrated deadline, not below the group timeout"
    ):
        PretrainConfig(
            distributed=DistributedConfig(timeout_s=30.0),
            liveness=LivenessConfig(mode="report", floor_s=30.0),  # type: ignore[arg-type]
        )
    with pytest.warns(RuntimeWarning, match=r"liveness\.interval_s 1 is not below the conviction floor \(1 s"):
        PretrainConfig(  # not provably bad: warned on, not refused (the demo's --timeout 3 runs)
            distributed=DistributedConfig(timeout_s=3.0),
            liveness=LivenessConfig(mode="kill", interval_s=1.0),  # type: ignore[arg-type]
        )
    PretrainConfig(liveness=LivenessConfig(mode="off", patience=9.0))  # type: ignore[arg-type]  # off: nothing
    assert "10 s = patience 1 x the 30 s group timeout / 3" in LivenessConfig(mode="kill").in_force(30.0)  # type: ignore[arg-type]


def test_the_loop_past_warm_up_and_before_calibration_takes_the_conviction_floor_not_the_long_default() -> None:
    """Warm-up: the default (600 s); past it, uncalibrated: the conviction floor; calibrated: 5x the slowest step."""
    deadlines = monitor.Deadlines(floor_s=2.0, default_deadline_s=600.0, deadlines={}, uncalibrated_s=10.0)
    assert deadlines.of("step") == (600.0, "default")
    deadlines.sample("step", 30.0, 2)  # two warm-up steps (a first step 50x the rest)
    assert deadlines.of("batch") == (10.0, "floor")
    assert deadlines.of("checkpoint") == (600.0, "default")
    for seconds in (0.05, 4.0, 0.05):  # a 4 s step among them (a callback on this rank): learned
        deadlines.sample("step", seconds)
    assert deadlines.of("callback") == (20.0, "calibrated")


def test_show_says_a_suspicion_and_its_withdrawal_in_the_ranks_timeline_never_as_a_verdict(tmp_path: Path) -> None:
    """A journaled suspicion and withdrawal appear in show's timeline as such; the attempt has no verdict."""
    from support.internals import render_timeline, show_model, synthetic

    from lifecycle import journal

    origin = journal.Origin("r", 0, 0, "ordinary", 0)
    ranks = {
        rank: synthetic.rank_call(journal.Origin("r", rank, 0, "ordinary", 0), 2, 1000.0, steps=5) for rank in (0, 1)
    }
    facts = Evidence("stopped", 0, 3, "step", "T", 2.5, 2.0, "monitor")
    ranks[0].insert(-1, journal.Suspicion(origin=origin, culprit=0, evidence=facts, time=1000.3))
    ranks[0].insert(-1, journal.Withdrawal(origin=origin, culprit=0, time=1000.4, step=4, phase="step"))
    synthetic.write(tmp_path, ranks)
    text = "\n".join(render_timeline(show_model.build(journal.read([tmp_path]))))
    assert "suspected by its liveness monitor: rank 0 stopped at step 3, phase step (past its 2.0 s deadline)" in text
    assert "suspicion of rank 0 withdrawn: it made progress (step 4, phase step)" in text
    assert "killed by its liveness monitor" not in text


def test_show_prints_the_deadlines_in_force_under_each_ranks_start(tmp_path: Path) -> None:
    """A run record's ``liveness`` (the deadlines in force) is a line under that rank's start; "" prints none."""
    import dataclasses

    from support.internals import render_timeline, show_model, synthetic

    from lifecycle import LivenessConfig, journal

    said = LivenessConfig(mode="kill").in_force(30.0)  # type: ignore[arg-type]
    ranks = {
        rank: synthetic.rank_call(journal.Origin("r", rank, 0, "ordinary", 0), 2, 1000.0, steps=3) for rank in (0, 1)
    }
    first = ranks[0][0]
    assert isinstance(first, journal.RunStart)
    ranks[0][0] = dataclasses.replace(first, liveness=said)
    synthetic.write(tmp_path, ranks)
    lines = render_timeline(show_model.build(journal.read([tmp_path])))
    started = [i for i, line in enumerate(lines) if "pretrain started" in line]
    assert len(started) == 2, lines
    assert lines[started[0] + 1].strip().endswith(f"liveness {said}"), lines
    assert sum("liveness kill: every 1 s" in line for line in lines) == 1, lines
    assert "convicted past max(that, 10 s = patience 1 x the 30 s group timeout / 3)" in said


@pytest.mark.timeout(60)
def test_a_rank_stopped_before_training_is_convicted_once_a_peer_failed_and_not_before(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """Stopped in ``dist_ready`` (a 600 s deadline): nothing while no peer failed; a peer's notice convicts, kills."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    marks, journal = Marks(), tmp_path / "rank0.jsonl"
    try:
        watcher = _monitor(server.port, marks, sleeper.pid, journal, world=2)
        marks.mark("dist_ready", None)
        position = monitor.read_marks(watcher.page)
        watcher.observe(position, now=0.0)
        os.kill(sleeper.pid, signal.SIGSTOP)
        _wait_state(sleeper.pid, "Tt")
        watcher.classify(position, now=5.0)
        assert not watcher.judged and watcher.suspect is None and sleeper.poll() is None
        assert _records(journal) == []
        server.add("p/failures/count", 1)  # rank 1's own failure: its store wait timed out on this rank
        settled_set(
            server, "p/failures/1", json.dumps({"rank": 1, "error": "DistStoreError: wait timeout after 30000ms"})
        )
        watcher.classify(position, now=5.5)
        assert watcher.judged and sleeper.wait(timeout=5) == -signal.SIGKILL
        notice = json.loads(server.get("p/failures/2"))
        assert (notice["rank"], notice["kind"]) == (0, "stopped") and "rank 1 failed meanwhile" in notice["error"]
        assert _records(journal) == ["verdict"]
        watcher.page.close()
    finally:
        marks.close()


@pytest.mark.timeout(60)
def test_a_suspicion_still_open_when_the_rank_or_its_neighbour_is_done_is_withdrawn(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """Suspected, then the rank finishes before the next look, and the neighbour's last beat says done: both
    suspicions are withdrawn (the 1,000-step zoo ended with a slow last step suspected and never withdrawn)."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    marks, journal = Marks(), tmp_path / "rank0.jsonl"
    try:
        watcher = _monitor(server.port, marks, sleeper.pid, journal, world=2, group_timeout_s=60.0)
        settled_set(server, "p/liveness/hb/1", '[7, 40, 0, 12, "step"]')
        watcher.look(now=0.0)
        watcher.look(now=5.0)  # the neighbour silent for 5 s: suspected
        settled_set(server, "p/liveness/hb/1", '[8, 41, 0, 12, "step", "done", [], ""]')
        watcher.look(now=5.5)  # its last beat says done
        assert _records(journal) == ["suspicion", "withdrawal"]
        position = _stopped(marks, watcher, sleeper.pid)
        watcher.classify(position, now=1.5)  # this rank suspected
        assert watcher.suspect is not None
        os.kill(sleeper.pid, signal.SIGCONT)
        marks.mark("step", 61)
        marks.done()  # it finished before the monitor looked again
        assert watcher.run() == 0
        assert not watcher.judged and not server.check(["p/failures/count"])
        assert _records(journal) == ["suspicion", "withdrawal", "suspicion", "withdrawal"]
        watcher.page.close()
    finally:
        marks.close()
