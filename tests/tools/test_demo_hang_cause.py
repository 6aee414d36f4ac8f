"""The demo's hang inside the training step, end to end (issue 37): no view names the victim the cause.

``--fault hang --fail-at step``: the hung rank sleeps inside its step, level with its
peer, so no liveness monitor can name it; the peer's receive times out at the group
timeout (10 s here) and the launcher stops the hung rank. Before issue 37 the demo's last
line, ``show`` and the page named the peer, the victim, "the cause, first in the store's
order of failure notices".
"""

from __future__ import annotations

import html
from pathlib import Path

import pytest
from support.launch import run_demo

from lifecycle.journal import Failure, read


@pytest.mark.slow  # the group timeout (10 s) and two ranks' start-up: about 40 s here
@pytest.mark.timeout(240)
@pytest.mark.parametrize("hung", [1, 0], ids=["fail-rank-1", "fail-rank-0"])
def test_the_demos_hang_in_the_step_names_no_victim_the_cause(tmp_path: Path, hung: int) -> None:
    """The demo's last line, ``show``'s page and every exception note say the cause is unknown and name the victim's
    timed-out receive as what was seen; nothing calls the victim the cause or "failed first"."""
    victim = 1 - hung
    args = [
        *("--steps", "200", "--fail-at", "step", "--fault", "hang", "--fail-rank", str(hung), "--timeout", "10"),
        *("--eval-interval", "0", "--journal-dir", str(tmp_path), "--keep"),
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
