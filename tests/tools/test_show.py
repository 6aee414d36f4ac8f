"""``python -m lifecycle show``: timelines and diagrams from journals, v2 and v1, whole or torn.

``read`` and ``final_states`` are private helpers, pinned here on purpose: the demo's verdict is built on them.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from support.configs import config_of_one
from support.internals import gantt
from support.journals import v1_failed_call

from lifecycle import FaultInjection, InjectedFault, Phase, pretrain
from lifecycle._tools.show.main import final_states, render_timeline, show_main, write_diagrams
from lifecycle._tools.show.model import build
from lifecycle.journal import Origin, Record, RunEnd, RunStart, TeardownStep, TrainStep, Transition, read


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
    assert "ended closed after step 3 (exit: iterations); loss" in printed
    failed_path = (out / "attempt0.mmd").read_text()
    assert "class uninitialized,dist_ready,globals_ready,failed taken" in failed_path
    assert (
        "class uninitialized,dist_ready,globals_ready,training,finalizing,closed taken"
        in (out / "attempt1.mmd").read_text()
    )
    if shutil.which("dot"):
        assert (out / "attempt1.svg").stat().st_size > 0


def test_show_rejects_a_file_that_is_not_a_journal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file of no journal record makes show exit 2 saying so in one line; with ``--strict``, naming file and line."""
    bad = tmp_path / "rank0.jsonl"
    bad.write_text("not json\n")
    assert show_main([str(bad)]) == 2
    assert (
        capsys.readouterr().err
        == f"no journal records in {bad}: {bad}: not a journal (no line of it is a journal record) — skipped\n"
    )
    assert show_main([str(bad), "--strict"]) == 2
    assert f"{bad}:1" in capsys.readouterr().err


def test_show_reads_a_journal_whose_last_line_is_torn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A journal cut mid-record (a killed writer) is shown up to its last whole record; the torn line is noted."""
    pretrain(config_of_one(tmp_path, iterations=4))
    path = tmp_path / "journal" / "rank0.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if '"step": 3' in line and '"kind": "step"' in line)
    path.write_text("".join(lines[:cut]) + lines[cut][:40])  # torn in the middle of step 3's record
    assert show_main([str(path), "--out", str(tmp_path / "d")]) == 0
    captured = capsys.readouterr()
    assert "no end record (killed?) in state training — last step 2" in captured.out
    assert "globals_ready → training" in captured.out
    assert f"{path}:{cut + 1}: torn line skipped" in captured.err
    assert final_states(read([path])) == {0: "?"}


def test_show_reads_a_version_1_journal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A journal written in the v1 format (records built after the call) is still shown: path, outcome, losses."""
    path = tmp_path / "rank0.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in v1_failed_call()))
    assert show_main([str(path)]) == 0
    printed = capsys.readouterr().out
    assert "run v1" in printed and "attempt 0" in printed
    assert "ended failed after step 2: InjectedFault: boom; loss 3.000 (step 1) → 2.500 (step 2)" in printed
    assert "+0.900s  dist_ready → failed" in printed and "+1.000s      teardown abort_process_group" in printed
    assert "class uninitialized,dist_ready,failed taken" in (tmp_path / "attempt0.mmd").read_text()
    assert final_states(read([path])) == {0: "failed"}


def _restarted_call(rank: int, restarts: int, attempt: int, at: float, *, killed: bool) -> list[Record]:
    """One rank's call in torchrun restart ``restarts``: start, group (attempt, prefix), a step, maybe an end."""
    origin = Origin("job", rank, attempt, "ordinary", 0, restart_count=restarts)
    records: list[Record] = [
        RunStart(origin=origin, world_size=2, pid=100 + restarts, host="h", start=at),
        Transition(origin=origin, source="uninitialized", dest="dist_ready", trigger="init_distributed", start=at,
                   end=at + 0.1, agreed_attempt=attempt, store_prefix=f"lifecycle/g{restarts}/attempt-{attempt}"),
        TrainStep(origin=origin, step=restarts * 2 + 1, loss=2.0, start=at + 0.2, end=at + 0.3),
    ]  # fmt: skip
    if not killed:
        records += [
            Transition(origin=origin, source="dist_ready", dest="closed", trigger="close", start=at + 0.4,
                       end=at + 0.5),
            RunEnd(origin=origin, state="closed", exit_reason="iterations", final_step=4, checkpoint_step=4,
                   error=None, end=at + 0.6),
        ]  # fmt: skip
    return records


def test_show_presents_torchrun_restarts_as_successive_attempts_of_one_run(tmp_path: Path) -> None:
    """Restart counts 0, 0, 1, 2 (each new worker's attempt from 0) read as attempts 0-3, in order, one diagram each."""
    calls = [  # out of order on purpose: restarts are ordered by (restart count, attempt), not by appearance
        *(_restarted_call(rank, 2, 0, 30.0, killed=False) for rank in (0, 1)),
        *(_restarted_call(rank, 0, 0, 10.0, killed=rank == 1) for rank in (0, 1)),
        *(_restarted_call(rank, 1, 0, 20.0, killed=rank == 0) for rank in (0, 1)),
        *(_restarted_call(rank, 0, 1, 15.0, killed=rank == 1) for rank in (0, 1)),
    ]
    model = build([r for call in calls for r in call])
    lines = render_timeline(model)
    headers = [line for line in lines if not line.startswith(" ")]
    assert headers == [
        "run job",
        "attempt 0 (torchrun restart 0)",
        "attempt 1 (torchrun restart 0)",
        "attempt 2 (torchrun restart 1)",
        "attempt 3 (torchrun restart 2)",
    ]
    third = lines[lines.index("attempt 2 (torchrun restart 1)") :]
    assert (
        third[1].startswith("  rank 0: no end record (killed?)") and "store prefix lifecycle/g1/attempt-0" in third[3]
    )
    written = {path.name for path in write_diagrams(model, tmp_path)}
    assert {name for name in written if name.endswith(".mmd")} == {f"attempt{n}.mmd" for n in range(4)}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_a_release_by_the_restart_wrappers_abort_is_in_the_ranks_timeline_and_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``wrapper_abort`` record prints as the Wrapper's (in its words, without a note) and labels its bar so."""
    origin = Origin("job", 0, 0, "inprocess", 0)
    records: list[Record] = [
        RunStart(origin=origin, world_size=2, pid=1, host="h", start=10.0),
        Transition(origin=origin, source="globals_ready", dest="training", trigger="start_training", start=10.1,
                   end=10.2),
        TeardownStep(origin=origin, outcome="wrapper_abort", step="abort_process_group", resource="process_group",
                     owner="restart_wrapper", start=10.5, end=10.51),
        Transition(origin=origin, source="training", dest="failed", trigger="fail", start=10.6, end=10.7,
                   detail="RuntimeError: Connection closed by peer"),
    ]  # fmt: skip
    path = tmp_path / "rank0.jsonl"
    path.write_text("".join(json.dumps(record.to_json()) + "\n" for record in records))
    assert show_main([str(path), "--out", str(tmp_path / "d")]) == 0
    printed = capsys.readouterr().out
    line = next(line for line in printed.splitlines() if "abort_process_group" in line)
    assert "wrapper  abort_process_group" in line and "(released by the restart wrapper's abort)" in line
    assert ("wrapper abort abort_process_group", "", 10.5, 10.51) in gantt.bars(records, detail=True)
