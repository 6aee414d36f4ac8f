"""``decide_after``: the job's decision after a failed ``pretrain`` call, made once and read alike by every rank.

Torch-free: the journals are written here as ``pretrain`` writes them (a ``run``, steps, a ``failure``, an ``end``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from support.internals import show_main

from lifecycle import ConfigError, NonfiniteLoss
from lifecycle._training.retry import DECISIONS, STOP_FILE, user_frame
from lifecycle.journal import (
    Failure,
    JobDecision,
    JournalWriter,
    Origin,
    RunEnd,
    RunStart,
    TrainStep,
    journal_path,
    read,
)
from lifecycle.journal.evidence import Evidence
from lifecycle.lowlevel import Decision, RestartPolicy, decide_after, last_decision

RUN = "test-run"


@pytest.fixture(autouse=True)
def _run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIFECYCLE_RUN_ID", RUN)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)


def journal(
    folder: Path,
    rank: int,
    attempt: int,
    *,
    cause: int = 1,
    step: int = 3,
    kind: str = "raised",
    resumed: int = 0,
    restart: int = 0,
    host: str = "h",
    committed: int | None = None,
) -> None:
    """Append one failed attempt of ``rank`` to its journal: steps from ``resumed``+1, a failure at ``step``, the
    last committed step ``committed`` at its end."""
    origin = Origin(run_id=RUN, rank=rank, attempt=attempt, restart_mode="ordinary", iteration=0, restart_count=restart)
    with JournalWriter(
        journal_path(folder, rank), RunStart(origin=origin, world_size=2, pid=1, host=host, start=0.0)
    ) as out:
        for s in range(resumed + 1, step):
            out.write(TrainStep(origin=origin, step=s, loss=1.0, start=None, end=None))
        facts = Evidence(kind=kind, rank=cause, step=step, phase="step")
        first = None if cause == rank else facts
        own = facts if cause == rank else Evidence(kind="connection_lost", rank=rank, step=step, phase="step")
        out.write(Failure(origin=origin, phase="step", step=step, error="E: x", time=0.0, evidence=own, first=first))
        out.write(
            RunEnd(
                origin=origin,
                state="failed",
                exit_reason=None,
                final_step=step - 1,
                checkpoint_step=committed,
                error="E: x",
                end=0.0,
            )
        )


def boom() -> RuntimeError:
    """A RuntimeError raised here (this test file: a frame outside lifecycle and torch)."""
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        return exc


def test_same_raise_twice_stops_reproducible_on_every_rank(tmp_path: Path) -> None:
    """Two attempts raising the same way: attempt 0 restarts, attempt 1 stops 'reproducible', both ranks alike."""
    error = boom()
    for attempt in (0, 1):
        for rank in (0, 1):
            journal(tmp_path, rank, attempt)
        seen: dict[int, Decision] = {}

        def victim(into: dict[int, Decision]) -> None:
            into[0] = decide_after(ConnectionError("Connection reset by peer"), tmp_path, rank=0)

        thread = threading.Thread(target=victim, args=(seen,))
        thread.start()  # the victim waits for the cause's record
        seen[1] = decide_after(error, tmp_path, rank=1)
        thread.join(5)
        assert seen[0] == seen[1]
        assert seen[1].action == ("restart" if attempt == 0 else "stop")
    assert seen[1].reason == "reproducible"
    assert json.loads((tmp_path / STOP_FILE).read_text())["reason"] == "reproducible"
    assert last_decision(tmp_path) == seen[1]
    assert len(list((tmp_path / DECISIONS).iterdir())) == 2


def test_a_stop_removes_the_ranks_copies_in_node_memory_and_a_restart_keeps_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's copies in node memory outlive a restart decision (the retry resumes from them) and go at a stop:
    the job ended with its last failure."""
    monkeypatch.setenv("LIFECYCLE_COPY_ROOT", str(tmp_path / "shm"))
    folder = tmp_path / "shm" / RUN
    folder.mkdir(parents=True)
    slot = folder / "rank1.slot0"
    slot.write_bytes(b"a copy")
    for attempt, kept in ((0, True), (1, False)):
        journal(tmp_path / "journal", 1, attempt)
        decision = decide_after(boom(), tmp_path / "journal", rank=1)
        assert decision.stop is not kept
        assert slot.exists() is kept
    assert not folder.exists()


