"""Collective positions (issue 40): what the rank writes, what the summary concludes, what the monitor convicts.

The summary's rule is pure (beats in, ranks stuck outside out); the wrappers run on a real
two-rank gloo group; the monitor convicts a real sleeping process from the page and the store.
"""

from __future__ import annotations

import json
import mmap
import subprocess
import sys
import time

import pytest
from support.stores import settled_set

from lifecycle._liveness import monitor, summary
from lifecycle._liveness.page import read_collectives, read_verdict, write_verdict
from lifecycle._liveness.rank import Marks
from lifecycle._liveness.settings import Settings


def _beat(count: int, *groups: tuple[str, str, int, int], done: bool = False) -> bytes:
    """A beat at ``count`` of attempt 0 with ``groups``: (key, label, entered, left) each, entered 100.0 (wall)."""
    positions = [[key, label, entered, left, "all_reduce", 256, False, 100.0] for key, label, entered, left in groups]
    return json.dumps([1, count, 0, 30, "step", "done" if done else "", positions]).encode()


DP, TP = ("1", "data-parallel"), ("2", "tensor-parallel")


def test_a_rank_in_no_collective_while_its_peer_waits_in_one_it_has_not_entered_is_stuck_outside() -> None:
    """Rank 1 left all_reduce #40 and entered nothing; rank 0 waits in #41: rank 1 is named, never rank 0."""
    beats = [_beat(12, (*DP, 41, 40)), _beat(12, (*DP, 40, 40))]
    found = summary.in_the_step(beats, 12, 0)
    assert list(found) == [1]
    assert found[1] == summary.Outside("1", "data-parallel", "all_reduce", 41, [0], 100.0)
    assert "before all_reduce #41 of the data-parallel group, which rank(s) 0 entered 5.0 s ago" in found[1].why(
        "step 30, phase step", 105.0
    )


@pytest.mark.parametrize(
    "beats",
    [
        [_beat(12, (*DP, 41, 40)), _beat(12, (*DP, 41, 40))],  # both inside #41: level, waiting on each other
        [_beat(12, (*DP, 41, 41)), _beat(12, (*DP, 40, 40))],  # the peer is past #41, not waiting in it
        [_beat(12, (*DP, 41, 40)), _beat(12, (*DP, 40, 40), done=True)],  # a rank is done: a failure is out
        [_beat(12, (*DP, 41, 40)), _beat(11, (*DP, 40, 40))],  # below in marks: the count of marks decides
        [_beat(12, (*DP, 41, 40)), _beat(12, (*DP, 40, 40), ("9", "default", 7, 6))],  # inside another group
        [_beat(12, (*DP, 41, 40)), None],  # a rank never beat
    ],
    ids=["both-inside", "peer-not-waiting", "a-rank-done", "below-in-marks", "inside-elsewhere", "missing-beat"],
)
def test_no_rank_is_stuck_outside_without_a_waiting_peer_ahead_of_it_and_everyone_level(
    beats: list[bytes | None],
) -> None:
    """Ranks waiting on each other, a peer not waiting, a rank done, below or missing, a rank inside another
    group's collective: nobody is stuck outside."""
    assert summary.in_the_step(beats, 12, 0) == {}


def _asleep(beat: bytes, state: str = "S") -> bytes:
    """``beat`` with its rank's ``/proc`` state letter."""
    return json.dumps([*json.loads(beat), state]).encode()


@pytest.mark.parametrize(
    ("states", "named"),
    [(("S", "S", "D"), [0, 1, 2]), (("S", "T", "S"), []), (("S", "R", "S"), []), (("S", "", "S"), [])],
    ids=["all-asleep", "one-stopped", "one-running", "one-unknown"],
)
def test_a_collective_every_rank_entered_and_none_left_hangs_them_all(
    states: tuple[str, ...], named: list[int]
) -> None:
    """Three ranks inside all_reduce #41 of one group, all asleep in it: each is named ``collective_hang`` (each
    monitor releases its own rank); one stopped or running (its own monitor names it), or of unknown state: none."""
    beats = [_asleep(_beat(12, (*DP, 41, 40)), state) for state in states]
    found = summary.in_the_step(beats, 12, 0)
    assert sorted(found) == named, found
    for rank in named:
        assert found[rank].kind == "collective_hang" and found[rank].peers == [r for r in range(3) if r != rank]


