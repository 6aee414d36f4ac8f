"""The examples of the README and docs/*.md run in the order each lists them, torchrun ones included (slow).

One folder per document, as a newcomer pasting each example in turn would have: every
``<!-- file: NAME -->`` block is written when it comes up, and every ``<!-- run: shell -->``
and ``<!-- run: shell slow -->`` block's commands run there in the document's order,
each checked against the lines its transcript shows (``tests/support/readme.py``). The
tests below then read what particular commands printed. Also: the demo on 4 ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.launch import demo_command, run_bounded
from support.readme import DOCUMENTS, document_blocks, run_shell, write_files

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


class ReadmeRun:
    """What running each document in order left: its folders, and each command with its output."""

    def __init__(self, root: Path) -> None:
        """Run every tagged shell block of each document in order, in a folder of its own under ``root``."""
        self.folders: dict[str, Path] = {}
        self.outputs: list[tuple[str, str]] = []
        for document in DOCUMENTS:
            blocks = document_blocks(document)
            if not any(block.kind == "shell" for block in blocks):
                continue
            folder = root / document.stem
            folder.mkdir()
            self.folders[document.name] = folder
            write_files([], folder)  # the .venv link
            for block in blocks:
                if block.kind == "file":
                    write_files([block], folder)
                elif block.kind == "shell":
                    ran = run_shell(block, folder, timeout_s=200)
                    self.outputs += [(command.command, output) for command, output in ran]

    @property
    def folder(self) -> Path:
        """The README's folder."""
        return self.folders["README.md"]

    def output(self, *words: str) -> str:
        """The output of the one command containing every word of ``words``; AssertionError if not exactly one."""
        found = [out for command, out in self.outputs if all(word in command for word in words)]
        assert len(found) == 1, f"expected one documented command with {words}, found {len(found)}"
        return found[0]


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> ReadmeRun:
    """The documents' commands, run once each in its order, one folder per document."""
    return ReadmeRun(tmp_path_factory.mktemp("readme"))


def test_the_readme_examples_run_in_the_order_listed_in_one_folder(readme_run: ReadmeRun) -> None:
    """Every tagged command runs after the ones above it, in its document's folder, and prints what it shows."""
    # The old README ran train.py on one process, then under torchrun, both in checkpoints/:
    # the torchrun run resumed the one-rank step 20 and never failed at step 12.
    commands = [command for command, _ in readme_run.outputs]
    assert sum("torchrun" in command for command in commands) >= 3, commands
    assert sum("torchrun" not in command for command in commands) >= 2, commands
    for name in ("train-checkpoints-1-tp1", "train-checkpoints-2-tp2"):
        assert (readme_run.folder / name / "latest").is_file()


def test_the_readme_retry_loop_resumes_on_two_tensor_parallel_ranks(readme_run: ReadmeRun) -> None:
    """README train.py on 2 TP ranks: rank 0 fails at step 12, rank 1's error notes it, both resume from 10, close."""
    out = readme_run.output("torchrun", "train.py")
    assert "failed: InjectedFault: injected failure at phase 'step' on rank 0, step 12" in out, out[-3000:]
    assert "  lifecycle: rank 0 failed first (step 12, phase step): InjectedFault" in out, out[-3000:]
    assert out.count("steps 10→20, closed") == 2, out[-3000:]


def test_the_own_loop_makes_one_world_of_two_ranks_and_commits_its_last_save(readme_run: ReadmeRun) -> None:
    """docs/howto.md own_loop.py under torchrun: one world of 2 ranks (not two of 1), step 100 committed."""
    # The old example hard-coded world_size=1, rank=0: two one-rank worlds on one folder.
    out = readme_run.output("torchrun", "own_loop.py")
    for rank in (0, 1):
        assert f"rank {rank} of 2: steps 0→100, committed step 100" in out, out[-3000:]
    latest = readme_run.folders["howto.md"] / "own-loop-checkpoints-2" / "latest"
    assert latest.read_text(encoding="utf-8").strip() == '{"step": 100}'


def test_the_in_process_restart_recovers_on_two_ranks(readme_run: ReadmeRun) -> None:
    """docs/howto.md train_inprocess.py: rank 1 fails once, the Wrapper restarts both, both close at step 6."""
    out = readme_run.output("torchrun", "train_inprocess.py")
    for rank in (0, 1):
        assert f"rank {rank}: step 6, closed" in out, out[-3000:]


def test_readme_command_lookup_refuses_a_missing_command(readme_run: ReadmeRun) -> None:
    """A README command that is not there fails loudly instead of checking nothing."""
    with pytest.raises(AssertionError):
        readme_run.output("no_such_script.py")


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