def test_the_same_nan_loss_twice_is_decided_by_the_rank_that_raised_it(tmp_path: Path) -> None:
    """A NaN loss (its own kind) at the same step twice: its rank lives, so its peer waits; it stops reproducible."""
    for attempt in (0, 1):
        for rank in (0, 1):
            journal(tmp_path, rank, attempt, kind="nonfinite_loss")
        seen: dict[int, Decision] = {}

        def victim(into: dict[int, Decision]) -> None:
            into[0] = decide_after(NonfiniteLoss(3, 1, float("nan"), 1, 0), tmp_path, rank=0)

        thread = threading.Thread(target=victim, args=(seen,))
        thread.start()
        time.sleep(0.3)  # the peer started first: it waits (up to 1 s) for the rank whose loss was NaN
        seen[1] = decide_after(NonfiniteLoss(3, 1, float("nan"), 1, 0), tmp_path, rank=1)
        thread.join(5)
        assert seen[0] == seen[1]
    assert (seen[1].reason, seen[1].details["exception"]) == ("reproducible", "NonfiniteLoss")
    assert {r.origin.rank for r in read([tmp_path]) if isinstance(r, JobDecision)} == {1}


def test_a_victim_without_the_cause_decides_itself_within_the_wait(tmp_path: Path) -> None:
    """A cause that died records nothing: the survivor decides at once (the death named as the kind)."""
    journal(tmp_path, 0, 0, kind="died")
    decision = decide_after(ConnectionError("Connection reset by peer"), tmp_path, rank=0, wait_s=0.2)
    assert decision.action == "restart"
    assert last_decision(tmp_path) == decision


def test_the_same_host_three_times_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Deaths of the same culprit host in 3 restarts: stop 'repeated_culprit', the JSON line on stderr and on disk."""
    for restart in range(3):
        journal(tmp_path, 1, 0, kind="died", restart=restart, step=5 + restart, host="node-b")
        journal(tmp_path, 0, 0, kind="died", restart=restart, step=5 + restart, host="node-a")
        decision = decide_after(ConnectionError("Connection reset by peer"), tmp_path, rank=0, wait_s=0.1)
    assert (decision.reason, decision.details) == ("repeated_culprit", {"host": "node-b"})
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert (line["decision"], line["reason"], line["host"]) == ("stop", "repeated_culprit", "node-b")


def test_budget_applies_to_in_process_retries(tmp_path: Path) -> None:
    """In-process retries count toward the job's restart budget."""
    policy = RestartPolicy(max_restarts=1, culprit_limit=0, no_progress_limit=0)
    actions = []
    for attempt in (0, 1):
        journal(tmp_path, 1, attempt, step=3 + attempt)
        actions.append(decide_after(boom(), tmp_path, rank=1, policy=policy).action)
    assert actions == ["restart", "stop"]


def decided_alike(folder: Path, cause: int, error: BaseException, policy: RestartPolicy | None = None) -> Decision:
    """The decision after the attempt just journaled: the victim (the other of ranks 0 and 1) waits, the cause
    records; both get the same one."""
    seen: dict[int, Decision] = {}

    def victim() -> None:
        lost = ConnectionError("Connection reset by peer")
        seen[1 - cause] = decide_after(lost, folder, rank=1 - cause, policy=policy)

    thread = threading.Thread(target=victim)
    thread.start()
    seen[cause] = decide_after(error, folder, rank=cause, policy=policy)
    thread.join(5)
    assert seen[0] == seen[1], seen
    return seen[cause]


