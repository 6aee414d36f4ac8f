"""The live failure notice: a failing rank tells its peers through the store; a later rank's error names the first.

Real gloo, two ranks (``tests/workers/failure_notice_worker.py`` runs every scenario in
one launch). Before issue 14 a peer's error carried no note and journals held no
``failure`` record: every multi-rank test here fails on that code, and the
single-process ones fail for want of ``lifecycle._torch.notice``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from support.launch import run_demo, run_workers
from support.processes import stop_process

from lifecycle._torch.notice import DEADLINE_S, publish, store_name
from lifecycle.journal import Failure, read
from lifecycle.journal.evidence import Kind
from lifecycle.lowlevel import Announcement

PEER_NOTE = (
    "lifecycle: rank 1 failed first (step 3, phase step): InjectedFault: injected failure at phase 'step' on rank 1, "
    "step 3"
)


@dataclass(frozen=True)
class Runs:
    """Where the worker's journals are, and each rank's report per scenario."""

    out: Path
    reports: dict[tuple[str, int], dict[str, Any]]

    def failures(self, scenario: str) -> dict[int, list[Failure]]:
        """Each rank's Failure records in ``scenario``'s journals."""
        found: dict[int, list[Failure]] = {0: [], 1: []}
        for record in read([self.out / scenario]):
            if isinstance(record, Failure):
                found[record.origin.rank].append(record)
        return found


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Both ranks run every scenario once; each must exit 0, having reported each scenario."""
    out = tmp_path_factory.mktemp("notices")
    reports: dict[tuple[str, int], dict[str, Any]] = {}
    for result in run_workers("failure_notice_worker", str(out), timeout_s=120):
        assert result.ok, str(result)
        for line in result.output.splitlines():
            if line.startswith('{"scenario"'):
                report = json.loads(line)
                reports[report["scenario"], report["rank"]] = report
    assert len(reports) == 8, reports
    return Runs(out, reports)


@pytest.mark.timeout(150)
def test_a_peers_error_and_journal_name_the_rank_that_failed_first(runs: Runs) -> None:
    """Rank 1 raises at step 3 (the demo's fault): rank 0's error and Failure record name rank 1, step and phase."""
    first, peer = runs.reports["peer", 1], runs.reports["peer", 0]
    assert first["error"].startswith("InjectedFault") and not any("failed first" in n for n in first["notes"])
    assert not peer["error"].startswith("InjectedFault") and PEER_NOTE in peer["notes"]
    failures = runs.failures("peer")
    (one,), (zero,) = failures[1], failures[0]
    assert (one.seq, one.first_rank, one.note, one.phase, one.step) == (1, None, "", "step", 3)
    assert (zero.seq, zero.first_rank, zero.note, zero.phase, zero.step) == (2, 1, PEER_NOTE, "step", 3)
    assert one.time <= zero.time


@pytest.mark.timeout(150)
def test_when_the_stores_host_failed_first_the_note_says_the_first_failure_is_unknown_and_why(runs: Runs) -> None:
    """Rank 0 hosted the store and is gone: rank 1's note says who cannot be known, naming the store and its host."""
    note = next(n for n in runs.reports["host_first", 1]["notes"] if n.startswith("lifecycle: which rank"))
    assert "hosted by rank 0, is unreachable: DistNetworkError" in note, note
    failures = runs.failures("host_first")
    (zero,), (one,) = failures[0], failures[1]
    assert zero.seq == 1 and zero.note == "" and zero.unpublished == ""
    assert one.seq is None and "unreachable" in one.unpublished and one.note == note and one.first_rank is None


@pytest.mark.timeout(150)
def test_two_ranks_failing_at_once_each_get_their_own_sequence_number(runs: Runs) -> None:
    """Both raise at step 3: distinct seqs 1 and 2; only the seq-2 rank's note names a first rank, the seq-1 one."""
    failures = runs.failures("together")
    records = sorted((r for rank in (0, 1) for r in failures[rank]), key=lambda r: r.seq or 0)
    assert [r.seq for r in records] == [1, 2] and len(failures[0]) == len(failures[1]) == 1
    earlier, later = records
    assert earlier.first_rank is None and earlier.note == ""
    assert later.first_rank == earlier.origin.rank
    assert later.note.startswith(f"lifecycle: rank {earlier.origin.rank} failed first (step 3, phase callback)")
    for rank in (0, 1):  # each its own error, not a peer's connection error
        assert runs.reports["together", rank]["error"] == f"RuntimeError: rank {rank} fails on its own at step 3"


