"""The demo's hang inside the training step, end to end (issues 37 and 40).

``--fault hang --fail-at step``: the hung rank sleeps inside its step (after its backward,
before the data-parallel all_reduce of its gradients), level with its peers in marks. Its
peers enter the all_reduce and wait. With liveness on, the collective positions name it
(issue 40): stuck before all_reduce #k of the data-parallel group, which its peers entered,
convicted at the conviction deadline, never a victim. With liveness off, nothing can name
it: the peer's receive times out, and no view may call the victim the cause (issue 37).
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from support.launch import run_demo

from lifecycle.journal import Failure, Record, RunEnd, Verdict, read

INTERVAL_S = 1.0
FLOOR_S = 10.0
"""The demo's defaults: a 1 s interval, a 30 s group timeout, so a 10 s conviction floor."""


def _when(record: Record) -> float:
    """When ``record`` was written (its end, time or start, whichever it has)."""
    for name in ("end", "time", "start"):
        value = getattr(record, name, None)
        if isinstance(value, float):
            return value
    return 0.0


def _hung_in_the_step(
    tmp_path: Path,
    nproc: int,
    hung: int,
    tp: int = 1,
    group: str = "data-parallel",
    peers: set[int] | None = None,
    fault: str = "hang",
) -> None:
    """Run the demo at its defaults with rank ``hung`` of ``nproc`` (tensor-parallel ``tp``) hung in its forward
    (or, ``fault`` ``desync``, skipping its gradient all_reduce); check the verdict (``group`` named, with
    ``peers``: by default every other rank) and the bound: every rank failed within the conviction deadline + 2
    intervals + 2 s of the faulty rank's last record."""
    args = [
        *("--nproc", str(nproc), "--tp", str(tp), "--steps", "200", "--fail-at", "step", "--fault", fault),
        *("--fail-rank", str(hung), "--eval-interval", "0", "--journal-dir", str(tmp_path)),
    ]
    done = run_demo(*args, timeout=280, cwd=tmp_path)
    out = done.stdout[-4000:]
    assert done.returncode != 0, out
    records = read([tmp_path])
    verdicts = [r for r in records if isinstance(r, Verdict)]
    assert verdicts and {v.culprit for v in verdicts} == {hung}, (verdicts, out)
    facts = verdicts[0].evidence
    kind = "desync" if fault == "desync" else "stuck_outside"
    assert facts.kind == kind and facts.group == f"the {group} group", (facts, out)
    assert re.fullmatch(r"all_reduce #\d+", facts.collective), (facts, out)
    assert set(facts.peers) == (peers if peers is not None else set(range(nproc)) - {hung}), (facts, out)
    # Where the collectives were called: the one named (the peers' for stuck_outside, its own for a desync), and
    # for a desync the data-parallel all_reduce its peers wait in too.
    assert f"{facts.collective} of the {group} group at " in facts.sites, (facts, out)
    assert re.search(r"\.py:\d+ in \S+ by rank\(s\) \d", facts.sites), (facts, out)
    assert fault != "desync" or "of the data-parallel group at _training/pretrain.py:" in facts.sites, (facts, out)
    fault_at = max(_when(r) for r in records if r.origin.rank == hung and not isinstance(r, Verdict))
    # When each rank failed: its failure record (written before its teardown), else its end, else (killed by its
    # monitor) the verdict on it.
    ends = {r.origin.rank: r.time for r in records if isinstance(r, Failure)}
    for r in records:
        if isinstance(r, RunEnd) and r.end is not None:
            ends.setdefault(r.origin.rank, r.end)
    for v in verdicts:
        ends.setdefault(v.culprit, v.time)
    assert sorted(ends) == list(range(nproc)), (ends, out)
    conviction = max(facts.deadline_s or 0.0, FLOOR_S)
    assert max(ends.values()) - fault_at <= conviction + 2 * INTERVAL_S + 2.0, (ends, fault_at, conviction, out)
    last = done.stdout.strip().splitlines()[-1]
    words = "went past a collective its peers waited in" if fault == "desync" else "was stuck before a collective"
    assert f"rank {hung} {words}" in last and "the cause," in last and "; called: " in last, last
    notes = [r.note for r in records if isinstance(r, Failure)]
    assert not any(f"rank {peer} failed first" in note for note in notes for peer in facts.peers), notes
    said = "in" if fault == "desync" else "before"
    stood = f"rank {hung}: {said} {facts.collective} ({kind}: its verdict)"
    lines = done.stdout.splitlines()
    assert any(line.startswith(f"  collectives in the {group} group: ") and stood in line for line in lines), out


@pytest.mark.slow  # two ranks' start-up and the 10 s conviction floor: about 30 s a run
@pytest.mark.sampled("hang_cause_2")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("hung", [1, 0], ids=["fail-rank-1", "fail-rank-0"])
def test_a_rank_hung_in_the_step_is_named_stuck_before_the_all_reduce_its_peer_waits_in(
    tmp_path: Path, hung: int
) -> None:
    """Two ranks, the last or rank 0 hung in its step: named ``stuck_outside`` with all_reduce #k of the
    data-parallel group and its peer, every rank failed within the conviction deadline + 2 intervals + 2 s."""
    _hung_in_the_step(tmp_path, 2, hung)


