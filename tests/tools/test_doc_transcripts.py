"""Every ``python -m lifecycle`` transcript of the README and docs/*.md is what the command prints (issue 43).

The rules (tags, what is normalised, how lines are compared, why ranks' lines are
compared per rank) are in ``tests/support/transcripts.py``. ``make test`` runs the cheap
transcripts (refused options, ``show`` on a demo journal kept in
``tests/tools/fixtures/transcripts``) and the comparer's own tests; ``make test-slow``
runs every transcript in the documents' order, the demo's for real (each about 20 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.launch import REPO
from support.transcripts import (
    DOCUMENTS,
    Transcript,
    find_transcripts,
    mismatch,
    normalise,
    run_transcript,
    untagged,
)

TRANSCRIPTS = [
    transcript
    for path in DOCUMENTS
    for transcript in find_transcripts(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
]
CHEAP = [transcript for transcript in TRANSCRIPTS if not transcript.slow]

SHOW_OUTPUT = """\
run demo-20261203-190956-90dc0d
attempt 0
  verdict: rank 1 raised in the training step at step 30 — the cause
     +0.000s  pretrain started (pid 25641 on vm, restart mode ordinary, iteration 0)
     +1.271s  training → failed  [fail, 1038.5 ms]  InjectedFault: step 30
wrote /tmp/rdm-show/attempt0.mmd
wrote /tmp/rdm-show/attempt0.svg
"""
"""What a ``show`` run printed, for the comparer's tests (with a picture only Graphviz writes)."""


