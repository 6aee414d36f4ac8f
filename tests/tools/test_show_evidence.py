"""A failure's evidence, typed once (``lifecycle.journal.evidence``), and the cause rule on every view (issue 37).

Torch-free and fast: synthetic journals (``lifecycle._tools.show.synthetic``), version 4
records with their typed facts, and the same journals as version 3 wrote them (no facts:
read through ``lifecycle._tools.show.older`` and the evidence module's one rule). On the
code before issue 37 the hang cases named rank 0, the victim, "the cause, first in the
store's order of failure notices"; the stale notice named rank 1 "went silent"; the
killed launcher was never named; the killed rank's timeline said "no end record (killed?)".
"""

from __future__ import annotations

import dataclasses
import html
import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from lifecycle import NonfiniteLoss, journal
from lifecycle._tools.demo import report as demo_report
from lifecycle._tools.show import cause, synthetic, verdict
from lifecycle._tools.show import model as show_model
from lifecycle._tools.show.main import render_timeline, write_page
from lifecycle.journal import FailedSave, Failure, Origin, Record, StepSkipped, Verdict
from lifecycle.journal.evidence import (
    CONSEQUENCES,
    DETAILS,
    LIVENESS_KINDS,
    VERDICT_PREFIX,
    WORDS,
    Evidence,
    Kind,
    consequence,
    error_kind,
    kind_of,
)

T0 = 1_000.0
FAIL = T0 + 0.5
TIMEOUT = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 30000ms for recv"
    " operation to complete"
)
LAUNCHER = "StoppedByLauncher: SIGTERM after rank 1's process left"
RESET = "RuntimeError: Connection reset by peer [127.0.0.1]:29512"
CONSEQUENCE_ERRORS = {
    Kind.COLLECTIVE_TIMEOUT: TIMEOUT,
    Kind.STOPPED_BY_LAUNCHER: LAUNCHER,
    Kind.CONNECTION_LOST: RESET,
}


def origin(rank: int) -> Origin:
    """Rank ``rank``'s origin in attempt 0 of run ``r``."""
    return Origin("r", rank, 0, "ordinary", 0)


def failing(
    rank: int, world: int, at: float, error: str, kind: Kind | None, *, seq: int | None, first: int | None = None
) -> list[Record]:
    """Rank ``rank``'s records, failing at ``at`` with ``error`` (notice ``seq``, naming ``first``); with ``kind`` its
    ``Failure`` record carries the version 4 evidence, without it the record is as version 3 wrote it."""
    records = synthetic.rank_call(
        origin(rank), world, T0, steps=40, end="failed", fail_at=at, error=error, seq=seq, first_rank=first
    )
    if kind is None:
        return records
    facts = Evidence(kind.value, rank, 41, "step")
    return [dataclasses.replace(r, evidence=facts) if isinstance(r, Failure) else r for r in records]


def hang_run(*, typed: bool, hung: int = 1) -> dict[int, list[Record]]:
    """The demo's ``--fault hang --fail-at step`` (``hung``: the rank asleep in its step): its peer's receive timed
    out (notice 1); the launcher then stopped the hung rank (notice 2, naming the victim)."""
    victim = 1 - hung
    kinds = (Kind.COLLECTIVE_TIMEOUT, Kind.STOPPED_BY_LAUNCHER) if typed else (None, None)
    return {
        victim: failing(victim, 2, FAIL, TIMEOUT, kinds[0], seq=1),
        hung: failing(hung, 2, FAIL + 0.2, LAUNCHER, kinds[1], seq=2, first=victim),
    }


@pytest.mark.parametrize("typed", [True, False], ids=["v4", "v3"])
@pytest.mark.parametrize("hung", [1, 0], ids=["fail-rank-1", "fail-rank-0"])
def test_a_hang_inside_the_step_names_no_victim_the_cause_on_any_view(tmp_path: Path, typed: bool, hung: int) -> None:
    """``--fault hang --fail-at step``: the verdict says the cause is unknown, names the victim's timed-out receive as
    what was seen, and no line, page, mark or row calls the victim the cause."""
    victim = 1 - hung
    ranks = hang_run(typed=typed, hung=hung)
    judged = verdict.analyse(ranks)
    head = judged.headline()
    assert judged.first is None and judged.decided is verdict.Decided.UNKNOWN, head
    assert head.startswith(
        f"unknown: rank {victim} timed out waiting for a peer in the training step at step 41; the rank it waited"
        " on was not named"
    ), head
    assert "the cause is unknown" in head and "LivenessConfig" in head, head
    journal_dir = tmp_path / "j"
    synthetic.write(journal_dir, ranks)
    model = show_model.build(journal.read([journal_dir]))
    text = "\n".join(render_timeline(model, verdicts=True))
    page = write_page(model, tmp_path / "show.html").read_text()
    for shown in (text, page):
        assert "the cause," not in shown and "(the cause)" not in shown
        assert f"rank {victim} timed out waiting for a peer" in shown
    assert '<polygon class="cause"' not in page  # no SVG mark on the victim
    assert demo_report._cause(model).startswith("unknown: ")  # the demo's last line


