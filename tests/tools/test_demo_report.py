"""The demo's report: it reads the journals once into ``show``'s model and every view and the verdict read that model.

Torch-free: the journals are synthetic (``synthetic.failing_run``), written by the real writer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support.internals import show_model, synthetic

from lifecycle._tools.demo import report as demo_report
from lifecycle.journal import Record


def _run(folder: Path, *, removed: bool = False) -> demo_report.Run:
    """The report's view of a 2-rank run ``r`` whose journals are in ``folder``."""
    return demo_report.Run(folder, 2, "r", "127.0.0.1:29500", True, 30.0, removed)


def test_the_report_builds_the_model_once_for_every_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed run's report (timeline, diagrams, page, cause) builds show's model of the journals exactly once."""
    synthetic.write(tmp_path, synthetic.failing_run("r", 2, 2))
    built: list[int] = []
    build = show_model.build

    def counting(records: list[Record]) -> show_model.Model:
        built.append(len(records))
        return build(records)

    monkeypatch.setattr(show_model, "build", counting)
    code = demo_report.report(_run(tmp_path), demo_report.Ending(returncode=1), 1.0)
    out = capsys.readouterr().out
    assert code == 1 and len(built) == 1
    assert (tmp_path / "show.html").is_file() and "attempt 1" in out
    assert "demo: FAILED in 1.0 s: rank 1" in out


def test_the_report_without_journals_builds_no_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no journal, the report says so, draws nothing, and blames the start-up, without building a model."""

    def refused(records: list[Record]) -> show_model.Model:
        raise AssertionError("no records: no model to build")

    monkeypatch.setattr(show_model, "build", refused)
    code = demo_report.report(_run(tmp_path), demo_report.Ending(returncode=1), 1.0)
    out = capsys.readouterr().out
    assert code == 1 and "(no journal records)" in out and "no rank wrote a journal" in out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