def test_the_same_rank_raising_in_three_in_process_retries_is_named(tmp_path: Path) -> None:
    """In-process retries (attempts 0-2, no torchrun restart), rank 1 on node-b raising at a new step each time:
    the third stops 'repeated_culprit' naming node-b (not reproducible: the steps differ)."""
    decisions = []
    for attempt in (0, 1, 2):
        step = 3 + attempt
        journal(tmp_path, 0, attempt, step=step, resumed=attempt, committed=attempt + 1, host="node-a")
        journal(tmp_path, 1, attempt, step=step, resumed=attempt, committed=attempt + 1, host="node-b")
        decisions.append(decided_alike(tmp_path, 1, boom()))
    assert [(d.action, d.reason) for d in decisions] == [
        ("restart", "may_recover"),
        ("restart", "may_recover"),
        ("stop", "repeated_culprit"),
    ]
    assert decisions[-1].details == {"host": "node-b"} and decisions[-1].exit_code == 93


def test_raises_on_alternating_ranks_spend_the_budget_of_in_process_retries(tmp_path: Path) -> None:
    """In-process retries whose cause alternates between ranks, each committing a step: restarted 3 times (the
    budget, ``max_restarts=3``), the fourth failure stops 'budget' on both ranks."""
    policy = RestartPolicy(max_restarts=3)
    decisions = []
    for attempt in range(4):
        cause, step = attempt % 2, 2 * attempt + 3
        for rank in (0, 1):
            journal(tmp_path, rank, attempt, cause=cause, step=step, resumed=2 * attempt, committed=2 * attempt + 2)
        decisions.append(decided_alike(tmp_path, cause, boom(), policy=policy))
    assert [d.action for d in decisions] == ["restart", "restart", "restart", "stop"]
    assert (decisions[-1].reason, decisions[-1].attempt, decisions[-1].details["restarts"]) == ("budget", 3, 3)


def test_fatal_error_stops(tmp_path: Path) -> None:
    """A ConfigError is never worth a restart."""
    journal(tmp_path, 1, 0)
    assert decide_after(ConfigError("training.iterations", "bad"), tmp_path, rank=1).reason == "not_restartable"


def test_without_a_journal_the_attempt_is_judged_alone() -> None:
    """journal_dir None: no history, no record: a first raise restarts."""
    assert decide_after(boom(), None, rank=0).action == "restart"
    assert last_decision(None) is None


def test_user_frame_is_the_innermost_outside_lifecycle() -> None:
    """The frame named is this test file's, where the error was raised."""
    frame = user_frame(boom())
    assert frame is not None and frame.file == str(Path(__file__).resolve()) and frame.function == "boom"


def test_show_prints_each_attempts_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``show`` prints, under each failed attempt, the job's decision and its reason, from its journal record."""
    for attempt in (0, 1):
        journal(tmp_path, 1, attempt)
        decide_after(boom(), tmp_path, rank=1)
    capsys.readouterr()
    assert show_main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    decided = [line.strip() for line in capsys.readouterr().out.splitlines() if "decision after attempt" in line]
    assert len(decided) == 2, decided
    assert decided[0].startswith("decision after attempt 0: restart (may_recover)")
    assert decided[1].startswith("decision after attempt 1: stop (reproducible)")


def test_the_rank_that_recorded_the_decision_journals_it_once_per_attempt(tmp_path: Path) -> None:
    """Two ranks decide two attempts: one ``decision`` record each, in the cause's journal, of the attempt's origin."""
    error = boom()
    for attempt in (0, 1):
        for rank in (0, 1):
            journal(tmp_path, rank, attempt)
        thread = threading.Thread(
            target=decide_after, args=(ConnectionError("Connection reset by peer"), tmp_path), kwargs={"rank": 0}
        )
        thread.start()
        decide_after(error, tmp_path, rank=1)
        thread.join(5)
    records = [r for r in read([tmp_path]) if isinstance(r, JobDecision)]
    assert [(r.origin.rank, r.origin.attempt, r.after_attempt) for r in records] == [(1, 0, 0), (1, 1, 1)]
    assert [(r.action, r.reason, r.exit_code) for r in records] == [
        ("restart", "may_recover", 1),
        ("stop", "reproducible", 93),
    ]
    assert records[1].details == {"step": 3, "exception": "RuntimeError"}
    assert records[1].line() == last_decision(tmp_path).line()  # type: ignore[union-attr]


