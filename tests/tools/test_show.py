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
from support.journals import v1_failed_call

from lifecycle import FaultInjection, InjectedFault, Phase, pretrain
from lifecycle._core.journal import read
from lifecycle._tools.show import final_states, show_main


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
    """A whole line that is not a JSON record makes show exit 2, naming the file and line."""
    bad = tmp_path / "rank0.jsonl"
    bad.write_text("not json\n")
    assert show_main([str(bad)]) == 2
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


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