def test_a_blind_group_never_convicts() -> None:
    """A group whose counter ran ahead of the wrappers (blind) on either side names nobody."""
    blind = json.loads(_beat(12, (*DP, 40, 40)))
    blind[6][0][6] = True
    assert summary.in_the_step([_beat(12, (*DP, 41, 40)), json.dumps(blind).encode()], 12, 0) == {}
    waiting = json.loads(_beat(12, (*DP, 41, 40)))
    waiting[6][0][6] = True
    assert summary.in_the_step([json.dumps(waiting).encode(), _beat(12, (*DP, 40, 40))], 12, 0) == {}


def test_the_innermost_group_is_named_tensor_parallel_before_data_parallel() -> None:
    """TP2 x DP2 (tensor-parallel pairs 0-1 and 2-3): rank 3 stuck in its forward before the tensor-parallel
    all_reduce rank 2 waits in, while rank 1 waits in the data-parallel one rank 3 never reached: rank 3 is named
    with the tensor-parallel group and rank 2 (not the data-parallel group, of the same size); nobody else is."""
    dp_a, dp_b, tp_a, tp_b = ("1", "data-parallel"), ("3", "data-parallel"), ("4", "tensor-parallel"), TP
    beats = [
        _beat(12, (*dp_a, 9, 8), (*tp_a, 20, 20)),
        _beat(12, (*dp_b, 9, 8), (*tp_a, 20, 20)),
        _beat(12, (*dp_a, 8, 8), (*tp_b, 21, 20)),
        _beat(12, (*dp_b, 8, 8), (*tp_b, 20, 20)),
    ]
    found = summary.in_the_step(beats, 12, 0)
    assert list(found) == [3] and found[3].label == "tensor-parallel" and found[3].peers == [2]


def _op(beat: bytes, group: int, op: str, fingerprint: int) -> bytes:
    """``beat`` with its ``group``-th position's op and fingerprint replaced."""
    fields = json.loads(beat)
    fields[6][group][4:6] = [op, fingerprint]
    return json.dumps(fields).encode()


def test_a_rank_waiting_where_its_peer_never_entered_while_the_peer_waits_where_it_never_entered_is_a_desync() -> None:
    """Rank 1 skipped all_reduce #41 of the data-parallel group and waits in #8 of the default group; rank 0 waits
    in the data-parallel #41: each waits for the other. The one in the outer group (the default) is named."""
    default = ("9", "default")
    beats = [_beat(12, (*DP, 41, 40), (*default, 7, 7)), _beat(12, (*DP, 40, 40), (*default, 8, 7))]
    found = summary.in_the_step(beats, 12, 0)
    assert list(found) == [1] and found[1].kind == "desync" and found[1].label == "default", found
    assert found[1].peers == [0] and "all_reduce #41 of the data-parallel group" in found[1].theirs
    assert "which rank(s) 0 never entered" in found[1].why("step 30, phase step", 105.0)


def _sited(beat: bytes, *sites: str) -> bytes:
    """``beat`` with each group's position carrying the call site ``sites[i]`` (as ``summary.beat_positions``)."""
    fields = json.loads(beat)
    for position, site in zip(fields[6], sites, strict=True):
        position.append(site)
    return json.dumps(fields).encode()