@pytest.mark.parametrize("kind", sorted(CONSEQUENCES, key=lambda k: k.value), ids=lambda k: k.value)
@pytest.mark.parametrize("typed", [True, False], ids=["v4", "v3"])
def test_a_consequence_as_notice_1_is_never_printed_as_the_cause(kind: Kind, typed: bool) -> None:
    """A broken connection, a timed-out receive or a launcher's stop after a death, numbered first by the store, is
    never the cause: the rank that raised (notice 2) is, or, where none did, the cause is unknown."""
    error = CONSEQUENCE_ERRORS[kind]
    ranks = {
        0: failing(0, 3, FAIL, error, kind if typed else None, seq=1),
        1: failing(1, 3, FAIL + 0.02, "InjectedFault: boom", Kind.RAISED if typed else None, seq=2, first=0),
        2: failing(2, 3, FAIL + 0.03, RESET, Kind.CONNECTION_LOST if typed else None, seq=3, first=0),
    }
    judged = verdict.analyse(ranks)
    assert judged.first is not None and judged.first.rank == 1, judged.headline()
    assert judged.headline().startswith("rank 1 raised in the training step at step 41: InjectedFault: boom")
    alone = verdict.analyse({0: ranks[0], 2: ranks[2]})
    assert alone.first is None and alone.headline().startswith(f"unknown: rank 0 {kind.words}"), alone.headline()


def test_a_stale_unresponsive_notice_is_never_failed_first() -> None:
    """Rank 1's notice 1 (a monitor named it unresponsive at step 15) is stale: rank 1 trained on to step 40. Rank 0,
    which raised later, is the cause, not rank 1."""
    stale = Evidence(Kind.UNRESPONSIVE.value, 1, 15, "step", "", 3.0, None, "neighbour")
    ranks = {
        0: [
            dataclasses.replace(r, first=stale, evidence=Evidence("raised", 0, 41, "step"))
            if isinstance(r, Failure)
            else r
            for r in failing(0, 2, FAIL, "InjectedFault: boom", None, seq=2, first=1)
        ],
        1: synthetic.rank_call(origin(1), 2, T0, steps=40, end="killed"),
    }
    judged = verdict.analyse(ranks)
    assert judged.first is not None and judged.first.rank == 0, judged.headline()
    assert "rank 1 went unresponsive" not in "\n".join(judged.lines())


def test_the_cause_rule_and_the_verdict_prefix_are_defined_once() -> None:
    """The verdict prefix and the consequence rule's words live in the evidence module only, and ``show``'s version 4
    path (cause, verdict) has no regular expression: those survive in ``show/older.py`` alone."""
    root = Path(__file__).resolve().parents[2] / "lifecycle"
    prefix = [p for p in root.rglob("*.py") if '"LivenessVerdict: "' in p.read_text()]
    assert [p.relative_to(root).as_posix() for p in prefix] == ["journal/evidence.py"]
    rule = [p for p in root.rglob("*.py") if "connection (?:reset" in p.read_text()]
    assert [p.relative_to(root).as_posix() for p in rule] == ["journal/evidence.py"]
    for name in ("cause.py", "verdict.py"):
        assert not re.search(r"^import re$|re\.compile", (root / "_tools" / "show" / name).read_text(), re.M), name


