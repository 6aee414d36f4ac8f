"""``show --html``'s page in a real browser: headless Chromium (Debian's ``chromium``; ``make chromium``).

The page of a failed 4-rank run and of a 1,024-rank run is opened in a 1,400 x 1,000
window: a screenshot is taken, and a probe script (appended to a copy of the page:
the page itself runs no script) reads the laid-out DOM, which ``--dump-dom`` prints:
one timeline row per rank (at most 16 rows past 16 ranks, the cause's kept), the
cause's row carries the cause mark, no element reaches past the window's right edge.
A page with a 3,000-pixel element shows the width check can fail. Skipped where
``chromium`` is not installed (``make chromium`` installs it as root); a failure under
``CI=true``.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.internals import show_main, synthetic

from lifecycle.journal import Origin, Record

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WINDOW = (1400, 1000)
"""The browser window: the page must fit its width."""

PROBE = """<script>
(() => {
  const timelines = [...document.querySelectorAll('svg.timeline')].map(svg => ({
    ranks: [...svg.querySelectorAll('g.row')].map(g => g.dataset.rank),
    culprits: [...svg.querySelectorAll('g.row[data-cause="true"]')].map(
      g => ({rank: g.dataset.rank, marks: g.querySelectorAll('.cause').length})),
    marks: svg.querySelectorAll('.cause').length,
  }));
  let widest = 0, what = '';
  for (const el of document.body.querySelectorAll('*')) {
    const right = el.getBoundingClientRect().right;
    if (right > widest) { widest = right; what = el.tagName + ' ' + (el.getAttribute('class') || ''); }
  }
  const out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({timelines, widest, what, scroll: document.documentElement.scrollWidth,
                                    inner: window.innerWidth});
  document.body.appendChild(out);
})();
</script>"""
"""Appended to a copy of the page: measures the laid-out page and writes what it found into the DOM."""


def chromium() -> str:
    """The ``chromium`` program; skipped without it (a failure under ``CI=true``)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        why = "chromium is not installed (make chromium installs Debian's package, as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; CI=true: the browser check must run")
        pytest.skip(why)
    return found


def browse(page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on ``page`` in a ``WINDOW``-sized window, with ``args`` (``--dump-dom``, ``--screenshot``)."""
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--user-data-dir={tmp_path / 'profile'}",
               *args, page.as_uri()]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def probe(page: Path, tmp_path: Path) -> dict[str, Any]:
    """What ``PROBE`` measures on a copy of ``page`` laid out in the window."""
    probed = tmp_path / f"probed-{page.name}"
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    done = browse(probed, tmp_path, "--dump-dom")
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.DOTALL)
    assert found is not None, done.stdout[-2000:] + done.stderr[-2000:]
    result: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return result


def page_of(tmp_path: Path, name: str, ranks: dict[int, list[Record]]) -> Path:
    """``show --html`` of ``ranks``' journals: the page's path."""
    synthetic.write(tmp_path / name, ranks)
    page = tmp_path / f"{name}.html"
    assert show_main([str(tmp_path / name), "--out", str(tmp_path / name / "d"), "--html", str(page)]) == 0
    return page


def four_ranks() -> dict[int, list[Record]]:
    """4 ranks: rank 2 raises (notice 1), the others fail on the broken connection after it."""
    ranks: dict[int, list[Record]] = {}
    for rank in range(4):
        how: dict[str, Any] = {"end": "failed", "fail_at": 1000.5, "error": "InjectedFault: boom", "seq": 1}
        if rank != 2:
            how = {"end": "failed", "fail_at": 1000.55 + rank / 100, "error": "RuntimeError: Connection closed by peer",
                   "seq": 2 + rank, "first_rank": 2}  # fmt: skip
        ranks[rank] = synthetic.rank_call(Origin("r", rank, 0, "ordinary", 0), 4, 1000.0, steps=30, **how)
    return ranks


def test_the_page_renders_one_row_per_rank_the_cause_marked_within_the_window(tmp_path: Path) -> None:
    """4 ranks: a screenshot of the window's size; one timeline row per rank, rank 2's (the cause) with the cause
    mark, nothing past 1,400 pixels, no horizontal scroll."""
    page = page_of(tmp_path, "four", four_ranks())
    shot = tmp_path / "shot.png"
    done = browse(page, tmp_path, f"--screenshot={shot}")
    assert shot.is_file(), done.stderr[-2000:]
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == WINDOW
    found = probe(page, tmp_path)
    assert found["inner"] == WINDOW[0]
    (timeline,) = found["timelines"]
    assert timeline["ranks"] == ["0", "1", "2", "3"]
    assert timeline["culprits"] == [{"rank": "2", "marks": 1}] and timeline["marks"] == 1
    assert found["widest"] <= WINDOW[0] and found["scroll"] <= WINDOW[0], found


def test_a_1024_rank_page_keeps_the_culprits_row_and_fits(tmp_path: Path) -> None:
    """1,024 ranks, 2 attempts: each timeline has at most 16 rows, the cause's (rank 1) first and marked; the page
    fits the window and weighs far less than a MB."""
    page = page_of(tmp_path, "big", synthetic.failing_run("r", 1024, 2))
    assert page.stat().st_size < 1_000_000
    found = probe(page, tmp_path)
    assert len(found["timelines"]) == 2
    for timeline in found["timelines"]:
        assert timeline["ranks"][0] == "1" and len(timeline["ranks"]) <= 16, timeline
        assert timeline["culprits"] == [{"rank": "1", "marks": 1}]
    assert found["widest"] <= WINDOW[0] and found["scroll"] <= WINDOW[0], found


def test_the_width_check_can_fail(tmp_path: Path) -> None:
    """A page with a 3,000-pixel element: the probe reports it past the window (the check above can fail)."""
    wide = tmp_path / "wide.html"
    wide.write_text('<!doctype html><html><body><div style="width:3000px">wide</div></body></html>')
    found = probe(wide, tmp_path)
    assert found["widest"] > WINDOW[0] and found["scroll"] > WINDOW[0]