def test_every_lifecycle_command_in_the_docs_is_a_tagged_transcript() -> None:
    """No console block that runs python -m lifecycle goes unchecked: each carries a transcript tag."""
    found = [
        where for path in DOCUMENTS for where in untagged(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    ]
    assert not found, f"console blocks running python -m lifecycle without <!-- transcript ... -->: {found}"
    commands = {command.split(" -m lifecycle ")[1].split()[0] for t in TRANSCRIPTS for command, _ in t.commands}
    assert commands == {"demo", "show"}, commands
    assert {t.source for t in TRANSCRIPTS} == {"README.md", "docs/reference.md", "docs/tutorial.md"}
    assert len(CHEAP) >= 2 and len(TRANSCRIPTS) - len(CHEAP) >= 4, [t.label for t in TRANSCRIPTS]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transcript", CHEAP, ids=[t.label for t in CHEAP])
def test_a_cheap_transcript_is_what_its_command_prints(transcript: Transcript, tmp_path: Path) -> None:
    """A refused option or show on a fixture journal: run for real, normalised, equal line by line."""
    problems = run_transcript(transcript, tmp_path, timeout_s=50)
    assert not problems, "\n\n".join(problems)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_transcript_in_document_order_is_what_its_command_prints(tmp_path: Path) -> None:
    """Every transcript, the demo's included, run in the documents' order in one folder, as a reader would."""
    ran: dict[str, str] = {}
    problems = [p for transcript in TRANSCRIPTS for p in run_transcript(transcript, tmp_path, 120, ran)]
    assert not problems, "\n\n".join(problems)
    trained = [command for command in ran if " demo " in command and "--journal-dir" in command]
    assert len(trained) >= 3, list(ran)  # healthy, stopped by ^C, failing (the README's and tutorial's, once)


def test_what_varies_is_normalised_on_both_sides() -> None:
    """Times, pids, hosts, ports, run ids, losses and rates read the same whatever run printed them."""
    one = "     +0.334s  uninitialized → dist_ready  [init_distributed, 333.3 ms]  (pid 18918 on vm, x)"
    two = "     +2.374s  uninitialized → dist_ready  [init_distributed, 14.1 ms]  (pid 7 on node-12, x)"
    assert normalise(one) == normalise(two)
    assert normalise("run demo-20261201-012118-0df02a") == normalise("run demo-20261203-191101-2ef746")
    assert normalise("peer [127.0.0.1]:44745.") == normalise("peer [127.0.0.1]:58054.")
    assert normalise("step     3/60 | loss 4.1849 |     15839 tokens/s") == normalise(
        "step 3/60 | loss 3.9123 |  9 tokens/s"
    )
    assert normalise("succeeded in 5.1 s") == normalise("succeeded in 21.4 s")
    # What says what happened is not normalised: the step, the rank, the state.
    assert normalise("step 29 ended") != normalise("step 30 ended")
    assert normalise("rank 1: ended closed") != normalise("rank 0: ended closed")


def test_a_transcript_that_lacks_a_printed_line_fails() -> None:
    """A transcript missing a line show prints (the tutorial's drift) differs; with '...' in its place it does not."""
    lines = SHOW_OUTPUT.splitlines()
    assert mismatch(lines, SHOW_OUTPUT) is None
    without_verdict = [line for line in lines if "verdict" not in line]
    found = mismatch(without_verdict, SHOW_OUTPUT)
    assert found is not None and "not printed" in found, found
    elided = ["..." if "verdict" in line else line for line in lines]
    assert mismatch(elided, SHOW_OUTPUT) is None


def test_a_transcript_whose_message_drifted_fails() -> None:
    """The --tp 3 drift: the documented refusal differs from the one printed, and says which line."""
    shown = ["demo: --tp 3: the demo model's vocabulary (64) and attention heads (4) are not divisible by 3"]
    printed = "demo: --tp tensor_model_parallel_size * ... = 3 does not divide world_size 2\n"
    found = mismatch(shown, printed)
    assert found is not None and "vocabulary (64)" in found, found
    assert mismatch(["demo: --tp ... does not divide world_size 2"], printed) is None


def test_extra_lines_after_the_last_shown_one_fail_unless_elided() -> None:
    """Output past the transcript's last line is a difference; a closing '...' allows it."""
    lines = SHOW_OUTPUT.splitlines()
    assert mismatch(lines[:3], SHOW_OUTPUT) is not None
    assert mismatch([*lines[:3], "..."], SHOW_OUTPUT) is None
    assert mismatch(["...", *lines[3:]], SHOW_OUTPUT) is None
    assert mismatch(lines[3:], SHOW_OUTPUT) is not None  # and lines before the first shown one


def test_pictures_only_graphviz_writes_are_not_compared() -> None:
    """A 'wrote ....svg' line is dropped on both sides: show writes it only where Graphviz's dot is installed."""
    without = [line for line in SHOW_OUTPUT.splitlines() if not line.endswith(".svg")]
    assert mismatch(without, SHOW_OUTPUT) is None
    assert mismatch(SHOW_OUTPUT.splitlines(), SHOW_OUTPUT.replace("wrote /tmp/rdm-show/attempt0.svg\n", "")) is None


def test_ranks_lines_are_compared_per_rank_in_order() -> None:
    """The ranks' lines interleave as they come: each rank's must be in its order, the ranks' in any."""
    printed = "demo: start\n[rank 1] a1\n[rank 0] a0\n[rank 1] b1\n[rank 0] b0\ndemo: end\n"
    assert (
        mismatch(["demo: start", "[rank 0] a0", "[rank 0] b0", "[rank 1] a1", "[rank 1] b1", "demo: end"], printed)
        is None
    )
    swapped = mismatch(
        ["demo: start", "[rank 0] b0", "[rank 0] a0", "[rank 1] a1", "[rank 1] b1", "demo: end"], printed
    )
    assert swapped is not None and swapped.startswith("rank 0:"), swapped
    missing = mismatch(["demo: start", "[rank 0] a0", "[rank 0] b0", "demo: end"], printed)
    assert missing is not None and missing.startswith("rank 1:"), missing


def test_a_ctrl_c_line_is_input_not_output(tmp_path: Path) -> None:
    """A shown ^C is the reader's key, not a printed line: it is not compared, and it needs a line to wait for."""
    printed = "demo: start\n[rank 0] step 50\n\ndemo: SIGINT: asking\ndemo: stopped\n"
    shown = ["demo: start", "[rank 0] step 50", "^C", "", "demo: SIGINT: asking", "demo: stopped"]
    assert mismatch(shown, printed) is None
    with pytest.raises(ValueError, match="the line above"):
        run_transcript(Transcript("x.md", 1, (("python -m lifecycle demo", ("...", "^C")),)), tmp_path, 1)


def test_a_bad_or_missing_tag_is_an_error() -> None:
    """An unknown tag option is refused by line, and a lifecycle console block without a tag is listed."""
    block = "```console\n$ .venv/bin/python -m lifecycle demo --timeout 0\ndemo: refused\n```\n"
    assert untagged("Text\n\n" + block, "x.md") == ["x.md:3"]
    tagged = find_transcripts("<!-- transcript exit 2 -->\n" + block, "x.md")
    assert [(t.line, t.exit_code, t.slow) for t in tagged] == [(2, 2, False)]
    assert tagged[0].commands == ((".venv/bin/python -m lifecycle demo --timeout 0", ("demo: refused",)),)
    with pytest.raises(ValueError, match=r"x\.md:2: bad tag"):
        find_transcripts("<!-- transcript fast -->\n" + block, "x.md")
    with pytest.raises(ValueError, match="must run python -m lifecycle"):
        find_transcripts("<!-- transcript -->\n```console\n$ echo hi\nhi\n```\n", "x.md")
