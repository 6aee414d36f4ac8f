"""``show``'s verdict, gantt chart and page, on journals written here (torch-free, fast).

Before issue 14 ``show`` printed per-rank timelines only: no verdict, no gantt chart,
no ``--html``; every test here fails on it (the modules did not exist). What each
pins beyond that is in its docstring.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lifecycle import journal
from lifecycle._tools.show import claims, gantt, svg, synthetic, verdict
from lifecycle._tools.show import model as show_model
from lifecycle._tools.show.main import render_timeline, show_main, write_diagrams, write_page
from lifecycle.journal import Origin, Record

T0 = 1_000.0
FAIL = T0 + 0.5


def origin(rank: int, attempt: int = 0) -> Origin:
    """Rank ``rank``'s origin in attempt ``attempt`` of run ``r``."""
    return Origin("r", rank, attempt, "ordinary", 0)


def attempt(
    world: int, ends: dict[int, dict[str, object]], *, missing: tuple[int, ...] = ()
) -> dict[int, list[Record]]:
    """One attempt of ``world`` ranks: each closes unless ``ends[rank]`` says otherwise (``synthetic.rank_call``
    keywords); the ranks in ``missing`` wrote no journal."""
    ranks: dict[int, list[Record]] = {}
    for rank in range(world):
        if rank in missing:
            continue
        how = {"end": "closed", **ends.get(rank, {})}
        ranks[rank] = synthetic.rank_call(origin(rank), world, T0, steps=5, **how)  # type: ignore[arg-type]
    return ranks


def failed(at: float, error: str, **more: object) -> dict[str, object]:
    """A rank that fails at ``at`` with ``error`` (``synthetic.rank_call`` keywords in ``more``)."""
    return {"end": "failed", "fail_at": at, "error": error, **more}


PEER = "RuntimeError: Connection closed by peer"


def test_the_first_failure_is_ordered_by_the_stores_sequence_number() -> None:
    """Rank 2 published first (seq 1) though its clock put its failure after rank 0's: the verdict names rank 2,
    by sequence number, with its phase, step and error, and times the others from it."""
    ranks = attempt(
        4,
        {
            0: failed(FAIL + 0.001, PEER, seq=2, first_rank=2),  # clock skew: 1 ms "earlier" than rank 2 says
            2: failed(FAIL + 0.010, "InjectedFault: boom", seq=1),
            3: failed(FAIL + 0.070, PEER, seq=3, first_rank=2),
        },
    )
    lines = verdict.analyse(ranks).lines()
    assert lines[0] == (
        "rank 2 raised in the training step at step 6: InjectedFault: boom"
        " — the cause, first in the store's order of failure notices"
    )
    assert (
        f"ranks 0, 3: failed 9.0 ms before to 60 ms after rank 2, a consequence, at step 6 (phase step): {PEER}"
        in lines
    )
    assert "rank 1: closed" in lines


def test_a_rank_its_liveness_monitor_killed_is_named_first_from_the_survivors_notice() -> None:
    """Rank 0 was stopped and killed by its monitor (no Failure record, no end); rank 1's notice is number 2 and names
    rank 0: the verdict names rank 0, its kind and step in plain words, never the survivor (before: rank 1 "failed
    first"), and the survivor's connection error is called a consequence."""
    note = (
        "lifecycle: rank 0 failed first (step 6, phase step): LivenessVerdict: rank 0 is stopped at step 6, "
        "phase step: no progress for 2.0 s (deadline 2 s)"
    )
    ranks = attempt(2, {0: {"end": "killed"}, 1: failed(FAIL + 2.0, PEER, seq=2, first_rank=0, note=note)})
    lines = verdict.analyse(ranks).lines()
    assert lines[0] == (
        "rank 0 stopped in the training step at step 6 (its process stopped in state T, no progress for 2.0 s;"
        " named by its liveness monitor) — the cause, named by its peers' failure notices"
    ), lines
    assert lines[1].startswith("rank 1: failed 0.0 ms after the first notice naming rank 0, a consequence,"), lines


