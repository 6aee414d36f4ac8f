"""The demo: torchrun, 2 ranks, gloo; its report read from the journals; no process left running after it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from support.internals import final_states
from support.launch import demo_command, run_demo, suite_env

from lifecycle.journal import Origin, RunEnd, RunStart, TrainStep, read
from lifecycle.testing import run_command


def by_attempt(journal_dir: Path) -> dict[int, dict[int, str]]:
    """Each attempt's end state per rank."""
    states: dict[int, dict[int, str]] = {}
    for record in read([journal_dir]):
        if isinstance(record, RunEnd):
            states.setdefault(record.origin.attempt, {})[record.origin.rank] = record.state
    return states


@pytest.mark.timeout(120)
def test_the_demo_trains_two_ranks_and_the_loss_falls(tmp_path: Path) -> None:
    """The demo's default run, shortened: exit 0, progress and timelines shown, loss falls, diagrams written.

    Other *.jsonl files in the folder (one a journal of another run that failed) are
    not this run's: the verdict ignores them, with a note. The old demo read every
    *.jsonl of the folder and printed FAILED after every rank had closed.
    """
    other = Origin("another-run", 0, 0, "ordinary", 0)
    foreign = [
        RunStart(origin=other, world_size=1, pid=1, host="h", start=1.0),
        RunEnd(origin=other, state="failed", exit_reason=None, final_step=3, checkpoint_step=None, error="x", end=2.0),
    ]
    (tmp_path / "old-rank0.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in foreign))
    (tmp_path / "metrics.jsonl").write_text('{"loss": 1.5}\nnot even json\n')
    done = run_demo("--steps", "60", "--journal-dir", str(tmp_path), timeout=110, cwd=tmp_path)
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("demo: succeeded"), done.stdout
    assert "old-rank0.jsonl: ignored" in done.stdout, done.stdout
    assert "tokens/s" in done.stdout and "finalizing → closed" in done.stdout
    assert by_attempt(tmp_path) == {0: {0: "closed", 1: "closed"}}
    records = read([tmp_path])  # rank<R>.jsonl only
    assert len({r.origin.run_id for r in records}) == 1 and records[0].origin.run_id.startswith("demo-")
    losses = [r.loss for r in records if isinstance(r, TrainStep) and r.origin.rank == 0]
    assert len(losses) == 60
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first / 2, (first, last)
    assert (tmp_path / "attempt0.mmd").is_file()


@pytest.mark.slow  # 20 s; test_demo_recovery and the tutorial's retry transcript run it too
@pytest.mark.timeout(120)
def test_a_failure_on_one_rank_does_not_hang_and_a_retry_succeeds(tmp_path: Path) -> None:
    """Rank 1 fails mid-training: both ranks fail fast, retry in the same processes, resume and close."""
    args = ["--steps", "30", "--fail-at", "step", "--fail-rank", "1", "--retry", "--journal-dir", str(tmp_path)]
    started = time.monotonic()
    done = run_demo(*args, timeout=110, cwd=tmp_path)
    assert done.returncode == 0, done.stdout
    # Rank 0 learns of the failure from its next collective, not from the 30 s group timeout.
    assert time.monotonic() - started < 60
    assert by_attempt(tmp_path) == {0: {0: "failed", 1: "failed"}, 1: {0: "closed", 1: "closed"}}
    assert "resumed from step" in done.stdout
    assert "InjectedFault: injected failure at phase 'step' on rank 1, step 15" in done.stdout
    # Issue 14: each attempt's verdict names its cause (issue 27: in plain words); the gantt chart and the page are
    # written.
    assert "  verdict: rank 1 raised in the training step at step 15: InjectedFault" in done.stdout
    assert "verdict: no rank failed: all 2" in done.stdout
    assert (tmp_path / "attempt0-gantt.mermaid").is_file() and (tmp_path / "show.html").is_file()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_failed_demo_exits_nonzero(tmp_path: Path) -> None:
    """Without --retry, a failure in a callback on rank 0 makes the demo exit 1, promptly."""
    args = ["--steps", "20", "--fail-at", "callback", "--fail-rank", "0", "--journal-dir", str(tmp_path)]
    done = run_demo(*args, timeout=110, cwd=tmp_path)
    assert done.returncode == 1, done.stdout
    assert final_states(read([tmp_path]))[0] == "failed"
    assert "demo: FAILED" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_temporary_folder_is_removed_at_exit_unless_kept(tmp_path: Path) -> None:
    """Without --journal-dir the demo's /tmp/lifecycle-demo-* folder is gone after the run; --keep keeps it.

    The old demo left one (about 6 MB with its checkpoints) behind after every run.
    """
    env = suite_env({"TMPDIR": str(tmp_path)})
    for keep in ([], ["--keep"]):
        done = run_command(demo_command("--nproc=1", "--steps=4", *keep), timeout_s=120, env=env, cwd=tmp_path)
        assert done.returncode == 0 and not done.timed_out and not done.left_behind, done.output[-3000:]
        left = sorted(p.name for p in tmp_path.glob("lifecycle-demo-*"))
        if keep:
            assert len(left) == 1 and (tmp_path / left[0] / "show.html").is_file(), (left, done.output[-3000:])
            assert "see it again with:" in done.output, done.output[-3000:]
        else:
            assert left == [], done.output[-3000:]
            assert "is a temporary folder, removed at exit (--keep keeps it" in done.output, done.output[-3000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
