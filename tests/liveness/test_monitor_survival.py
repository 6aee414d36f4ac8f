"""What a rank and its monitor leave behind when they die, and how a lost monitor is noticed (torch-free)."""

from __future__ import annotations

import dataclasses
import mmap
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lifecycle import journal
from lifecycle._liveness import monitor, rank
from lifecycle._liveness.page import process_state
from lifecycle._liveness.rank import Marks
from lifecycle._liveness.settings import LOST_SIGNAL, Settings

_RANK = """
import os, sys, time
from lifecycle._liveness.rank import start_monitor
from lifecycle._liveness.settings import Settings
settings = Settings(rank=0, world_size=1, host="127.0.0.1", port=1, prefix="p", mode="report", interval_s=0.25,
                    floor_s=1.0, default_deadline_s=600.0, stacks=sys.argv[1], store_timeout_s=0.05)
monitor = start_monitor(settings)
marks = monitor.marks
print(monitor.process.pid, os.path.realpath(marks.path), flush=True)
time.sleep(60)
"""


def _wait_gone(pid: int, within_s: float) -> None:
    """Return once ``pid`` is gone (or a zombie); raise past ``within_s``."""
    deadline = time.monotonic() + within_s
    while process_state(pid) is not None:
        assert time.monotonic() < deadline, f"process {pid} still there"
        time.sleep(0.005)


def _mapped(pid: int) -> bool:
    """Whether process ``pid`` has a marks page mapped."""
    try:
        return "lifecycle-marks" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.timeout(120)
def test_twenty_sigkills_of_a_rank_with_its_monitor_leave_no_page(tmp_path: Path) -> None:
    """A rank and its monitor SIGKILLed together, once both mapped the page, 20 times: no page of theirs is left."""
    names: list[str] = []
    for _ in range(20):
        child = subprocess.Popen(
            [sys.executable, "-c", _RANK, str(tmp_path / "stacks.txt")],
            stdout=subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:
            assert child.stdout is not None
            pid, name = child.stdout.readline().decode().split(" ", 1)
            names.append(name.strip())
            deadline = time.monotonic() + 10.0
            while not _mapped(int(pid)):  # the monitor has mapped the page: both sides hold it
                assert time.monotonic() < deadline, "the monitor never mapped its page"
                time.sleep(0.002)
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)
            _wait_gone(int(pid), 10.0)
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
    left = [name for name in names if os.path.exists(name)]
    assert not left, left


_STOPPED = """
import os, signal, sys
from lifecycle._liveness import rank
from lifecycle._liveness.settings import LOST_SIGNAL, Settings
settings = Settings(rank=0, world_size=1, host="127.0.0.1", port=1, prefix="p", mode="kill", interval_s=0.25,
                    floor_s=1.0, default_deadline_s=600.0, stacks=sys.argv[1], store_timeout_s=0.05,
                    lost_signal=int(LOST_SIGNAL))
watching = rank.start_monitor(settings)
watching.stop()
os.kill(os.getpid(), LOST_SIGNAL)  # a look that found the store silent, sent as pretrain returned
os.kill(os.getpid(), settings.dump_signal)  # a verdict's stack dump, as late
print("alive", flush=True)
rank.reap()
print(signal.getsignal(LOST_SIGNAL) == signal.SIG_DFL, flush=True)
"""