@pytest.mark.slow  # four ranks' start-up on two cores: about 60 s a run
@pytest.mark.sampled("hang_cause_4")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("hung", [3, 0], ids=["fail-rank-3", "fail-rank-0"])
def test_four_ranks_name_the_one_hung_in_the_step_with_the_three_waiting(tmp_path: Path, hung: int) -> None:
    """Four ranks (data-parallel 4), the last or rank 0 hung in its step: named with the three waiting, within the
    same bound."""
    _hung_in_the_step(tmp_path, 4, hung)


@pytest.mark.slow  # two or four ranks' start-up and the 10 s conviction floor: 30-60 s a run
@pytest.mark.sampled("desync")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc", [2, 4])
def test_a_rank_that_skips_its_gradient_all_reduce_is_named_for_a_desync(tmp_path: Path, nproc: int) -> None:
    """The last rank skips one step's gradient all_reduce and waits in the loop's all_reduce of the default group,
    which its peers never enter (they wait in the data-parallel one): named ``desync`` with the default group and
    every peer, every rank failed within the conviction deadline + 2 intervals + 2 s."""
    _hung_in_the_step(tmp_path, nproc, nproc - 1, group="default", fault="desync")


@pytest.mark.slow  # two or four ranks' start-up; the rank dies at once: 20-40 s a run
@pytest.mark.sampled("desync")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc", [2, 4])
def test_a_rank_that_all_reduces_another_size_is_named_dead_of_the_desync(tmp_path: Path, nproc: int) -> None:
    """The last rank all_reduces its gradients one element short (``--fault desync-size``): gloo aborts it, and its
    monitor's verdict names the desync it died of (the data-parallel all_reduce, every peer's size and its own, the
    call sites); every rank failed within 2 intervals + 2 s of its last record; ``show`` has it inside the
    collective, not before it."""
    hung = nproc - 1
    args = [
        *("--nproc", str(nproc), "--steps", "200", "--fail-at", "step", "--fault", "desync-size"),
        *("--fail-rank", str(hung), "--eval-interval", "0", "--journal-dir", str(tmp_path)),
    ]
    done = run_demo(*args, timeout=280, cwd=tmp_path)
    out = done.stdout[-4000:]
    assert done.returncode != 0, out
    records = read([tmp_path])
    verdicts = [r for r in records if isinstance(r, Verdict)]
    assert verdicts and {v.culprit for v in verdicts} == {hung}, (verdicts, out)
    facts, note = verdicts[0].evidence, verdicts[0].note
    assert facts.kind == "died" and facts.group == "the data-parallel group", (facts, out)
    assert re.fullmatch(r"all_reduce #\d+", facts.collective) and set(facts.peers) == set(range(hung)), (facts, out)
    peers = ", ".join(map(str, range(hung)))
    assert re.search(rf"a desync: rank\(s\) {peers} called all_reduce on (\d+) float32 elements, this rank all_reduce "
                     r"on (\d+) float32 elements", note), note  # fmt: skip
    assert f"{facts.collective} of the data-parallel group at _training/pretrain.py:" in facts.sites, facts
    fault_at = max(_when(r) for r in records if r.origin.rank == hung and not isinstance(r, Verdict))
    ends = {r.origin.rank: r.time for r in records if isinstance(r, Failure)}
    ends.setdefault(hung, verdicts[0].time)
    assert sorted(ends) == list(range(nproc)), (ends, out)
    assert max(ends.values()) - fault_at <= 2 * INTERVAL_S + 2.0, (ends, fault_at, out)
    last = done.stdout.strip().splitlines()[-1]
    assert f"rank {hung} died" in last and "(a desync)" in last and "the cause," in last, last
    stood = f"rank {hung}: in {facts.collective} (died: its verdict)"
    assert any(line.startswith("  collectives in the data-parallel group: ") and stood in line for line in
               done.stdout.splitlines()), out  # fmt: skip


@pytest.mark.slow  # the group timeout (10 s) and two ranks' start-up: about 40 s here
@pytest.mark.timeout(240)
def test_without_liveness_the_hang_in_the_step_names_no_victim_the_cause(tmp_path: Path) -> None:
    """Liveness off: the demo's last line, ``show``'s page and every exception note say the cause is unknown and
    name the victim's timed-out receive as what was seen; nothing calls the victim the cause or "failed first"."""
    hung, victim = 1, 0
    args = [
        *("--steps", "200", "--fail-at", "step", "--fault", "hang", "--fail-rank", str(hung), "--timeout", "10"),
        *("--liveness", "off", "--eval-interval", "0", "--journal-dir", str(tmp_path), "--keep"),
    ]
    done = run_demo(*args, timeout=220, cwd=tmp_path)
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("demo: FAILED in ") and f"unknown: rank {victim} timed out waiting for a peer" in last, (
        done.stdout[-4000:]
    )
    assert "the cause," not in last
    page = html.unescape((tmp_path / "show.html").read_text())
    assert "the cause is unknown" in page and "the cause," not in page and "(the cause)" not in page
    notes = [r.note for r in read([tmp_path]) if isinstance(r, Failure)]
    assert not any(f"rank {victim} failed first" in note for note in notes), notes


@pytest.mark.slow  # four ranks' start-up on two cores: about 60 s
@pytest.mark.timeout(300)
def test_a_hang_inside_a_tensor_parallel_layer_names_the_tensor_parallel_pair(tmp_path: Path) -> None:
    """TP2 x DP2, rank 3 hung before its last row-parallel layer's all_reduce: named with the tensor-parallel group
    and rank 2, its pair waiting there; not with the data-parallel group, whose peer waits too."""
    _hung_in_the_step(tmp_path, 4, 3, tp=2, group="tensor-parallel", peers={2})
