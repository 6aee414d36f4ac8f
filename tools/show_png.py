"""``make show-png``: regenerate ``docs/show.png``, the README's picture of ``show --html`` on a failed demo run.

Runs the demo on 4 ranks with rank 2 killed (``--fault crash``) at step 80 of 100,
writes the page with ``python -m lifecycle show --html``, and screenshots it with
headless Chromium (``make chromium``) in a fixed 1,400 x 1,100 window. Exit code 0 when
the picture was written, 1 otherwise (the reason on stderr).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SIZE = (1400, 1100)
"""The screenshot's size in pixels, fixed so that a regenerated picture differs only where the page does."""

DEMO = ["--nproc", "4", "--steps", "100", "--fail-at", "step", "--fail-rank", "2", "--fail-step", "80",
        "--fault", "crash", "--liveness-interval", "0.25", "--log-interval", "50"]  # fmt: skip
"""The demo's failing run that the picture shows."""


def main(target: Path) -> int:
    """Run the demo, write its page, screenshot it to ``target``; the exit code."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("show_png: chromium is not installed (make chromium)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        journals, page = Path(tmp) / "journals", Path(tmp) / "show.html"
        demo = subprocess.run([sys.executable, "-m", "lifecycle", "demo", *DEMO, "--journal-dir", str(journals)],
                              capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
        if demo.returncode != 1 or "FAILED" not in demo.stdout:
            print(f"show_png: the demo did not fail as planned (exit {demo.returncode}):\n{demo.stdout[-3000:]}")
            return 1
        shown = subprocess.run([sys.executable, "-m", "lifecycle", "show", str(journals), "--out",
                                str(Path(tmp) / "diagrams"), "--html", str(page)],
                               capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        if shown.returncode != 0:
            print(f"show_png: show failed (exit {shown.returncode}): {shown.stderr}", file=sys.stderr)
            return 1
        target.parent.mkdir(parents=True, exist_ok=True)
        shot = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               f"--window-size={SIZE[0]},{SIZE[1]}", f"--user-data-dir={Path(tmp) / 'profile'}",
                               f"--screenshot={target.resolve()}", page.as_uri()],
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        if not target.is_file():
            print(f"show_png: chromium wrote no screenshot: {shot.stderr[-2000:]}", file=sys.stderr)
            return 1
    print(f"show_png: wrote {target} ({SIZE[0]} x {SIZE[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/show.png")))
