"""The demo refuses a bad option before torchrun starts, naming the flag; a rendezvous it cannot reach never hangs.

On the old launcher every case here started torchrun: the ranks died with a traceback
naming a config field (``timeout_s``), or trained fully before the folder was found
unusable, or (``--fail-step 0``, past ``--steps``) ran with another value than asked.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest
from support.launch import free_port, run_demo

STARTED = " steps, rendezvous "
"""Printed by the launcher right before it starts torchrun."""


def refused(tmp_path: Path, *args: str) -> str:
    """Run the demo with ``args`` (journals: ``tmp_path/journal``); assert exit 2 before torchrun; the last line."""
    journal = tmp_path / "journal"
    started = time.monotonic()
    done = run_demo(*args, "--steps=20", f"--journal-dir={journal}", timeout=30, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert time.monotonic() - started < 10, done.stdout
    assert STARTED not in done.stdout and "Traceback" not in done.stdout, done.stdout
    assert not (journal / "rank0.jsonl").is_file() or (journal / "rank0.jsonl").stat().st_size == 0
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--timeout=0"], "--timeout"),
        (["--timeout=-5"], "--timeout"),
        (["--timeout=nan"], "--timeout"),
        (["--checkpoint-interval=-1"], "--checkpoint-interval"),
        (["--eval-interval=-1"], "--eval-interval"),
        (["--log-interval=-1"], "--log-interval"),
        (["--fail-at=step", "--fail-step=-3"], "--fail-step"),
        (["--fail-at=step", "--fail-step=0"], "--fail-step"),  # old: silently replaced by the default
        (["--fail-at=step", "--fail-step=21"], "--fail-step"),  # old: never fired, and the run "succeeded"
        (["--fail-at=dist", "--fail-step=3"], "--fail-step"),
        (["--fail-step=3"], "--fail-step"),
        (["--fail-at=step", "--fail-rank=2"], "--fail-rank"),
        (["--fail-at=eval", "--eval-interval=0"], "--eval-interval"),
        (["--nproc=0"], "--nproc"),
        (["--nproc=1000000"], "--nproc"),  # old: accepted, and drove the machine towards out-of-memory
        (["--master-port=70000"], "--master-port"),
        (["--master-addr="], "--master-addr"),
    ],
)
def test_a_bad_number_is_refused_naming_its_flag(tmp_path: Path, args: list[str], flag: str) -> None:
    """A value no rank could run with: exit 2 before torchrun starts, the last line naming the flag."""
    assert refused(tmp_path, *args).startswith(f"demo: {flag} "), args


def test_too_many_ranks_for_the_memory_says_what_a_rank_needs(tmp_path: Path) -> None:
    """--nproc beyond the available memory is refused with the memory a rank needs (measured) and what is free."""
    last = refused(tmp_path, "--nproc=1000000")
    assert "each rank needs about 400 MB" in last and "available" in last, last


def test_ranks_beyond_the_cores_are_a_warning_not_a_refusal(tmp_path: Path) -> None:
    """More ranks than CPU cores only warns (the run would go on; here a bad folder stops it next)."""
    cores = len(os.sched_getaffinity(0))
    done = run_demo(f"--nproc={cores + 1}", "--journal-dir=/proc/lifecycle-demo", timeout=30, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert f"warning: --nproc {cores + 1} ranks share {cores} CPU cores" in done.stdout, done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("demo: --journal-dir "), done.stdout


@pytest.mark.parametrize("which", ["--journal-dir", "--checkpoint-dir"])
@pytest.mark.parametrize("kind", ["a file", "read-only", "not creatable"])
def test_an_unusable_folder_is_refused_before_anything_starts(tmp_path: Path, which: str, kind: str) -> None:
    """A journal or checkpoint folder that is a file, read-only or not creatable: exit 2 at once (old: late)."""
    target = {
        "a file": tmp_path / "file",
        "read-only": Path("/proc"),  # read-only even for root
        "not creatable": Path("/proc/lifecycle-demo/folder"),
    }[kind]
    (tmp_path / "file").write_text("not a folder\n")
    args = [f"{which}={target}", "--steps=20"]
    if which == "--checkpoint-dir":
        args.append(f"--journal-dir={tmp_path / 'journal'}")
    started = time.monotonic()
    done = run_demo(*args, timeout=30, cwd=tmp_path)
    assert done.returncode == 2, done.stdout
    assert time.monotonic() - started < 10 and STARTED not in done.stdout, done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith(f"demo: {which} {target} "), done.stdout


def test_a_folder_that_holds_journals_is_refused(tmp_path: Path) -> None:
    """A journal folder that already holds rank journals is refused: the verdict must be this run's."""
    (tmp_path / "journal").mkdir()
    (tmp_path / "journal" / "rank0.jsonl").write_text("")
    assert refused(tmp_path).startswith("demo: --journal-dir "), "its own rank0.jsonl made it refuse"


@pytest.mark.parametrize("port", [[], ["--master-port=29613"]])
def test_an_address_that_does_not_resolve_is_refused_at_once(tmp_path: Path, port: list[str]) -> None:
    """An unresolvable --master-addr: exit 2 naming it (old: a gaierror traceback, or a hang of over 700 s)."""
    last = refused(tmp_path, "--master-addr=no.such.host.invalid", *port)
    assert last.startswith("demo: --master-addr 'no.such.host.invalid' does not resolve"), last


def test_a_port_in_use_is_refused_naming_it(tmp_path: Path) -> None:
    """An explicit --master-port that something listens on here: exit 2 naming it (old: torchrun's traceback)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        last = refused(tmp_path, f"--master-port={port}")
    assert last.startswith(f"demo: --master-port {port} is in use"), last


@pytest.mark.timeout(90)
def test_an_unreachable_rendezvous_fails_within_the_timeout_naming_the_address(tmp_path: Path) -> None:
    """An address that resolves but is not this machine's: the run fails within --timeout plus start-up, naming it.

    192.0.2.99 (TEST-NET-1, documentation only) is no host here. The old launcher passed
    torchrun no rendezvous timeout: its default is 15 minutes (without --master-port it
    failed at once, with a traceback, binding a free port on that address).
    """
    journal = tmp_path / "journal"
    args = ["--master-addr=192.0.2.99", f"--master-port={free_port()}", "--timeout=3", f"--journal-dir={journal}"]
    started = time.monotonic()
    done = run_demo(*args, timeout=80, cwd=tmp_path)
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stdout
    assert elapsed < 40, (elapsed, done.stdout[-3000:])
    assert "--master-addr 192.0.2.99 (192.0.2.99) is not an address of this machine" in done.stdout, done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("demo: FAILED") and "192.0.2.99:" in last, last


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