@pytest.mark.timeout(60)
def test_a_signal_the_monitor_sends_after_stop_is_ignored_until_it_exits_then_defaulted_again(tmp_path: Path) -> None:
    """After ``stop``, the monitor's lost-store and dump signals do not kill the rank; once reaped, the lost-store
    signal has its default back."""
    done = subprocess.run(
        [sys.executable, "-c", _STOPPED, str(tmp_path / "stacks.txt")],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert (done.returncode, done.stdout.split()) == (0, ["alive", "True"]), done


@pytest.mark.timeout(60)
def test_the_monitor_signals_no_rank_that_is_done_nor_one_without_a_handler() -> None:
    """A silent store past its deadline: no signal to a rank marked done, none where ``lost_signal`` is 0; else sent."""
    marks = Marks()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(marks.path, "r+b") as file:
            page = mmap.mmap(file.fileno(), monitor.PAGE_SIZE)

        def look(lost_signal: int) -> None:
            settings = Settings(
                rank=0, world_size=1, pid=sleeper.pid, host="127.0.0.1", port=1, prefix="p", mode="kill",
                interval_s=0.25, floor_s=1.0, default_deadline_s=1.0, stacks="/dev/null", lost_signal=lost_signal,
            )  # fmt: skip
            watcher = monitor.Monitor(settings, page, wake=-1)
            watcher.check_store(monitor.read_marks(page), now=watcher.answered + 60.0)
            assert watcher.lost

        marks.mark("step", 3)
        look(0)
        marks.done()
        look(int(LOST_SIGNAL))
        time.sleep(0.2)
        assert sleeper.poll() is None  # the default action of SIGRTMIN+7 would have ended it
        marks.mark("step", 4)  # not done any more: the signal goes
        look(int(LOST_SIGNAL))
        assert sleeper.wait(10) == -int(LOST_SIGNAL)
        page.close()
    finally:
        sleeper.kill()
        sleeper.wait()
        marks.close()


def _replaced(watching: rank.RankMonitor, pid: int, within_s: float = 10.0) -> int:
    """The pid of the monitor process that replaced ``pid`` (waits for it); raise past ``within_s``."""
    deadline = time.monotonic() + within_s
    while watching.process.pid == pid:
        assert time.monotonic() < deadline, "the lost monitor was not started again"
        time.sleep(0.005)
    return watching.process.pid


def _losses(path: Path, count: int, within_s: float = 10.0) -> list[journal.MonitorLost]:
    """The ``monitor_lost`` records in the journal ``path`` once there are ``count``; raise past ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        found = [r for r in journal.read([path]) if isinstance(r, journal.MonitorLost)] if path.exists() else []
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.01)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["report", "kill"])
def test_a_lost_monitor_is_journaled_and_started_again_once_then_the_rank_fails_or_goes_on(
    tmp_path: Path, mode: str
) -> None:
    """A monitor SIGKILLed while its rank trains is journaled and started again on the same page; the new one lost
    too, a ``kill`` rank is failed (``on_lost``), a ``report`` one goes on; a monitor ending after ``stop`` is none."""
    path = tmp_path / "rank0.jsonl"
    origin = journal.Origin(run_id="r", rank=0, attempt=0, restart_mode="none", iteration=0)
    settings = Settings(
        rank=0, world_size=1, host="127.0.0.1", port=1, prefix="p", mode=mode, interval_s=0.25, floor_s=1.0,
        default_deadline_s=600.0, stacks=str(tmp_path / "stacks.txt"), store_timeout_s=0.05, journal=str(path),
        origin=dataclasses.asdict(origin),
    )  # fmt: skip
    failed: list[str] = []
    watching = rank.start_monitor(settings)
    try:
        watching.on_lost = lambda why: failed.append(why) is None
        watching.marks.mark("step", 7)
        first = watching.process.pid
        os.kill(first, signal.SIGKILL)
        second = _replaced(watching, first)
        while not _mapped(second):  # the new monitor has the same page
            time.sleep(0.002)
        (lost,) = _losses(path, 1)
        assert (lost.pid, lost.action, lost.new_pid, lost.step, lost.phase) == (first, "restarted", second, 7, "step")
        assert lost.how == "was killed by SIGKILL"
        os.kill(second, signal.SIGKILL)
        again = _losses(path, 2)[1]
        assert (again.pid, again.action) == (second, "failed" if mode == "kill" else "without"), again
        assert len(failed) == (1 if mode == "kill" else 0), failed
        assert watching.process.pid == second  # started again once only
    finally:
        watching.stop()
        rank.reap()
    assert len(_losses(path, 2)) == 2


@pytest.mark.timeout(60)
def test_a_monitor_that_exits_after_stop_or_once_its_rank_is_done_is_not_lost(tmp_path: Path) -> None:
    """``stop`` (and a rank marked done) ends the monitor with no ``monitor_lost`` record and no second monitor."""
    path = tmp_path / "rank0.jsonl"
    origin = journal.Origin(run_id="r", rank=0, attempt=0, restart_mode="none", iteration=0)
    settings = Settings(
        rank=0, world_size=1, host="127.0.0.1", port=1, prefix="p", mode="kill", interval_s=0.05, floor_s=1.0,
        default_deadline_s=600.0, stacks=str(tmp_path / "stacks.txt"), store_timeout_s=0.02, journal=str(path),
        origin=dataclasses.asdict(origin),
    )  # fmt: skip
    done = rank.start_monitor(settings)
    first = done.process.pid
    done.marks.done()  # failing on its own: the monitor beats once more and exits by itself
    done.process.wait(10)
    time.sleep(0.2)
    assert done.process.pid == first
    done.stop()
    stopped = rank.start_monitor(settings)
    stopped.stop()
    rank.reap()
    assert stopped.process.returncode is not None
    assert not path.exists() or not [r for r in journal.read([path]) if isinstance(r, journal.MonitorLost)]


def _settings(tmp_path: Path, attempt: int) -> Settings:
    """A world-of-one ``report`` monitor's settings, its store unreachable, for ``attempt``."""
    return Settings(
        rank=0, world_size=1, host="127.0.0.1", port=1, prefix=f"p{attempt}", mode="report", interval_s=0.05,
        floor_s=1.0, default_deadline_s=600.0, stacks=str(tmp_path / "stacks.txt"), store_timeout_s=0.02,
        attempt=attempt,
    )  # fmt: skip


def _pages(pid: int) -> list[str]:
    """The marks pages process ``pid`` has mapped (their lines in ``/proc/<pid>/maps``)."""
    return [line for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if "lifecycle-marks" in line]


def _watching(monitor: rank.RankMonitor) -> None:
    """Return once ``monitor``'s process has mapped its page (its signal handlers are in place by then)."""
    deadline = time.monotonic() + 20
    while not _mapped(monitor.process.pid):
        assert time.monotonic() < deadline, "the monitor never mapped its page"
        time.sleep(0.005)


@pytest.mark.timeout(60)
def test_a_parked_monitor_watches_the_next_attempt_of_the_thread_that_started_it(tmp_path: Path) -> None:
    """A monitor parked on a failed attempt (``park``, then ``stop``) is the next attempt's, same process: it maps
    the new page alone and ends when that attempt is done; one started by another thread is not taken but ended."""
    first = rank.start_monitor(_settings(tmp_path, 0))
    pid = first.process.pid
    _watching(first)
    first.park()
    first.stop()
    second = rank.start_monitor(_settings(tmp_path, 1))
    try:
        assert second.process.pid == pid
        new_page = str(os.fstat(second.marks.fd).st_ino)
        deadline = time.monotonic() + 10
        while not (len(_pages(pid)) == 1 and new_page in _pages(pid)[0]):  # the old page unmapped, the new mapped
            assert time.monotonic() < deadline, _pages(pid)
            time.sleep(0.005)
        time.sleep(0.3)
        assert second.process.poll() is None  # watching: not done yet
        second.marks.done()  # not parked: it exits once it sees this attempt done
        second.process.wait(10)
    finally:
        second.stop()
        rank.reap()
    started: list[rank.RankMonitor] = []
    elsewhere = threading.Thread(target=lambda: started.append(rank.start_monitor(_settings(tmp_path, 2))))
    elsewhere.start()
    elsewhere.join()
    _watching(started[0])
    started[0].park()
    started[0].stop()
    third = rank.start_monitor(_settings(tmp_path, 3))
    try:
        assert third.process.pid != started[0].process.pid
    finally:
        third.stop()
        rank.reap()
    assert started[0].process.returncode is not None


@pytest.mark.timeout(60)
def test_a_parked_monitor_no_attempt_takes_ends_at_exit(tmp_path: Path) -> None:
    """``reap`` (at interpreter exit) ends a parked monitor: the end of its stdin, within ``STOP_WAIT_S``, unkilled."""
    parked = rank.start_monitor(_settings(tmp_path, 0))
    _watching(parked)
    parked.park()
    parked.stop()
    time.sleep(0.3)
    assert parked.process.poll() is None  # parked, waiting for the next attempt
    rank.reap()
    assert parked.process.returncode == 0