def test_a_verdict_inside_the_step_ends_with_where_each_side_called_its_collective() -> None:
    """Stuck outside: where the waiting peer called the collective it waits in; a desync: where each side called
    the collective it waits in; a beat without sites (an older monitor's) names none."""
    stuck = [_sited(_beat(12, (*DP, 41, 40)), "_training/pretrain.py:550 in <lambda>"), _beat(12, (*DP, 40, 40))]
    found = summary.in_the_step(stuck, 12, 0)[1]
    assert (
        found.sites == "all_reduce #41 of the data-parallel group at _training/pretrain.py:550 in <lambda> by rank(s) 0"
    )
    assert found.why("step 30, phase step", 105.0).endswith(f"wait in; called: {found.sites}")
    default = ("9", "default")
    desync = [
        _sited(_beat(12, (*DP, 41, 40), (*default, 7, 7)), "a.py:3 in average", "a.py:9 in loss"),
        _sited(_beat(12, (*DP, 40, 40), (*default, 8, 7)), "a.py:3 in average", "a.py:9 in loss"),
    ]
    found = summary.in_the_step(desync, 12, 0)[1]
    assert found.sites == (
        "all_reduce #41 of the data-parallel group at a.py:3 in average by rank(s) 0; "
        "all_reduce #8 of the default group at a.py:9 in loss by rank(s) 1"
    )
    unsited = summary.in_the_step([_beat(12, (*DP, 41, 40)), _beat(12, (*DP, 40, 40))], 12, 0)[1]
    assert unsited.sites == "" and "called:" not in unsited.why("step 30, phase step", 105.0)


def test_a_desync_names_every_peer_on_the_other_side() -> None:
    """Four ranks: rank 3 waits in the default group's #8, ranks 0-2 in the data-parallel #41 it skipped: rank 3 is
    named with all three, none of them is named."""
    default = ("9", "default")
    waiting = _beat(12, (*DP, 41, 40), (*default, 7, 7))
    found = summary.in_the_step([waiting] * 3 + [_beat(12, (*DP, 40, 40), (*default, 8, 7))], 12, 0)
    assert list(found) == [3] and found[3].peers == [0, 1, 2], found


@pytest.mark.parametrize(
    ("op", "fingerprint", "desync"),
    [
        ("broadcast", 256, True),  # another op at the same sequence number
        ("all_reduce", 512, True),  # the same op on a tensor of another size: sizes must match
        ("all_reduce", 256, False),  # the same op and size: level, waiting on each other
        ("all_gather_object", 0, False),  # object collectives issue several ops: never compared
    ],
    ids=["other-op", "other-size", "same", "object"],
)
def test_ranks_inside_the_same_collective_number_with_another_op_or_size_are_a_desync(
    op: str, fingerprint: int, desync: bool
) -> None:
    """Three ranks inside all_reduce #41 of one group, the last with ``op``/``fingerprint``: the odd one is named
    when its op or size differs (never for an object collective), nobody when they agree."""
    beats = [_beat(12, (*DP, 41, 40)), _beat(12, (*DP, 41, 40)), _op(_beat(12, (*DP, 41, 40)), 0, op, fingerprint)]
    found = summary.in_the_step(beats, 12, 0)
    assert list(found) == ([2] if desync else []), found
    if desync:
        assert found[2].kind == "desync" and found[2].peers == [0, 1], found


def test_an_uneven_all_to_all_is_no_desync() -> None:
    """all_to_all_single with different sizes on two ranks (uneven splits are legitimate): nobody is named."""
    beats = [_op(_beat(12, (*DP, 41, 40)), 0, "all_to_all_single", 256), _op(_beat(12, (*DP, 41, 40)), 0,
             "all_to_all_single", 999)]  # fmt: skip
    assert summary.in_the_step(beats, 12, 0) == {}


def test_the_summary_carries_who_is_outside_through_the_store() -> None:
    """``Summary.encode``/``decode`` keep the ranks stuck outside (the other ranks at the count read them)."""
    found = summary.summarize([_beat(12, (*DP, 41, 40)), _beat(12, (*DP, 40, 40))], 0, 12, 0)
    assert summary.Summary.decode(found.encode()) == found and 1 in found.outside


def test_the_page_carries_each_groups_position_to_the_monitor() -> None:
    """``Marks.slot``/``collective`` write what ``read_collectives`` reads back, slot by slot."""
    marks = Marks()
    try:
        with open(marks.path, "r+b") as file:
            page = mmap.mmap(file.fileno(), monitor.PAGE_SIZE)
        first, second = marks.slot("0", "default", 3), marks.slot("1", "data-parallel", 0)
        marks.collective(second, 5, 4, 1000 << 8 | 1, 1 | 1 << 8)
        found = read_collectives(page)
        assert [(c.key, c.label, c.entered, c.left, c.inside, c.blind) for c in found] == [
            ("0", "default", 3, 3, False, False),
            ("1", "data-parallel", 5, 4, True, True),
        ]
        assert (first, found[1].op, found[1].fingerprint) == (0, "all_reduce", 1000 << 8 | 1)
        page.close()
    finally:
        marks.close()