def test_without_failure_records_the_first_failure_is_by_wall_time() -> None:
    """Journals without Failure records (older runs): the earliest failure evidence by wall time decides, and the
    verdict says so; the phase is the state the rank failed from, the step the last it recorded."""
    ranks = attempt(
        3,
        {
            0: failed(FAIL + 0.060, PEER, failure_record=False),
            1: failed(FAIL, "InjectedFault: boom", failure_record=False),
            2: failed(FAIL + 0.080, PEER, failure_record=False),
        },
    )
    lines = verdict.analyse(ranks).lines()
    assert lines[0] == (
        "rank 1 failed in state training after step 5: InjectedFault: boom"
        " — the cause, by wall time, a fallback: no failure notice was journaled (hosts' clocks may differ)"
    )
    assert lines[1] == (
        f"ranks 0, 2: failed 60-80 ms after rank 1, a consequence, in state training, after step 5: {PEER}"
    )


def test_a_sigkilled_rank_is_the_cause_of_its_peers_connection_errors() -> None:
    """A rank whose journal just stops (SIGKILL, no liveness monitor) while its peers fail on broken connections is
    the cause, though their notices reached the store and it wrote none: it died, and they are consequences
    (before issue 27: rank 0 "failed first", rank 3 "no end record — killed?")."""
    ranks = attempt(4, {3: {"end": "killed"}, 0: failed(FAIL, PEER, seq=1), 1: failed(FAIL + 0.002, PEER, seq=2)})
    lines = verdict.analyse(ranks).lines()
    assert lines[0] == (
        "rank 3 died in state training after step 5 (killed: no end record, no failure notice; its peers'"
        " connections to it broke or timed out) — the cause, no failure notice of its own: its peers' connection"
        " errors are consequences of its death"
    ), lines
    assert lines[1].startswith("ranks 0-1: failed 0.0-2.0 ms after the first notice naming rank 3, a consequence")


def test_a_peer_whose_connection_broke_never_outranks_the_cause() -> None:
    """Rank 0's notice reached the store first (seq 1) but says its connection broke; rank 2 raised (seq 2): rank 2
    is the cause, rank 0 a consequence."""
    ranks = attempt(3, {0: failed(FAIL, PEER, seq=1), 2: failed(FAIL - 0.01, "InjectedFault: boom", seq=2)})
    lines = verdict.analyse(ranks).lines()
    assert lines[0].startswith("rank 2 raised in the training step at step 6: InjectedFault: boom — the cause"), lines
    assert lines[1].startswith("rank 0: failed 10.0 ms after rank 2, a consequence"), lines


def test_a_notice_naming_the_cause_outranks_its_own_sequence_number() -> None:
    """A survivor's notice is number 1 but (after its wait for the liveness verdict) names rank 1 as dead: rank 1 is
    the cause, in the monitor's kind and step (the 2-rank crash of the demo)."""
    note = "lifecycle: rank 1 died at step 50, phase step (its process is gone; it reported no failure of its own)"
    ranks = attempt(2, {1: {"end": "killed"}, 0: failed(FAIL, PEER, seq=1, first_rank=1, note=note)})
    assert verdict.analyse(ranks).lines()[0] == (
        "rank 1 died in the training step at step 50 (killed: no end record, its process gone, its heartbeat"
        " stopped) — the cause, named by its peers' failure notices"
    )


def test_the_liveness_kinds_are_said_in_plain_words() -> None:
    """Each liveness verdict in a survivor's note gives the cause's kind word: hung (waiting), spinning, stopped,
    died, went unresponsive (a version 3 note's words)."""
    notes = {
        "hung in the batch provider at step 41 (alive, no progress for 4.1 s": "rank 1 is waiting at step 41, phase"
        " batch: no progress for 4.1 s (deadline 2.0 s); it sleeps in step 41, phase batch; rank(s) 0 went on past it",
        "was spinning in the training step at step 9 (running, no progress for 2.5 s": "rank 1 is spinning at step 9,"
        " phase step: no progress for 2.5 s (deadline 2.0 s); its process runs without progress",
        "went unresponsive in the training step at step 7 (its monitor stopped beating for 3.0 s": "rank 1 is"
        " unresponsive: its monitor has not beaten for 3.0 s (last at step 7, phase step; its host or monitor is gone,"
        " no connection reset)",
    }
    for words, note in notes.items():
        ranks = attempt(
            2, {1: {"end": "killed"}, 0: failed(FAIL, PEER, seq=2, first_rank=1, note=f"lifecycle: {note}")}
        )
        assert verdict.analyse(ranks).lines()[0].startswith(f"rank 1 {words}"), words


