"""The monitor's parts on their own: marks through the shared page, deadlines, the store client's wire and bounds."""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import signal
import subprocess
import sys
import time

import pytest
from support.processes import stop_process
from support.stores import settled_set

from lifecycle import journal
from lifecycle._liveness import monitor
from lifecycle._liveness.rank import Marks
from lifecycle._liveness.settings import Settings


def test_marks_written_by_the_rank_are_read_by_the_monitor() -> None:
    """Each mark bumps the count and carries attempt, step and phase; done() says the rank is done."""
    marks = Marks()
    marks.attempt = 3
    try:
        with open(marks.path, "r+b") as file:
            page = mmap.mmap(file.fileno(), monitor.PAGE_SIZE)
        first = monitor.read_marks(page)
        marks.mark("setup", None)
        marks.mark("step", 7)
        seen = monitor.read_marks(page)
        assert (seen.count - first.count, seen.attempt, seen.step, seen.phase, seen.done) == (2, 3, 7, "step", False)
        marks.done()
        assert monitor.read_marks(page).done
        monitor.write_verdict(page, b'{"rank": 1, "note": "rank 1 is stopped"}')
        assert marks.verdict() == {"rank": 1, "note": "rank 1 is stopped"}
        page.close()
    finally:
        marks.close()
    assert not os.path.exists(marks.path)


def test_a_mark_costs_about_a_microsecond() -> None:
    """100,000 marks in well under a second (no system call, no store call)."""
    marks = Marks()
    try:
        started = time.perf_counter()
        for step in range(100_000):
            marks.mark("step", step)
        assert time.perf_counter() - started < 1.0
    finally:
        marks.close()


def test_settings_cross_to_the_monitor_whole_and_derive_the_store_bound_once() -> None:
    """What the rank sends its monitor reads back equal on the other side; the store bound is half the interval."""
    settings = Settings(
        rank=1, world_size=2, host="127.0.0.1", port=29500, prefix="p", mode="kill", interval_s=0.5, floor_s=2.0,
        default_deadline_s=600.0, stacks="/tmp/stacks", deadlines=(("checkpoint", 50.0),), attempt=2,
        origin={"rank": 1, "run_id": "r"},
    )  # fmt: skip
    assert Settings.from_json(settings.to_json()) == settings
    assert (settings.store_timeout_s, settings.pid) == (0.25, os.getpid())


def test_deadlines_default_until_calibrated_then_five_times_the_slowest_with_a_floor() -> None:
    """Warm-up samples are skipped; three samples calibrate; the floor and an explicit deadline win."""
    deadlines = monitor.Deadlines(floor_s=2.0, default_deadline_s=600.0, deadlines={"checkpoint": 50.0})
    for seconds in (9.0, 9.0, 0.1, 0.3):  # two warm-up steps, then two samples
        deadlines.sample("step", seconds)
    assert deadlines.of("batch") == (600.0, "default")
    deadlines.sample("step", 0.2)
    assert deadlines.of("batch") == (2.0, "calibrated")  # 5 x 0.3 is under the floor
    deadlines.sample("step", 1.0)
    assert deadlines.of("callback") == (5.0, "calibrated")
    assert deadlines.of("eval") == (600.0, "default")  # evaluation is calibrated apart
    assert deadlines.of("checkpoint") == (50.0, "explicit")


def test_a_look_over_many_short_steps_calibrates_the_loop_at_once() -> None:
    """Steps shorter than a look: one look past warm-up that stands for three steps calibrates (not three looks)."""
    deadlines = monitor.Deadlines(floor_s=2.0, default_deadline_s=600.0, deadlines={})
    deadlines.sample("step", 0.01, 2)  # the warm-up steps alone: dropped
    assert deadlines.of("step") == (600.0, "default")
    deadlines.sample("step", 0.012, 18)  # steps 3..20, one look
    assert deadlines.of("step") == (2.0, "calibrated")
    slow = monitor.Deadlines(floor_s=2.0, default_deadline_s=600.0, deadlines={})
    slow.sample("step", 1.0, 3)  # steps 1..3: one past warm-up
    assert slow.of("step") == (600.0, "default")