class DictStore:
    """A store's few operations ``decide_after`` uses, over a dict (torch's ``TCPStore`` semantics)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.checks: dict[int, int] = {}  # by thread

    def set(self, key: str, value: str) -> None:
        with self.lock:
            self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        with self.lock:
            return self.data[key]

    def check(self, keys: list[str]) -> bool:
        with self.lock:
            self.checks[threading.get_ident()] = self.checks.get(threading.get_ident(), 0) + 1
            return all(key in self.data for key in keys)

    def add(self, key: str, value: int) -> int:
        with self.lock:
            now = int(self.data.get(key, b"0")) + value
            self.data[key] = str(now).encode()
            return now

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        with self.lock:
            if self.data.get(key, b"") == expected.encode():
                self.data[key] = desired.encode()
            return self.data[key]


class WaitingStore(DictStore):
    """``DictStore`` with torch's ``Store.wait``: woken as the keys are set, ``RuntimeError`` at the timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = threading.Condition(self.lock)

    def set(self, key: str, value: str) -> None:
        with self.changed:
            self.data[key] = value.encode()
            self.changed.notify_all()

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        with self.changed:
            if self.data.get(key, b"") == expected.encode():
                self.data[key] = desired.encode()
                self.changed.notify_all()
            return self.data[key]

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: all(k in self.data for k in keys), timeout.total_seconds()):
                raise RuntimeError("Socket Timeout")


def test_a_victim_waits_on_the_store_for_the_causes_decision_not_polling_it(tmp_path: Path) -> None:
    """A victim whose store can ``wait`` is woken by the cause's record: a read per 0.1 s at most, not one per
    20 ms (and the decision is the cause's)."""
    store = WaitingStore()
    journal(tmp_path, 1, 0)
    journal(tmp_path, 0, 0)
    seen: dict[int, Decision] = {}

    def victim() -> None:
        seen[0] = decide_after(ConnectionError("Connection reset by peer"), tmp_path, rank=0, store=store, wait_s=30)

    thread = threading.Thread(target=victim)
    began = time.monotonic()
    thread.start()
    time.sleep(0.4)
    seen[1] = decide_after(boom(), tmp_path, rank=1, store=store)
    thread.join(30)
    waited = time.monotonic() - began
    assert seen[0] == seen[1] and seen[0].cause == "raised", seen
    assert thread.ident is not None
    assert store.checks[thread.ident] <= waited / 0.1 + 4, (store.checks, waited)


def test_two_nodes_share_the_decision_through_the_store(tmp_path: Path) -> None:
    """Ranks on two nodes act on one decision, recorded once: in the store, each folder, the recorder's journal."""
    store = DictStore()
    node_a, node_b = tmp_path / "a", tmp_path / "b"
    error = boom()
    for attempt in (0, 1):
        journal(node_a, 1, attempt, host="node-a")
        journal(node_b, 0, attempt, host="node-b")
        seen: dict[int, Decision] = {}

        def victim(into: dict[int, Decision]) -> None:
            into[0] = decide_after(ConnectionError("Connection reset by peer"), node_b, rank=0, store=store)

        thread = threading.Thread(target=victim, args=(seen,))
        thread.start()
        seen[1] = decide_after(error, node_a, rank=1, store=store)
        thread.join(5)
        assert seen[0] == seen[1], seen
    assert seen[1].reason == "reproducible"
    for node in (node_a, node_b):
        assert len(list((node / DECISIONS).iterdir())) == 2
        assert json.loads((node / STOP_FILE).read_text())["reason"] == "reproducible"
    assert last_decision(None, store=store) == seen[1]
    assert store.get(f"lifecycle/decisions/{RUN}/count") == b"2"
    decided = [r for r in read([node_a, node_b]) if isinstance(r, JobDecision)]  # once per attempt, for the job
    assert [(r.origin.rank, r.after_attempt, r.reason) for r in decided] == [
        (1, 0, "may_recover"),
        (1, 1, "reproducible"),
    ]
    elsewhere = tmp_path / "c"  # a node whose ranks decided nothing (they died): a new worker's read mirrors them
    assert last_decision(elsewhere, store=store) == seen[1]
    assert len(list((elsewhere / DECISIONS).iterdir())) == 2 and (elsewhere / STOP_FILE).is_file()