def test_ranks_with_no_journal_are_named_from_the_world_size() -> None:
    """Ranks of the world (RunStart.world_size) that left no journal are named as such, grouped in ranges."""
    ranks = attempt(6, {}, missing=(3, 4, 5))
    assert verdict.analyse(ranks).lines() == [
        "no rank failed",
        "ranks 0-2: closed",
        "ranks 3-5: no journal (world size 6)",
    ]


def test_two_ranks_failing_within_a_few_ms_are_reported_as_independent() -> None:
    """Ranks 1 and 2 fail 2 ms apart: neither caused the other, and the verdict says so; the rest follow rank 1."""
    ranks = attempt(
        4,
        {
            0: failed(FAIL + 0.06, PEER, seq=3, first_rank=1),
            1: failed(FAIL, "InjectedFault: one", seq=1),
            2: failed(FAIL + 0.002, "InjectedFault: two", seq=2, first_rank=1),
            3: failed(FAIL + 0.07, PEER, seq=4, first_rank=1),
        },
    )
    lines = verdict.analyse(ranks).lines()
    assert lines[0].startswith("rank 1 raised in the training step at step 6: InjectedFault: one — the cause")
    assert lines[1] == (
        "rank 2 failed independently, 2.0 ms apart (neither caused the other), at step 6 (phase step):"
        " InjectedFault: two"
    )
    assert lines[2] == f"ranks 0, 3: failed 60-70 ms after rank 1, a consequence, at step 6 (phase step): {PEER}"


def test_a_published_failure_naming_no_peer_is_independent_however_late() -> None:
    """A rank that published its own notice and names no peer as first failed on its own, 30 ms later or not."""
    ranks = attempt(3, {0: failed(FAIL, "OSError: disk full", seq=1), 2: failed(FAIL + 0.03, "KeyError: x", seq=2)})
    lines = verdict.analyse(ranks).lines()
    assert lines[1].startswith("rank 2 failed independently, 30 ms apart") and lines[2] == "rank 1: closed"


def test_a_rank_that_could_not_learn_the_first_is_no_independent_failure() -> None:
    """A rank whose notice was published but which could not read notice 1 (its note says the first is unknown,
    it names no rank) is grouped as failing after the first, not as failing independently."""
    unknown = (
        "lifecycle: which rank failed first is unknown: this rank's notice is number 2; notice 1 could not be read"
    )
    ranks = attempt(
        3, {0: failed(FAIL, "OSError: disk full", seq=1), 2: failed(FAIL + 0.03, PEER, seq=2, note=unknown)}
    )
    lines = verdict.analyse(ranks).lines()
    assert lines[1] == f"rank 2: failed 30 ms after rank 0, a consequence, at step 6 (phase step): {PEER}"


def test_the_store_host_failing_first_leaves_the_others_unpublished() -> None:
    """Rank 0 hosted the store and failed first: the others could not publish (no seq); the verdict still names
    rank 0 by sequence number and groups the others after it."""
    ranks = attempt(
        4,
        {0: failed(FAIL, "InjectedFault: host", seq=1), **{r: failed(FAIL + 0.05 + r / 1000, PEER) for r in (1, 2, 3)}},
    )
    lines = verdict.analyse(ranks).lines()
    assert lines[0].startswith("rank 0 raised in the training step at step 6: InjectedFault: host — the cause, first")
    assert lines[1] == f"ranks 1-3: failed 51-53 ms after rank 0, a consequence, at step 6 (phase step): {PEER}"


def test_a_rank_that_failed_earlier_without_a_notice_is_noted() -> None:
    """By sequence number rank 1 was first, but rank 3, which could not publish, failed 40 ms before it by wall
    time: the verdict notes it rather than hide it."""
    ranks = attempt(4, {1: failed(FAIL + 0.04, "InjectedFault: x", seq=1), 3: failed(FAIL, "OSError: gone")})
    lines = verdict.analyse(ranks).lines()
    assert "note: rank 3 failed 40 ms earlier by wall time but journaled no published notice" in lines


