"""The demo (torchrun, 2 ranks, gloo) and the journal viewer."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest
from support.pretrain import config_of_one, demo_command, run_bounded

from lifecycle._core.journal import read
from lifecycle._tools.show import final_states, show_main
from lifecycle._training.config import FaultInjection, InjectedFault, Phase
from lifecycle._training.pretrain import pretrain


def by_attempt(journal_dir: Path) -> dict[int, dict[int, str]]:
    """Each attempt's end state per rank."""
    states: dict[int, dict[int, str]] = {}
    for record in read([journal_dir]):
        if record["kind"] == "end":
            states.setdefault(record["attempt"], {})[record["rank"]] = record["state"]
    return states


@pytest.mark.timeout(120)
def test_the_demo_trains_two_ranks_and_the_loss_falls(tmp_path: Path) -> None:
    """The demo's default run, shortened: exit 0, progress and timelines shown, loss falls, diagrams written."""
    done = run_bounded(demo_command("--steps", "60", "--journal-dir", str(tmp_path)), timeout=110, cwd=tmp_path)
    assert done.returncode == 0, done.stdout
    assert "tokens/s" in done.stdout and "finalizing → closed" in done.stdout
    assert by_attempt(tmp_path) == {0: {0: "closed", 1: "closed"}}
    losses = next(r["losses"] for r in read([tmp_path]) if r["kind"] == "end")
    first, last = sum(loss for _, loss in losses[:5]) / 5, sum(loss for _, loss in losses[-5:]) / 5
    assert last < first / 2, (first, last)
    assert (tmp_path / "attempt0.mmd").is_file()


@pytest.mark.timeout(120)
def test_a_failure_on_one_rank_does_not_hang_and_a_retry_succeeds(tmp_path: Path) -> None:
    """Rank 1 fails mid-training: both ranks fail fast, retry in the same processes, resume and close."""
    args = ["--steps", "30", "--fail-at", "step", "--fail-rank", "1", "--retry", "--journal-dir", str(tmp_path)]
    started = time.monotonic()
    done = run_bounded(demo_command(*args), timeout=110, cwd=tmp_path)
    assert done.returncode == 0, done.stdout
    # Rank 0 learns of the failure from its next collective, not from the 30 s group timeout.
    assert time.monotonic() - started < 60
    assert by_attempt(tmp_path) == {0: {0: "failed", 1: "failed"}, 1: {0: "closed", 1: "closed"}}
    assert "resumed from step" in done.stdout
    assert "InjectedFault: injected failure at phase 'step' on rank 1, step 15" in done.stdout


@pytest.mark.timeout(120)
def test_a_failed_demo_exits_nonzero(tmp_path: Path) -> None:
    """Without --retry, a failure in a callback on rank 0 makes the demo exit 1, promptly."""
    args = ["--steps", "20", "--fail-at", "callback", "--fail-rank", "0", "--journal-dir", str(tmp_path)]
    done = run_bounded(demo_command(*args), timeout=110, cwd=tmp_path)
    assert done.returncode == 1, done.stdout
    assert final_states(read([tmp_path]))[0] == "failed"
    assert "demo: FAILED" in done.stdout


def test_show_prints_the_timeline_and_highlights_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """show prints each attempt's transitions and teardown, and draws the taken edges per attempt."""
    with pytest.raises(InjectedFault):
        pretrain(config_of_one(tmp_path, fault=FaultInjection(Phase.SETUP)))
    pretrain(config_of_one(tmp_path), attempt=1)
    out = tmp_path / "diagrams"
    assert show_main([str(tmp_path / "journal"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "attempt 0" in printed and "globals_ready → failed" in printed and "abort_process_group" in printed
    assert "attempt 1" in printed and "finalizing → closed" in printed and "barrier" in printed
    failed_path = (out / "attempt0.mmd").read_text()
    assert "class uninitialized,dist_ready,globals_ready,failed taken" in failed_path
    assert (
        "class uninitialized,dist_ready,globals_ready,training,finalizing,closed taken"
        in (out / "attempt1.mmd").read_text()
    )
    if shutil.which("dot"):
        assert (out / "attempt1.svg").stat().st_size > 0


def test_show_rejects_a_file_that_is_not_a_journal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A line that is not a JSON record makes show exit 2, naming the file and line."""
    bad = tmp_path / "rank0.jsonl"
    bad.write_text("not json\n")
    assert show_main([str(bad)]) == 2
    assert f"{bad}:1" in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
