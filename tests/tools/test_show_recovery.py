"""show says when the launcher stopped a rank after a peer failed (issue 26): the end record's ``exit_reason``."""

from __future__ import annotations

from support.internals import render_timeline, show_model

from lifecycle.journal import Origin, RunEnd, RunStart

ORIGIN = Origin("run-stop", 0, 0, "ordinary", 0)


def _lines(error: str) -> str:
    """show's timeline of one rank whose failed call the launcher stopped, with ``error``."""
    records = [
        RunStart(origin=ORIGIN, world_size=2, pid=1, host="h", start=1.0),
        RunEnd(
            origin=ORIGIN,
            state="failed",
            exit_reason="stopped_by_launcher",
            final_step=19,
            checkpoint_step=15,
            error=error,
            end=2.0,
        ),
    ]
    return "\n".join(render_timeline(show_model.build(records)))


def test_a_failure_the_launcher_stopped_says_so() -> None:
    """A rank already failing when the launcher's SIGTERM came: its line says it was stopped, then its error."""
    text = _lines("RuntimeError: Connection reset by peer")
    assert "ended failed after step 19 (stopped by the launcher after a peer failed): RuntimeError" in text, text


def test_a_stoppedbylauncher_error_is_not_said_twice() -> None:
    """A ``StoppedByLauncher`` error already says it: the line shows the error alone."""
    text = _lines("StoppedByLauncher: stopped by the launcher (SIGTERM) after rank 1 died at step 20")
    assert "ended failed after step 19: StoppedByLauncher: stopped by the launcher (SIGTERM)" in text, text