def test_scattered_ranks_are_cut_with_their_count() -> None:
    """Every other rank of 1,024 killed: the ranges of each group are cut to a readable length, with the count."""
    ranks = attempt(1024, {r: {"end": "killed"} for r in range(0, 1024, 2)})
    lines = verdict.analyse(ranks).lines()
    assert lines[0] == "no rank reported a failure"
    assert lines[1].startswith("ranks 0, 2, 4, ") and ", … (512 ranks): no end record — ended from outside" in lines[1]
    assert len(lines[1]) < 200


def test_no_rank_failed_is_one_line() -> None:
    """Every rank closed: one line. Every rank cut short with no failure (a Ctrl-C during start-up): one line that
    says none reported a failure and none closed (before issue 27: "no rank failed: all 2 ranks no end record —
    killed?")."""
    assert verdict.analyse(attempt(4, {})).lines() == ["no rank failed: all 4 ranks closed"]
    cut = verdict.analyse(attempt(2, {0: {"end": "killed"}, 1: {"end": "killed"}})).lines()
    assert cut == [
        "no rank reported a failure, and none closed: all 2 ranks no end record — ended from outside (killed or"
        " signalled) (in state training, last step 5)"
    ]


def test_1024_ranks_with_many_distinct_errors_stay_within_24_lines() -> None:
    """1,024 ranks, each peer failing with a different error (not only its numbers): groups past 24 lines are
    counted in a last line, the killed and missing ranks still named; errors that differ only in numbers (ports)
    share a group."""
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    ends: dict[int, dict[str, object]] = {1: failed(FAIL, "InjectedFault: first", seq=1)}
    for rank in range(2, 1024):
        error = f"RuntimeError: {words[rank % 10]} {words[rank // 10 % 10]} {words[rank // 100 % 10]}"
        ends[rank] = failed(FAIL + 0.06 + rank / 1e5, error, seq=rank, first_rank=1)
    ends[0] = failed(FAIL + 0.06, f"{PEER} [10.0.0.1]:20000", seq=1024, first_rank=1)
    ends[7] = {"end": "killed"}
    ranks = attempt(1024, ends, missing=(1000, 1001))
    lines = verdict.analyse(ranks).lines()
    assert len(lines) == 24 and lines[0].startswith("rank 1 raised")
    assert lines[-3].startswith("rank 7: no end record — ended from outside")  # kept: the failed ranks' groups give way
    assert lines[-2] == "ranks 1000-1001: no journal (world size 1024)"
    assert re.fullmatch(r"… and \d+ more groups \(\d+ ranks\)", lines[-1]), lines[-1]
    ports = attempt(
        1024, {1: ends[1], **{r: failed(FAIL + 0.06, f"{PEER} [10.0.0.1]:{20000 + r}") for r in range(2, 1024)}}
    )
    assert verdict.analyse(ports).lines()[1].startswith("ranks 2-1023: failed 60 ms after rank 1, a consequence")


def test_show_prints_each_attempts_verdict_before_its_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``show`` prints the verdict right under each attempt's label, indented, before the ranks' timelines."""
    synthetic.write(tmp_path, synthetic.failing_run("r", 3, 2))
    assert show_main([str(tmp_path), "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out.splitlines()
    for label in ("attempt 0", "attempt 1"):
        at = out.index(label)
        assert out[at + 1].startswith("  verdict: rank 1 raised in the training step at step 21: InjectedFault")
        assert out[at + 2].strip().startswith("ranks 0, 2: failed")
        assert out[at + 3].startswith("  rank 0: ended failed")
    assert "verdict" not in "\n".join(render_timeline(show_model.build(synthetic.failing_run("r", 3, 1)[0])))


def chart_of(ranks: dict[int, list[Record]]) -> str:
    """The gantt chart of the one attempt in ``ranks`` (rank → its records), drawn from show's model."""
    (run,) = show_model.build([r for rs in ranks.values() for r in rs]).runs
    (drawn,) = run.drawn
    return gantt.gantt(drawn)


def sections(chart: str) -> list[str]:
    """The section names of a gantt chart."""
    return [line.strip().removeprefix("section ") for line in chart.splitlines() if line.strip().startswith("section ")]