def test_the_consequence_rule_reads_each_consequence_and_no_verdict() -> None:
    """``error_kind``: a timed-out receive or store wait, a broken connection and a launcher's stop are consequences;
    a liveness monitor's notice and an ordinary error are not."""
    for kind, error in CONSEQUENCE_ERRORS.items():
        assert error_kind(error) is kind and consequence(error)
    # Megatron's group creation waits in the store for a peer that never came (a rank stuck in setup).
    store_wait = "DistStoreError: wait timeout after 30000ms, keys: /lifecycle/g0/attempt-0/0//1//cpu//0/1"
    assert error_kind(store_wait) is Kind.COLLECTIVE_TIMEOUT
    assert not consequence(f"{VERDICT_PREFIX}rank 1 hung at step 3, phase step: connection reset")
    assert not consequence("ValueError: bad batch")
    assert consequence("ValueError: bad batch", Kind.COLLECTIVE_TIMEOUT.value)  # the typed kind decides


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.value)
def test_every_kind_has_words_survives_a_v4_round_trip_and_renders_everywhere(tmp_path: Path, kind: Kind) -> None:
    """Each member of ``Kind``: its words, its evidence through a version 4 ``failure`` line and back, and its words
    in ``show``'s text and HTML page (as the cause, or the unknown cause's seen failure), with no branch on the kind
    outside the evidence module (a peer's exception note: ``tests/distributed/test_failure_notice.py``)."""
    assert WORDS[kind] == kind.words and kind.words
    assert (kind in DETAILS) == (kind in LIVENESS_KINDS)  # a monitor's kind says what showed it
    facts = Evidence(kind.value, 1, 41, "step", "S", 4.0, 2.0, "monitor")
    records = failing(1, 2, FAIL, f"E: {kind.value}", kind, seq=1)
    records = [dataclasses.replace(r, evidence=facts) if isinstance(r, Failure) else r for r in records]
    line = json.dumps(next(r for r in records if isinstance(r, Failure)).to_json())
    back = journal.parse(json.loads(line))
    assert isinstance(back, Failure) and back.evidence == facts and back.evidence.what is kind
    ranks = {1: records, 0: failing(0, 2, FAIL + 0.1, RESET, Kind.CONNECTION_LOST, seq=2, first=1)}
    folder = tmp_path / "j"
    synthetic.write(folder, ranks)
    model = show_model.build(journal.read([folder]))
    said = f"rank 1 {kind.words}"
    assert said in "\n".join(render_timeline(model, verdicts=True))
    assert said in html.unescape(write_page(model, tmp_path / "show.html").read_text())


def test_a_version_4_verdict_is_rendered_from_its_fields_and_the_killed_rank_says_so(tmp_path: Path) -> None:
    """A rank its monitor killed (a v4 ``verdict`` record, ``killed``): the cause is rendered from the typed evidence
    (its note's words are ignored), its timeline says it was killed by its monitor, and its path ends there."""
    facts = Evidence(Kind.HANG.value, 1, 41, "batch", "S", 4.1, 2.0, "monitor")
    killed = synthetic.rank_call(origin(1), 2, T0, steps=40, end="killed")
    killed.append(
        Verdict(
            origin=origin(1), culprit=1, verdict="hang", phase="batch", step=41, note="(words show never reads)",
            time=FAIL, seq=1, stacks="/tmp/s", evidence=facts, killed=True,
        )
    )  # fmt: skip
    ranks = {1: killed, 0: failing(0, 2, FAIL + 0.1, RESET, Kind.CONNECTION_LOST, seq=2, first=1)}
    head = verdict.analyse(ranks).headline()
    assert head.startswith(
        "rank 1 hung in the batch provider at step 41 (alive, no progress for 4.1 s while its peers went on; killed by"
        " its liveness monitor)"
    ), head
    folder = tmp_path / "j"
    synthetic.write(folder, ranks)
    model = show_model.build(journal.read([folder]))
    text = "\n".join(render_timeline(model))
    assert "killed by its liveness monitor: it hung in state training" in text and "(killed?)" not in text
    assert "killed by its liveness monitor: rank 1 hung (step 41, phase batch)" in text  # the timeline's event
    paths = dict((members, moves) for moves, members in model.runs[0].drawn[0].overview.paths)
    assert paths[(1,)][-1] == ("training", cause.KILLED_TRIGGER, cause.KILLED)