def test_process_state_reads_proc() -> None:
    """This process runs (R); a stopped child is T; a reaped one is gone (None)."""
    assert monitor.process_state(os.getpid()) == "R"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        stop_process(child.pid)
        assert monitor.process_state(child.pid) == "T"
    finally:
        child.kill()
        child.wait()
    assert monitor.process_state(child.pid) is None


@pytest.mark.timeout(60)
def test_the_store_client_speaks_torchs_wire() -> None:
    """Keys set by the client are torch's keys (a PrefixStore sees them), adds share one counter, get never waits."""
    from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

    server = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    client = monitor.StoreClient("127.0.0.1", server.port, 1.0)
    client.set("p/liveness/hb/0", b"[1]")
    assert PrefixStore("p", server).get("liveness/hb/0") == b"[1]"
    assert (client.add("p/n", 2), server.add("p/n", 1), client.add("p/n", 0)) == (2, 3, 3)
    assert client.get("p/missing") is None and client.get("p/liveness/hb/0") == b"[1]"
    client.close()


@pytest.mark.timeout(60)
def test_every_store_call_is_bounded_against_a_frozen_server() -> None:
    """A SIGSTOPped store host: a connected client's get raises StoreError within its timeout (torch's would block)."""
    host = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from torch.distributed import TCPStore\n"
            "s = TCPStore('127.0.0.1', 0, 1, True, wait_for_workers=False)\n"
            "print(s.port, flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline())
        client = monitor.StoreClient("127.0.0.1", port, 0.5)
        client.set("k", b"v")
        assert client.get("k") == b"v"
        stop_process(host.pid)
        started = time.monotonic()
        with pytest.raises(monitor.StoreError):
            client.get("k")
        assert time.monotonic() - started < 1.5
    finally:
        host.kill()
        host.wait()


def _accept_queue(port: int) -> int:
    """The connections queued, not yet accepted, on the listening socket of ``port`` (its ``/proc/net`` rx_queue)."""
    queued = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as file:
            for line in file.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    queued += int(fields[4].split(":")[1], 16)
    return queued


@pytest.mark.timeout(60)
def test_a_client_keeps_one_connection_waiting_on_a_frozen_server_and_answers_at_once_when_it_resumes() -> None:
    """Twenty failed looks on a SIGSTOPped host queue one connection, not twenty; resumed, the next call answers."""
    host = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from torch.distributed import TCPStore\n"
            "s = TCPStore('127.0.0.1', 0, 1, True, wait_for_workers=False)\n"
            "print(s.port, flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline())
        client = monitor.StoreClient("127.0.0.1", port, 0.1)
        client.set("k", b"v")
        stop_process(host.pid)
        for _ in range(20):
            with pytest.raises(monitor.StoreError):
                client.get("k")
        assert _accept_queue(port) <= 1
        os.kill(host.pid, signal.SIGCONT)
        started = time.monotonic()
        while True:
            try:
                assert client.get("k") == b"v"
                break
            except monitor.StoreError:
                assert time.monotonic() - started < 1.0
    finally:
        host.kill()
        host.wait()


def test_steps_shorter_than_a_look_calibrate_on_their_mean() -> None:
    """Ten steps per 0.25 s look: each sample is 25 ms (not the look's 250 ms), so the deadline is the floor."""
    marks = Marks()
    try:
        with open(marks.path, "r+b") as file:
            page = mmap.mmap(file.fileno(), monitor.PAGE_SIZE)
        settings = Settings(
            rank=0, world_size=1, pid=os.getpid(), host="127.0.0.1", port=1, prefix="p",
            interval_s=0.25, floor_s=0.05, default_deadline_s=600.0, mode="report",
            stacks="/dev/null", store_timeout_s=0.1,
        )  # fmt: skip
        watcher = monitor.Monitor(settings, page, wake=-1)
        for look in range(8):
            marks.mark("step", 10 * look + 1)
            watcher.observe(monitor.read_marks(page), now=look * 0.25)
        assert max(watcher.deadlines.samples["loop"]) == pytest.approx(0.025)
        assert watcher.deadlines.of("batch") == (pytest.approx(0.125), "calibrated")
        page.close()
    finally:
        marks.close()