def test_the_gantt_has_a_row_per_rank_up_to_16_then_one_per_group(tmp_path: Path) -> None:
    """Up to 16 ranks: a section per rank, the first failure a crit milestone on its row; 1,024 ranks: the first
    failing rank and one section per group of ranks that ended alike, far under GitHub's 50,000 characters."""
    small = synthetic.failing_run("r", 16, 1)
    chart = chart_of(small)
    assert sections(chart) == [f"rank {r}" for r in range(16)]
    marks = [line for line in chart.splitlines() if "milestone" in line]
    assert len(marks) == 1 and marks[0].strip().startswith("the cause - rank 1 raised in the training step"), marks
    big = synthetic.failing_run("r", 1024, 1)
    big[5] = big[5][:-9]  # rank 5 killed before it failed: a group of its own
    chart = chart_of(big)
    names = sections(chart)
    assert names[0] == "rank 1 (the cause)" and len(names) == 3, names
    assert names[1].startswith("ranks 0, 2-4, 6-1023 (rank ") and names[2] == "rank 5 (rank 5 drawn)"
    assert "training (steps 1-18) - no end record :done" in chart  # the killed rank's bar runs to its last record
    assert len(chart) < 10_000
    written = {p.name for p in write_diagrams(show_model.build([r for rs in big.values() for r in rs]), tmp_path)}
    assert "attempt0-gantt.mermaid" in written and "attempt0.mmd" in written


def test_the_gantt_stays_under_budget_with_many_groups() -> None:
    """1,024 ranks in 1,023 groups (every error distinct): at most 16 sections, the rest counted in the title."""
    ends: dict[int, dict[str, object]] = {1: failed(FAIL, "InjectedFault: first", seq=1)}
    ends |= {
        r: failed(FAIL + 0.06, f"E{chr(65 + r % 26)}{chr(65 + r // 26 % 26)}: x", seq=r + 1, first_rank=1)
        for r in range(2, 1024)
    }
    ranks = attempt(1024, ends)
    chart = chart_of(ranks)
    assert len(sections(chart)) <= 16 and "more groups not drawn" in chart.splitlines()[4]
    assert len(chart) < gantt.BUDGET


def test_html_page_is_self_contained(tmp_path: Path) -> None:
    """``show --html``: one page with each attempt's verdict (the cause's line marked, lines wrapped) and its two
    pictures drawn as SVG by lifecycle; no script, nothing loaded from elsewhere; the Mermaid sources folded (before
    issue 27 the pictures were Mermaid text unless npm's bundle was installed)."""
    synthetic.write(tmp_path, synthetic.failing_run("r", 4, 2))
    page = tmp_path / "out" / "run.html"
    assert show_main([str(tmp_path), "--out", str(tmp_path / "d"), "--html", str(page)]) == 0
    text = page.read_text()
    assert '<pre class="verdict"><span class="cause">rank 1 raised in the training step at step 21' in text
    assert text.count('<svg class="timeline"') == 2 and text.count('<svg class="path"') == 2
    assert text.count('data-cause="true"') == 2 and text.count('<polygon class="cause"') == 2
    assert text.count("<pre>gantt\n") == 2 and text.count("<pre>stateDiagram-v2") == 2
    assert "<script" not in text and not re.search(r"(src|href)\s*=", text)
    assert "white-space:pre-wrap" in text
    one = synthetic.failing_run("r", 4, 1)
    assert write_page(show_model.build([r for rs in one.values() for r in rs]), page).read_text().count("<svg ") == 2


def test_the_timeline_svg_keeps_the_culprits_row_among_1024_ranks() -> None:
    """1,024 ranks: the timeline draws the cause's row first (marked), one row per group of the others, at most 16
    rows, in a few kB; up to 16 ranks, one row per rank."""
    big = synthetic.failing_run("r", 1024, 1)
    (run,) = show_model.build([r for rs in big.values() for r in rs]).runs
    picture = svg.timeline(run.drawn[0])
    rows = re.findall(r'<g class="row( culprit)?" data-rank="(\d+)"', picture)
    assert rows[0] == (" culprit", "1") and len(rows) <= 16, rows
    assert picture.count('<polygon class="cause"') == 1 and len(picture) < 20_000
    small = synthetic.failing_run("r", 3, 1)
    (run,) = show_model.build([r for rs in small.values() for r in rs]).runs
    assert re.findall(r'data-rank="(\d+)"', svg.timeline(run.drawn[0])) == ["0", "1", "2"]