@pytest.mark.timeout(150)
def test_a_run_without_failure_journals_no_failure_and_notes_nothing(runs: Runs) -> None:
    """Both ranks finish: no Failure record, no error."""
    assert runs.failures("clean") == {0: [], 1: []}
    assert runs.reports["clean", 0]["error"] is None and runs.reports["clean", 1]["error"] is None


def _server() -> Any:
    """A store server in this process, on a free loopback port."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported at runtime

    return TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)


def _client(port: int) -> Any:
    """A connected client of the server at ``port``, with the suite's group timeout."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported at runtime

    return TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False)


def _publish_to(store: Any) -> tuple[float, Announcement]:
    """Publish a notice through ``store``; return how long it took (s) and the announcement."""
    began = time.monotonic()
    told = publish(
        store, "lifecycle/g0/attempt-0", name=store_name(store, "rank 0"), rank=3, error=RuntimeError("boom"),
        phase="step", step=5, at=time.time(),
    )  # fmt: skip
    return time.monotonic() - began, told


@pytest.mark.timeout(30)
def test_a_notice_on_a_live_store_takes_milliseconds_and_a_later_one_names_the_first() -> None:
    """Two notices on a live store: seq 1 then 2, each well under 50 ms; the second names the first's rank."""
    server = _server()
    took_first, first = _publish_to(_client(server.port))
    took_second, second = _publish_to(_client(server.port))
    assert (first.seq, first.note, second.seq, second.first_rank) == (1, "", 2, 3)
    assert second.note == "lifecycle: rank 3 failed first (step 5, phase step): RuntimeError: boom"
    assert took_first < 0.05 and took_second < 0.05, (took_first, took_second)


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.value)
def test_every_kind_is_said_in_a_later_ranks_note(kind: Kind) -> None:
    """Notice 1 of each ``Kind``: a later rank's note says the kind's words (``Kind.words``; a raise by its error
    alone), as a cause or, for a consequence, as what notice 1 was: the notes need no branch of their own per kind."""
    server = _server()
    client = _client(server.port)
    prefix = "lifecycle/g0/attempt-0"
    first = {
        "rank": 0, "host": "h", "pid": 0, "phase": "step", "step": 41, "time": time.time(), "seq": 1,
        "error": "E: it failed", "kind": kind.value,
    }  # fmt: skip
    client.add(f"{prefix}/failures/count", 1)
    client.set(f"{prefix}/failures/1", json.dumps(first))
    _, told = _publish_to(client)
    words = "" if kind is Kind.RAISED else f"it {kind.words}" if not kind.consequence else f"which {kind.words}"
    assert words in told.note and "E: it failed" in told.note, told.note
    assert (told.first_rank is None) == kind.consequence, told


@pytest.mark.timeout(30)
def test_a_stale_unresponsive_notice_on_this_rank_is_never_failed_first() -> None:
    """Notice 1 is a peer's monitor naming rank 3 unresponsive (its own monitor was killed) while rank 3 trained on;
    rank 3's later failure does not read "rank 3 failed first": the note says notice 1 is stale (issue 37: the
    survivor blamed itself with a stale step)."""
    server = _server()
    client = _client(server.port)
    prefix = "lifecycle/g0/attempt-0"
    stale = {
        "rank": 3, "host": "h", "pid": 0, "phase": "step", "step": 1, "time": time.time(), "seq": 1,
        "error": "LivenessVerdict: rank 3 went unresponsive: its monitor has not beaten for 2.5 s",
        "kind": "unresponsive",
        "evidence": {"kind": "unresponsive", "rank": 3, "step": 1, "phase": "step", "decided_by": "neighbour"},
    }  # fmt: skip
    client.add(f"{prefix}/failures/count", 1)
    client.set(f"{prefix}/failures/1", json.dumps(stale))
    _, told = _publish_to(client)
    assert told.seq == 2 and told.first_rank is None, told
    assert "rank 3 failed first" not in told.note and "stale" in told.note, told.note