def test_a_killed_launcher_is_named(tmp_path: Path) -> None:
    """torchrun's agent killed from outside (exit code -9, the demo sent no signal): the demo's last line names it,
    beside the ranks cut short."""
    ranks = {rank: synthetic.rank_call(origin(rank), 2, T0, steps=40, end="killed") for rank in (0, 1)}
    synthetic.write(tmp_path, ranks)
    run = demo_report.Run(tmp_path, 2, "r", "127.0.0.1:29500", True, 60.0, removed=True)
    out = io.StringIO()
    with redirect_stdout(out):
        code = demo_report.report(run, demo_report.Ending(returncode=-9), 3.0)
    last = out.getvalue().strip().splitlines()[-1]
    assert code == 1 and "torchrun's agent was killed (SIGKILL)" in last, last
    assert demo_report.launcher_words(demo_report.Ending(returncode=-15)) == (
        "torchrun's agent was stopped from outside (SIGTERM)"
    )
    assert demo_report.launcher_words(demo_report.Ending(returncode=1)) == ""


def test_a_version_3_verdict_still_reads_from_its_words() -> None:
    """The committed v3 fixture (no typed evidence; the verdict ``waiting``, its note in version 3's words): ``show``
    reads the prose through ``show/older.py`` and says the cause in today's words."""
    fixture = Path(__file__).resolve().parents[1] / "journal" / "fixtures" / "v3" / "rank1.jsonl"
    records = journal.read([fixture])
    head = verdict.analyse({1: records}).headline()
    assert head.startswith(
        "rank 1 hung in the batch provider at step 41 (alive, no progress for 4.1 s while its peers went on; killed"
        " by its liveness monitor)"
    ), head


def test_each_fault_flag_names_the_failure_kind_it_is() -> None:
    """``--fault K`` is one name with the failure it makes: each ``FaultKind``'s ``failure`` is a ``Kind`` whose
    words the verdict and cause print (``hang`` is ``Kind.HANG``, "hung"; no ``waiting`` anywhere)."""
    from lifecycle import FaultKind

    assert {fault.value: fault.failure.value for fault in FaultKind} == {
        "raise": "raised", "crash": "died", "stop": "stopped", "hang": "hang", "spin": "spinning",
        "save-error": "save_failed", "nan": "nonfinite_loss", "desync": "desync", "desync-size": "died",
    }  # fmt: skip
    assert "waiting" not in {kind.value for kind in Kind} and "is waiting" not in " ".join(WORDS.values())


def test_a_nan_loss_and_a_failed_save_are_kinds_of_their_own_and_show_words_them_from_there() -> None:
    """``NonfiniteLoss`` is ``Kind.NONFINITE_LOSS``; show words failed saves and skipped steps from their kinds."""
    error = NonfiniteLoss(41, 1, float("nan"), 1, 0)
    assert kind_of(error) is Kind.NONFINITE_LOSS and not consequence(f"NonfiniteLoss: {error}", "nonfinite_loss")
    assert (FailedSave.failure_kind, StepSkipped.failure_kind) == (Kind.SAVE_FAILED, Kind.NONFINITE_LOSS)
    records = synthetic.rank_call(origin(0), 1, T0, steps=40)
    end = records.pop()
    records += [
        FailedSave(origin=origin(0), step=20, error="rank 0: [Errno 28 ENOSPC]", consecutive=1, action="continued",
                   time=T0 + 20.5),
        StepSkipped(origin=origin(0), step=30, loss=float("nan"), ranks=1, consecutive=1, time=T0 + 30.5, culprit=0),
        StepSkipped(origin=origin(0), step=31, loss=float("nan"), ranks=2, consecutive=2, time=T0 + 31.5),
        end,
    ]  # fmt: skip
    text = "\n".join(render_timeline(show_model.build(records)))
    assert f"{Kind.SAVE_FAILED.words} of step 20 (1 in a row; training went on): rank 0: [Errno 28 ENOSPC]" in text
    assert f"step 30 skipped: rank 0 {Kind.NONFINITE_LOSS.words} (1 in a row)" in text
    assert f"step 31 skipped: 2 rank(s) {Kind.NONFINITE_LOSS.words} (2 in a row)" in text


def test_the_timeline_says_where_a_call_resumed_from() -> None:
    """A ``resume`` record is a timeline line naming the step and the source: the copy in memory, or a checkpoint."""
    records = synthetic.rank_call(origin(0), 1, T0, steps=3)
    end = records.pop()
    records += [
        journal.Resumed(origin=origin(0), step=17, source="memory", checkpoint_step=10, time=T0 + 0.1),
        end,
    ]
    text = "\n".join(render_timeline(show_model.build(records)))
    assert "resumed after step 17 from the copy in node memory (newest checkpoint: step 10)" in text