def test_the_world_report_orders_ranks_by_the_same_rule() -> None:
    """``verdict.order`` on what a world test's ranks report (no journal; ``claims.claim``): a crashed rank comes
    before its peers' connection errors; a survivor whose note names rank 2 comes after rank 2, whatever the clocks
    say."""
    crashed = {
        0: claims.claim(0, PEER, time=T0),
        1: claims.claim(1, "", time=None, killed=True),
    }
    assert [e.rank for e in verdict.order(crashed)] == [1, 0]
    note = "lifecycle: rank 2 failed first (step 3, phase step): ValueError: bad batch"
    named = {
        0: claims.claim(0, "RuntimeError: gloo timeout", time=T0, note=note),
        2: claims.claim(2, "ValueError: bad batch", time=T0 + 0.5),
    }
    assert [e.rank for e in verdict.order(named)] == [2, 0]


def test_notices_that_name_a_victim_do_not_make_it_the_cause() -> None:
    """Rank 2 hung unnoticed and was ended from outside; rank 0's receive timed out first (notice 1) and the later
    notices name rank 0: a timed-out receive is a consequence, so rank 2 is the cause (the 4-rank hang in the
    training step, which the liveness monitor cannot name: every rank waits level in one collective)."""
    timeout = "RuntimeError: [unbound_buffer.cc:78] Timed out waiting 30000ms for recv operation to complete"
    note = f"lifecycle: rank 0 failed first (step 6, phase step): {timeout}"
    ranks = attempt(
        4,
        {
            2: {"end": "killed"},
            0: failed(FAIL, timeout, seq=1),
            1: failed(FAIL + 0.01, timeout, seq=2, first_rank=0, note=note),
            3: failed(FAIL + 0.02, timeout, seq=3, first_rank=0, note=note),
        },
    )
    assert verdict.analyse(ranks).lines()[0].startswith("rank 2 died in state training after step 5 (killed:")


def test_a_rank_the_launcher_stopped_after_a_death_is_a_consequence() -> None:
    """A survivor that torchrun's SIGTERM stopped after a peer's death (``StoppedByLauncher``, issue 26) is a
    consequence, like a broken connection, never the cause."""
    stopped = "StoppedByLauncher: stopped by the launcher (SIGTERM) after rank 2 died at step 5"
    ranks = attempt(3, {2: {"end": "killed"}, 0: failed(FAIL, stopped, seq=1), 1: failed(FAIL + 0.01, PEER, seq=2)})
    lines = verdict.analyse(ranks).lines()
    assert lines[0].startswith("rank 2 died in state training after step 5 (killed:"), lines
    assert any(line.startswith("rank 0: failed") and "a consequence" in line for line in lines), lines


def test_the_culprits_own_verdict_record_names_it_when_no_notice_could() -> None:
    """Rank 1 was stopped and killed by its monitor, which wrote a ``verdict`` record into rank 1's journal; the store
    was gone, so no survivor's notice is numbered or names it (their notes say the first is unknown): the verdict
    record names rank 1, placed at the verdict's time, its peers' connection errors consequences."""
    unknown = "lifecycle: which rank failed first is unknown: the rendezvous store is unreachable"
    ranks = attempt(
        3,
        {1: {"end": "killed"}, 0: failed(FAIL, PEER, note=unknown), 2: failed(FAIL + 0.01, PEER, note=unknown)},
    )
    note = (
        "rank 1 is stopped at step 6, phase step: no progress for 2.0 s (deadline 2.0 s); its process is stopped"
        " (state T); its Python stacks are in /tmp/j/rank1.stacks.txt"
    )
    ranks[1].append(journal.Verdict(origin=origin(1), culprit=1, verdict="stopped", phase="step", step=6, note=note,
                                    time=FAIL - 0.2, seq=None, stacks="/tmp/j/rank1.stacks.txt"))  # fmt: skip
    lines = verdict.analyse(ranks).lines()
    assert lines[0] == (
        "rank 1 stopped in the training step at step 6 (its process stopped in state T, no progress for 2.0 s; killed"
        " by its liveness monitor) — the cause, named by its liveness monitor's verdict, in its journal (the store"
        " did not number it)"
    ), lines
    assert lines[1].startswith("ranks 0, 2: failed 200-210 ms after rank 1, a consequence"), lines