def _watcher(port: int, marks: Marks) -> monitor.Monitor:
    """Rank 0's monitor of a 2-rank world on the store at ``port``, 0.25 s interval, 1 s floor (not started)."""
    with open(marks.path, "r+b") as file:
        page = mmap.mmap(file.fileno(), monitor.PAGE_SIZE)
    settings = Settings(
        rank=0, world_size=2, pid=os.getpid(), host="127.0.0.1", port=port, prefix="p",
        interval_s=0.25, floor_s=1.0, default_deadline_s=600.0, mode="report",
        stacks="/dev/null", store_timeout_s=0.5,
    )  # fmt: skip
    return monitor.Monitor(settings, page, wake=-1)


@pytest.mark.timeout(60)
def test_a_neighbour_silent_past_the_group_timeout_is_published_unresponsive_once_and_a_done_one_never() -> None:
    """Rank 1's beat unchanged past the group timeout (1 s here): rank 0's monitor publishes it (notice 1, verdict 1);
    a second look publishes nothing more; a beat that says done is never published."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    marks = Marks()
    try:
        watcher = _watcher(server.port, marks)
        watcher.s = dataclasses.replace(watcher.s, group_timeout_s=1.0)
        settled_set(server, "p/liveness/hb/1", '[7, 40, 0, 12, "step"]')
        watcher.look(now=0.0)
        watcher.look(now=0.9)  # within the floor: nothing
        assert not server.check(["p/failures/count"])
        watcher.look(now=1.5)
        notice = json.loads(server.get("p/failures/1"))
        assert (notice["rank"], notice["step"], notice["phase"]) == (1, 12, "step")
        assert "rank 1 went unresponsive" in json.loads(server.get("p/liveness/verdict/1"))["note"]
        watcher.look(now=9.0)
        assert server.add("p/failures/count", 0) == 1

        done = _watcher(server.port, marks)
        settled_set(server, "p/liveness/hb/1", '[8, 41, 0, 12, "step", "done"]')
        done.look(now=0.0)
        done.look(now=9.0)
        assert server.add("p/failures/count", 0) == 1
    finally:
        marks.close()


def test_the_monitor_writes_verdicts_in_the_journal_version_lifecycle_reads() -> None:
    """The standard-library monitor's verdict records carry ``lifecycle.journal.VERSION`` (it cannot import it)."""
    assert monitor.JOURNAL_VERSION == journal.VERSION
    assert "verdict" in journal.KINDS