@pytest.mark.timeout(30)
def test_a_consequence_as_notice_1_is_not_named_first_and_the_note_says_why() -> None:
    """Notice 1 is rank 0's timed-out receive (typed ``collective_timeout``): a later rank's note says it is a
    consequence, in the kind's words, and names nobody first."""
    server = _server()
    client = _client(server.port)
    prefix = "lifecycle/g0/attempt-0"
    victim = {
        "rank": 0, "host": "h", "pid": 0, "phase": "step", "step": 41, "time": time.time(), "seq": 1,
        "error": "RuntimeError: Timed out waiting 30000ms for recv operation to complete", "kind": "collective_timeout",
    }  # fmt: skip
    client.add(f"{prefix}/failures/count", 1)
    client.set(f"{prefix}/failures/1", json.dumps(victim))
    _, told = _publish_to(client)
    assert told.first_rank is None and "rank 0 failed first" not in told.note, told
    assert "rank 0's, which timed out waiting for a peer" in told.note and "never its cause" in told.note, told.note


@pytest.mark.timeout(30)
def test_publishing_through_a_store_whose_server_was_shut_down_is_bounded_and_never_raises() -> None:
    """The server is gone (its host failed): back at once (measured: about 1 ms), unpublished, and why."""
    server = _server()
    client = _client(server.port)
    del server
    took, told = _publish_to(client)
    assert took < 1.0 and told.seq is None
    assert "hosted by rank 0, is unreachable: DistNetworkError" in told.unpublished and "unknown" in told.note


@pytest.mark.timeout(60)
def test_publishing_through_a_store_whose_server_is_frozen_gives_up_at_the_deadline() -> None:
    """A server alive but frozen (SIGSTOP), where store operations wait forever: publish returns at DEADLINE_S."""
    code = (
        "from datetime import timedelta; import time; from torch.distributed import TCPStore; "
        "s = TCPStore('127.0.0.1', 0, 1, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False); "
        "print(s.port, flush=True); time.sleep(120)"
    )
    host = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert host.stdout is not None
        client = _client(int(host.stdout.readline()))
        stop_process(host.pid)
        took, told = _publish_to(client)
    finally:
        host.kill()  # its death releases the notice's thread, left waiting on it
        host.wait(10)
    assert DEADLINE_S <= took < 1.0 and told.seq is None and "did not answer within 250 ms" in told.unpublished, (
        took,
        told,
    )


@pytest.mark.timeout(30)
def test_actions_without_a_group_of_their_own_publish_nothing_and_say_why() -> None:
    """TorchActions before any group: no notice, no exception, the reason given."""
    from lifecycle import DistributedConfig, ParallelConfig, TorchActions

    actions = TorchActions(DistributedConfig(world_size=1, rank=0), ParallelConfig())
    told = actions.announce_failure(RuntimeError("early"), phase="uninitialized", step=None, time=time.time())
    assert told.seq is None and "before its process group existed" in told.unpublished and told.note == ""