def test_a_victim_that_knows_no_cause_names_no_culprit(tmp_path: Path) -> None:
    """A lost connection with no peer named: the culprit is unknown (never the victim itself)."""
    journal(tmp_path, 0, 0, cause=0, kind="connection_lost")
    decision = decide_after(ConnectionError("Connection reset by peer"), tmp_path, rank=0, wait_s=0.1)
    record = json.loads(next((tmp_path / DECISIONS).iterdir()).read_text())
    assert decision.action == "restart" and (record["attempt"]["rank"], record["attempt"]["host"]) == (None, "")


def test_join_round_counts_each_ranks_starts_in_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each global rank's n-th start is round n-1 whatever its agent's own count; it becomes the restart count."""
    from lifecycle._training.retry import join_round

    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    store = DictStore()
    assert [join_round(store, 0), join_round(store, 1), join_round(store, 1), join_round(store, 0)] == [0, 0, 1, 1]
    assert os.environ["TORCHELASTIC_RESTART_COUNT"] == "1"


HELD_SIGTERM = """
import os, signal, sys, threading
from pathlib import Path
sys.path[:0] = [{tests!r}]
from training.test_retry import journal
from lifecycle.lowlevel import decide_after

folder = Path({folder!r})
journal(folder, 1, 0)  # the cause raised and ended: the survivor waits wait_s for its record, which never comes
journal(folder, 0, 0)

def stop_when_held() -> None:
    while signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # decide_after has not started holding yet
        threading.Event().wait(0.001)
    os.kill(os.getpid(), signal.SIGTERM)  # torchrun's stop of a survivor, mid-decision

threading.Thread(target=stop_when_held, daemon=True).start()
decide_after(ConnectionError("Connection reset by peer"), folder, rank=0, wait_s=2.0)
print("returned", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_sigterm_while_deciding_is_delivered_after_the_decision_is_recorded(tmp_path: Path) -> None:
    """torchrun's SIGTERM landing mid-decision: the decision is recorded, then the SIGTERM kills the rank."""
    tests = str(Path(__file__).resolve().parents[1])
    script = HELD_SIGTERM.format(tests=tests, folder=str(tmp_path))
    env = {**os.environ, "LIFECYCLE_RUN_ID": RUN}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=50)
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "returned" not in done.stdout
    assert [p.name for p in (tmp_path / DECISIONS).iterdir()] == [f"{RUN}.0.0.json"]
    assert last_decision(tmp_path) is not None and last_decision(tmp_path).action == "restart"  # type: ignore[union-attr]


def test_the_decision_says_whether_the_cause_lives_on_every_rank(tmp_path: Path) -> None:
    """A peer's raise: both ranks' decisions say the cause lives (a retry here waits for no launcher's stop); a
    peer's death: they say it does not; neither is part of the record."""
    for attempt, kind, lives in ((0, "raised", True), (1, "died", False)):
        for rank in (0, 1):
            journal(tmp_path, rank, attempt, kind=kind)
        victim = decide_after(ConnectionError("Connection reset by peer"), tmp_path, rank=0, wait_s=0.2)
        cause = decide_after(boom(), tmp_path, rank=1) if kind == "raised" else victim
        assert (victim.cause, victim.cause_lives, cause.cause_lives) == (kind, lives, lives), (victim, cause)
        assert "cause" not in victim.to_json() and last_decision(tmp_path) == victim
    assert decide_after(boom(), None, rank=0).cause_lives  # judged alone: its own raise
