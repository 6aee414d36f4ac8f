"""The README's torchrun examples, run as written, and the demo on 4 ranks (slow: ``make test-slow``)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from support.launch import REPO, demo_command, free_port, run_bounded

pytestmark = pytest.mark.slow

README = REPO / "README.md"


def readme_block(first_line: str) -> str:
    """The README's fenced Python block whose first line is ``first_line``; fails if there is none."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    found = [block for block in blocks if block.startswith(first_line)]
    assert len(found) == 1, f"expected one README block starting {first_line!r}, found {len(found)}"
    return found[0]


def torchrun(script: Path, nproc: int) -> list[str]:
    """The README's torchrun line for ``script`` on ``nproc`` local ranks, on a free port."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        f"--master-port={free_port()}",
        str(script),
    ]


def run_readme_script(first_line: str, tmp_path: Path) -> str:
    """Write the README block named by ``first_line`` (``# <file>.py: ...``) and run it on 2 ranks; its output."""
    script = tmp_path / first_line.removeprefix("# ")
    script.write_text(readme_block(first_line), encoding="utf-8")
    done = run_bounded(torchrun(script, 2), timeout=200, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    return done.stdout


@pytest.mark.timeout(240)
def test_the_readme_retry_loop_resumes_on_two_ranks(tmp_path: Path) -> None:
    """README train.py under torchrun: rank 0 fails at step 12, both retries resume from step 10 and close."""
    out = run_readme_script("# train.py", tmp_path)
    assert "failed: injected failure at phase 'step' on rank 0, step 12" in out, out[-3000:]
    assert out.count("steps 10→20, closed") == 2, out[-3000:]


@pytest.mark.timeout(240)
def test_the_readme_in_process_restart_recovers_on_two_ranks(tmp_path: Path) -> None:
    """README train_inprocess.py under torchrun: rank 1 fails once, the Wrapper restarts both, both close at 6."""
    out = run_readme_script("# train_inprocess.py", tmp_path)
    for rank in (0, 1):
        assert f"rank {rank}: step 6, closed" in out, out[-3000:]


@pytest.mark.timeout(300)
def test_the_demo_on_four_ranks_fails_one_rank_and_the_retry_closes_all(tmp_path: Path) -> None:
    """Four torchrun ranks: rank 3 fails in a step, no rank hangs, and every rank's retry ends closed."""
    journal = tmp_path / "journal"
    command = demo_command(
        "--nproc=4", "--steps=40", "--fail-at=step", "--retry", "--timeout=20", f"--journal-dir={journal}"
    )
    done = run_bounded(command, timeout=280, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "demo: succeeded" in done.stdout, done.stdout[-3000:]
    for rank in range(4):
        assert f"rank {rank}: closed" in done.stdout, done.stdout[-3000:]


def test_readme_block_lookup_refuses_a_missing_block() -> None:
    """A README block that is not there fails loudly instead of running nothing."""
    with pytest.raises(AssertionError):
        readme_block("# no such block")