def _middle(port: int, marks: Marks, pid: int) -> monitor.Monitor:
    """Rank 1's monitor of a 3-rank world on the store at ``port``, watching ``pid``, a 1 s deadline on ``step``."""
    with open(marks.path, "r+b") as file:
        page = mmap.mmap(file.fileno(), monitor.PAGE_SIZE)
    settings = Settings(
        rank=1, world_size=3, pid=pid, host="127.0.0.1", port=port, prefix="p",
        interval_s=0.25, floor_s=1.0, default_deadline_s=600.0, deadlines=(("step", 1.0),), mode="report",
        stacks="/dev/null", store_timeout_s=0.5,
    )  # fmt: skip
    return monitor.Monitor(settings, page, wake=-1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("rank2", "verdict", "judged"),
    [("ahead", False, True), ("done", False, False), ("ahead", True, False)],
    ids=["a-peer-went-on", "the-peer-ahead-is-done", "a-verdict-is-out"],
)
def test_a_rank_is_judged_waiting_only_behind_a_peer_that_went_on_and_never_once_a_culprit_is_named(
    rank2: str, verdict: bool, judged: bool
) -> None:
    """Asleep past its deadline: waiting behind a peer that went on; never behind a done one, nor after a verdict."""
    # A done peer: the first to fail once the culprit is killed (a CI run named and killed a victim that way).
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    marks = Marks()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for step in (59, 60):
            marks.mark("step", step)
        watcher = _middle(server.port, marks, sleeper.pid)
        position = monitor.read_marks(watcher.page)
        watcher.observe(position, now=0.0)
        level = [5, position.count, position.attempt, 60, "step"]
        settled_set(server, "p/liveness/hb/0", json.dumps(level))
        ahead = [5, position.count + 1, position.attempt, 60, "step"]
        settled_set(server, "p/liveness/hb/2", json.dumps([*ahead, "done"] if rank2 == "done" else ahead))
        if verdict:
            settled_set(
                server, "p/liveness/verdict/1", json.dumps({"rank": 2, "kind": "stopped", "note": "rank 2 is stopped"})
            )
        deadline = time.monotonic() + 5.0
        while monitor.process_state(sleeper.pid) != "S" and time.monotonic() < deadline:
            time.sleep(0.01)
        watcher.classify(position, now=3.0)
        assert watcher.judged is judged
        notices = server.add("p/failures/count", 0)
        assert notices == (1 if judged else 0)
        if judged:
            assert "rank 1 hung at step 60, phase step" in json.loads(server.get("p/failures/1"))["error"]
        if verdict:  # copied to the page, acknowledged: the rank's failure path names rank 2
            assert watcher.seen and server.add("p/liveness/seen/1", 0) == 1
        watcher.page.close()
    finally:
        sleeper.kill()
        sleeper.wait()
        marks.close()


def test_a_monitor_that_first_sees_the_loop_many_steps_in_knows_its_warm_up_is_past() -> None:
    """Steps so short that the first look in the loop is at step 100: the loop takes the conviction floor, not the
    600 s default (the 2-rank demo's hang in the step was left to the group timeout on a quiet machine)."""
    marks = Marks()
    try:
        with open(marks.path, "r+b") as file:
            page = mmap.mmap(file.fileno(), monitor.PAGE_SIZE)
        settings = Settings(
            rank=0, world_size=1, pid=os.getpid(), host="127.0.0.1", port=1, prefix="p",
            interval_s=1.0, floor_s=2.0, default_deadline_s=600.0, mode="report",
            stacks="/dev/null", store_timeout_s=0.1, conviction_floor_s=10.0,
        )  # fmt: skip
        watcher = monitor.Monitor(settings, page, wake=-1)
        marks.mark("setup", None)
        watcher.observe(monitor.read_marks(page), now=0.0)
        for step in range(1, 101):  # between two looks
            for phase in ("step", "batch", "step", "callback"):
                marks.mark(phase, step)
        marks.mark("checkpoint", 100)
        marks.mark("step", 100)  # the same step again: not one more
        position = monitor.read_marks(page)
        assert position.steps == 100
        watcher.observe(position, now=1.0)
        assert watcher.deadlines.of("step") == (10.0, "floor")
        page.close()
    finally:
        marks.close()


def test_the_loop_steps_a_page_counts_start_again_with_each_attempt() -> None:
    """``Position.steps`` counts the loop's distinct steps of the page's attempt; other phases never count."""
    marks = Marks()
    try:
        for step in (1, 1, 2, 2, 3):
            marks.mark("step", step)
        marks.mark("evaluation", 4)
        position = marks.position()
        assert position is not None and position.steps == 3
        marks.attempt = 1
        marks.mark("setup", None)
        assert (position := marks.position()) is not None and position.steps == 0
        marks.mark("batch", 3)
        assert (position := marks.position()) is not None and position.steps == 1
    finally:
        marks.close()