@pytest.mark.slow  # 8-14 s here: with the worker's runs, past the budget of the quick suite
@pytest.mark.timeout(300)
def test_the_demo_leaves_the_note_in_rank_0s_journal(tmp_path: Path) -> None:
    """``demo --fail-at step --fail-rank 1`` (torchrun's agent serves the store): rank 0's Failure names rank 1."""
    journals = tmp_path / "journals"
    done = run_demo(
        "--fail-at", "step", "--fail-rank", "1", "--steps", "20", "--journal-dir", str(journals),
        timeout=240, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    failures = {r.origin.rank: r for r in read([journals]) if isinstance(r, Failure)}
    assert failures[1].seq == 1 and failures[1].first_rank is None
    assert failures[0].first_rank == 1 and failures[0].note.startswith("lifecycle: rank 1 failed first (step 10")


def _page_with_a_verdict_after(delay_s: float, rank: int) -> Any:
    """A rank's page reader whose liveness verdict (naming ``rank``) appears ``delay_s`` after the first read."""
    began: list[float] = []

    def read_page() -> dict[str, object] | None:
        began.append(began[0] if began else time.monotonic())
        if time.monotonic() - began[0] < delay_s:
            return None
        return {"rank": rank, "note": f"rank {rank} died at step 5"}

    return read_page


GLOO_RESET = "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:39138"


@pytest.mark.parametrize(
    ("error", "waits"),
    [
        (RuntimeError("injected failure at phase 'step'"), False),
        (ValueError("bad batch"), False),
        (RuntimeError(GLOO_RESET.removeprefix("RuntimeError: ")), True),
        (RuntimeError("NCCL communicator was aborted on rank 1"), True),
    ],
    ids=["own-raise", "own-value-error", "gloo-reset", "nccl-abort"],
)
def test_a_failure_of_its_own_does_not_wait_for_a_verdict_and_one_from_communication_does(
    error: BaseException, waits: bool
) -> None:
    """Notice 1 with a monitor running: a raise of the rank's own returns at once (no verdict can name another);
    an error from communication waits for the verdict, which names the dead peer."""
    from lifecycle._torch import notice

    prefix = f"lifecycle/g0/attempt-{error.__class__.__name__}-{waits}-{id(error)}"
    server = _server()
    client = _client(server.port)
    mine = notice.FailureNotice(0, "h", 1, "step", 5, notice.describe(error), time.time(), seq=0)
    began = time.monotonic()
    told = notice._publish(
        client, prefix, "the store", mine, 2.0, None, _page_with_a_verdict_after(0.3, 1), notice._own(error)
    )
    took = time.monotonic() - began
    assert told.seq == 1
    if waits:
        assert told.first_rank == 1 and took >= 0.3, (told, took)
    else:
        assert told.first_rank is None and took < 0.3, (told, took)


def test_a_raise_from_a_communication_error_is_not_its_ranks_own() -> None:
    """An error raised while handling (or from) a torch.distributed error is never taken for a rank's own."""
    from torch.distributed import DistBackendError

    from lifecycle._torch import notice

    try:
        try:
            raise DistBackendError("recv failed")
        except DistBackendError:
            raise ValueError("the batch could not be gathered") from None
    except ValueError as exc:
        suppressed = exc
    try:
        try:
            raise DistBackendError("recv failed")
        except DistBackendError as inner:
            raise ValueError("the batch could not be gathered") from inner
    except ValueError as exc:
        chained = exc
    assert not notice._own(chained)
    assert not notice._own(suppressed)  # ``from None`` hides its context from the traceback, not from the rule
    assert not notice._own(DistBackendError("anything"))
    assert notice._own(KeyboardInterrupt())


@pytest.mark.parametrize(
    ("first_error", "first_kind", "names"),
    [
        ("InjectedFault: injected failure at phase 'step' on rank 1, step 5", "raised", 1),
        ("DistBackendError: NCCL communicator was aborted", "raised", 2),
        ("InjectedFault: injected failure", "died", 2),
    ],
    ids=["own-raise", "communication", "not-a-raise"],
)
def test_a_later_rank_names_notice_1_at_once_when_it_is_its_ranks_own(
    first_error: str, first_kind: str, names: int
) -> None:
    """Notice 2, with a verdict naming rank 2 on its way: notice 1 of a raise of rank 1's own is named at once;
    one from communication, or of another kind, waits for the verdict (which names rank 2)."""
    from lifecycle._torch import notice

    server = _server()
    client = _client(server.port)
    prefix = f"lifecycle/g0/attempt-later-{first_kind}-{names}"
    first = {
        "rank": 1, "host": "h", "pid": 0, "phase": "step", "step": 5, "time": time.time(), "seq": 1,
        "error": first_error, "kind": first_kind,
    }  # fmt: skip
    client.add(f"{prefix}/failures/count", 1)
    client.set(f"{prefix}/failures/1", json.dumps(first))
    mine = notice.FailureNotice(0, "h", 1, "step", 5, GLOO_RESET, time.time(), seq=0)
    began = time.monotonic()
    told = notice._publish(client, prefix, "the store", mine, 2.0, None, _page_with_a_verdict_after(0.3, 2), False)
    took = time.monotonic() - began
    assert told.seq == 2 and told.first_rank == names, told
    assert (took < 0.3) == (names == 1), took
