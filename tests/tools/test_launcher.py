"""The demo launcher's collection of orphans: a rank re-parented while still exiting is collected, not left to init."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from lifecycle._launch.launcher import become_subreaper, reap_orphans
    if not become_subreaper():
        print("no subreaper"); sys.exit(0)
    child = os.fork()
    if child == 0:
        if os.fork() == 0:  # the grandchild: still running when its parent is collected
            time.sleep(0.5)
            os._exit(0)
        os._exit(0)
    os.waitpid(child, 0)
    reaped = reap_orphans(within_s=float(sys.argv[1]))
    try:
        left = os.waitpid(-1, os.WNOHANG)[0] == 0
    except ChildProcessError:
        left = False
    print(len(reaped), left)
    """
)


@pytest.mark.timeout(60)
def test_reap_orphans_waits_for_an_orphan_still_exiting_and_collects_it() -> None:
    """reap_orphans(within_s) collects a re-parented process that ends after the call began, leaving no child behind."""
    out = subprocess.run([sys.executable, "-c", _SCRIPT, "10"], capture_output=True, text=True, timeout=50, check=True)
    if out.stdout.strip() == "no subreaper":
        pytest.skip("prctl(PR_SET_CHILD_SUBREAPER) is not available here")
    assert out.stdout.split() == ["1", "False"], out