def test_a_verdict_too_long_for_the_page_is_made_to_fit_as_json_not_cut() -> None:
    """A verdict over the page's 2 KB (call sites of many ranks, a long note) loses its evidence's sites, then the
    note's end: the rank still reads its kind, evidence and the start of the note; a short one is kept whole."""
    marks = Marks()
    try:
        with open(marks.path, "r+b") as file:
            page = mmap.mmap(file.fileno(), monitor.PAGE_SIZE)
        evidence = {"kind": "desync", "rank": 3, "peers": [0, 1, 2], "sites": "x.py:1 in f by rank(s) 0; " * 60}
        long = {
            "rank": 3,
            "kind": "desync",
            "note": "rank 3 went past a collective " + "w" * 3000,
            "evidence": evidence,
        }
        write_verdict(page, json.dumps(long).encode())
        found = read_verdict(page)
        assert found is not None and found["kind"] == "desync" and found["evidence"]["peers"] == [0, 1, 2]
        assert "sites" not in found["evidence"] and str(found["note"]).startswith("rank 3 went past a collective ")
        assert str(found["note"]).endswith("…")
        short = {"rank": 3, "kind": "desync", "note": "short", "evidence": {"sites": "x.py:1 in f"}}
        write_verdict(page, json.dumps(short).encode())
        assert read_verdict(page) == short
        page.close()
    finally:
        marks.close()


def _watcher(port: int, marks: Marks, pid: int) -> monitor.Monitor:
    """Rank 1's monitor of a 2-rank world on the store at ``port``, watching ``pid``, a 1 s deadline on ``step``."""
    with open(marks.path, "r+b") as file:
        page = mmap.mmap(file.fileno(), monitor.PAGE_SIZE)
    settings = Settings(
        rank=1, world_size=2, pid=pid, host="127.0.0.1", port=port, prefix="p",
        interval_s=0.25, floor_s=1.0, default_deadline_s=600.0, deadlines=(("step", 1.0),), mode="report",
        stacks="/dev/null", store_timeout_s=0.5, conviction_floor_s=2.0,
    )  # fmt: skip
    return monitor.Monitor(settings, page, wake=-1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("enters", [False, True], ids=["stays-outside", "enters-before-conviction"])
def test_a_sleeping_rank_outside_the_collective_its_peer_waits_in_is_convicted_unless_it_enters(enters: bool) -> None:
    """Suspected past its deadline, convicted at the conviction deadline with the group, collective and peer as
    typed evidence; a rank that enters the collective meanwhile is withdrawn, never convicted."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    marks = Marks()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        marks.mark("step", 30)
        slot = marks.slot("1", "data-parallel", 40)
        watcher = _watcher(server.port, marks, sleeper.pid)
        position = monitor.read_marks(watcher.page)
        watcher.observe(position, now=0.0)
        assert watcher.beat(position)
        peer = [5, position.count, position.attempt, 30, "step", "", [["1", "data-parallel", 41, 40, "all_reduce", 0,
                                                                        False, time.time() - 3.0]]]  # fmt: skip
        settled_set(server, "p/liveness/hb/0", json.dumps(peer))
        deadline = time.monotonic() + 5.0
        while monitor.process_state(sleeper.pid) != "S" and time.monotonic() < deadline:
            time.sleep(0.01)
        watcher.classify(position, now=1.5)  # past the 1 s deadline: suspected
        assert watcher.suspect is not None and watcher.suspect.kind is monitor.Kind.STUCK_OUTSIDE
        assert not watcher.judged
        if enters:
            marks.collective(slot, 41, 40, 0, 1)
        watcher.classify(position, now=2.5)  # past the 2 s conviction floor
        assert watcher.judged is not enters
        if enters:
            assert watcher.suspect is None and server.add("p/failures/count", 0) == 0
            # A later suspicion of another kind carries none of the withdrawn one's collective evidence.
            spinning = watcher.facts(monitor.Kind.SPINNING, position, "R", 3.0, 1.0)
            assert (spinning.group, spinning.collective, spinning.peers) == ("", "", ())
        else:
            notice = json.loads(server.get("p/failures/1"))
            assert notice["kind"] == "stuck_outside", notice
            assert (notice["evidence"]["group"], notice["evidence"]["collective"], notice["evidence"]["peers"]) == (
                "the data-parallel group",
                "all_reduce #41",
                [0],
            )
            assert "before all_reduce #41 of the data-parallel group, which rank(s) 0 entered" in notice["error"]
        watcher.page.close()
    finally:
        sleeper.kill()
        sleeper.wait()
        marks.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("silent", [True, False], ids=["neighbour-silent", "neighbour-beats"])
def test_a_rank_waiting_in_a_collective_with_a_silent_neighbour_is_released_at_the_conviction_deadline(
    silent: bool,
) -> None:
    """Asleep inside all_reduce #41 of a group its neighbour is in, the neighbour's monitor silent (a partition):
    ``collective_hang``, convicted at the conviction deadline; with the neighbour's monitor beating, nothing."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    server = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    marks = Marks()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        marks.mark("step", 30)
        slot = marks.slot("1", "data-parallel", 40)
        marks.collective(slot, 41, 40, 0, 1)  # inside all_reduce #41
        watcher = _watcher(server.port, marks, sleeper.pid)
        position = monitor.read_marks(watcher.page)
        watcher.observe(position, now=0.0)
        watcher.neighbour = 0
        watcher.neighbour_beat = json.dumps(
            [5, position.count, 0, 30, "step", "", [["1", "data-parallel", 41, 40, "all_reduce", 0, False, 1.0]]]
        ).encode()
        watcher.neighbour_suspected = silent
        deadline = time.monotonic() + 5.0
        while monitor.process_state(sleeper.pid) != "S" and time.monotonic() < deadline:
            time.sleep(0.01)
        watcher.classify(position, now=2.5)  # past the 2 s conviction floor
        assert watcher.judged is silent
        if silent:
            notice = json.loads(server.get("p/failures/1"))
            assert notice["kind"] == "collective_hang" and notice["evidence"]["peers"] == [0], notice
            assert "whose monitor has been silent" in notice["error"], notice
        watcher.page.close()
    finally:
        sleeper.kill()
        sleeper.wait()
        marks.close()


def _members(beats: list[bytes]) -> dict[str, list[tuple[int, summary.Seen]]]:
    """Each group's positions in ``beats``, by rank (as ``summary.in_the_step`` gathers them)."""
    members: dict[str, list[tuple[int, summary.Seen]]] = {}
    for rank, beat in enumerate(beats):
        for position in summary.collectives(json.loads(beat)):
            members.setdefault(position.key, []).append((rank, position))
    return members


@pytest.mark.parametrize(
    ("op", "fingerprint", "words"),
    [
        (
            "all_reduce",
            255 << 8 | 1,
            "rank(s) 0 called all_reduce on 256 float32 elements, this rank all_reduce on 2",
        ),
        ("broadcast", 1, "rank(s) 0 called all_reduce on 256 float32 elements, this rank broadcast on 0 float32"),
        ("all_reduce", 256 << 8 | 1, ""),  # the same op and size: it died of something else
        ("all_gather_object", 0, ""),  # object collectives are never compared
    ],
    ids=["other-size", "other-op", "same", "object"],
)
def test_a_rank_that_died_inside_a_collective_its_peer_entered_with_another_size_died_of_a_desync(
    op: str, fingerprint: int, words: str
) -> None:
    """Rank 1 died inside all_reduce #41 (gloo aborts the rank that receives more than its tensor holds): when rank 0
    entered #41 with another size or op, ``mismatched`` says so, with both sides' tensors; else None."""
    beats = [_op(_beat(12, (*DP, 41, 40)), 0, "all_reduce", 256 << 8 | 1), _op(_beat(12, (*DP, 41, 40)), 0, op,
             fingerprint)]  # fmt: skip
    members = _members(beats)
    mine = [position for rank, position in members[DP[0]] if rank == 1]
    found = summary.mismatched(1, mine, members)
    if not words:
        assert found is None
        return
    assert found is not None and found.kind == "desync" and found.peers == [0] and found.number == 41, found
    assert found.theirs.startswith(words), found.theirs


def test_a_rank_that_died_inside_a_collective_its_peers_had_not_reached_names_no_desync() -> None:
    """A peer whose beat still shows #40 (not yet at #41) or that left #41 with the same size is no evidence."""
    beats = [_beat(12, (*DP, 40, 40)), _beat(12, (*DP, 41, 40))]
    members = _members(beats)
    assert summary.mismatched(1, [p for r, p in members[DP[0]] if r == 1], members) is None


class _Beats:
    """A recording double of the monitor's store client: ``multi_get`` returns fixed beats, and counts its calls."""

    def __init__(self, beats: list[bytes | None]) -> None:
        self.beats, self.reads = beats, 0

    def multi_get(self, keys: list[str]) -> list[bytes | None]:
        self.reads += 1
        return self.beats[: len(keys)]


@pytest.mark.parametrize(("fingerprint", "desync"), [(256 << 8 | 1, True), (255 << 8 | 1, False)])
def test_a_rank_dead_inside_a_collective_is_judged_once_its_groups_peers_show_it(
    fingerprint: int, desync: bool
) -> None:
    """Rank 1 died inside all_reduce #41 of a group it shares with rank 0 only; rank 2's beat has no such group.
    ``died_inside`` names the desync when rank 0 entered #41 with another size, None when with the same, and in
    both cases returns on its first read: rank 2 is not awaited (the interval is 5 s)."""
    from types import SimpleNamespace

    from lifecycle._liveness import neighbour

    marks = Marks()
    try:
        slot = marks.slot("1", "data-parallel", 40)
        marks.collective(slot, 41, 40, 255 << 8 | 1, 1)  # all_reduce (code 1) on 255 float32
        with open(marks.path, "r+b") as file:
            page = mmap.mmap(file.fileno(), monitor.PAGE_SIZE)
        peer = [[1, 12, 0, 30, "step", "", [["1", "data-parallel", 41, 40, "all_reduce", fingerprint, False, 1.0]]]]
        other = [[1, 12, 0, 30, "step", "", [["7", "tensor-parallel", 3, 3, "all_reduce", 256, False, 1.0]]]]
        store = _Beats([json.dumps(peer[0]).encode(), None, json.dumps(other[0]).encode()])
        settings = SimpleNamespace(world_size=3, rank=1, prefix="p", interval_s=5.0)
        last = monitor.Position(12, 0, 30, "step")
        watcher = SimpleNamespace(page=page, entered_at={}, s=settings, store=store, about={}, last=last)
        started = time.monotonic()
        found = neighbour.died_inside(watcher)
        assert store.reads == 1 and time.monotonic() - started < 2.0
        assert (found is not None) == desync, found
        if desync:
            assert found is not None and found.peers == [0] and watcher.about["collective"] == "all_reduce #41"
        page.close()
    finally:
        marks.close()


def test_a_rank_dead_inside_a_collective_waits_for_a_peer_whose_beat_is_from_before() -> None:
    """Rank 0's beat is from its setup (no group yet: its monitor beats once a second, the demo's steps take
    milliseconds): rank 1's monitor reads again until the two intervals pass, and names no desync on that beat."""
    from types import SimpleNamespace

    from lifecycle._liveness import neighbour

    marks = Marks()
    try:
        slot = marks.slot("1", "data-parallel", 40)
        marks.collective(slot, 41, 40, 255 << 8 | 1, 1)
        with open(marks.path, "r+b") as file:
            page = mmap.mmap(file.fileno(), monitor.PAGE_SIZE)
        setup = [1, 4, 0, None, "setup", "", [["0", "default", 0, 0, "", 0, False, 1.0]]]
        store = _Beats([json.dumps(setup).encode(), None])
        settings = SimpleNamespace(world_size=2, rank=1, prefix="p", interval_s=0.1)
        last = monitor.Position(404, 0, 100, "step")
        watcher = SimpleNamespace(page=page, entered_at={}, s=settings, store=store, about={}, last=last)
        assert neighbour.died_inside(watcher) is None and store.reads > 1
        page.close()
    finally:
        marks.close()
