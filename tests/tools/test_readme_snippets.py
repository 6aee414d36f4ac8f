"""The tagged examples of the README and docs/*.md run as written and print what they show (``make test``).

Tags and the comparison are defined in ``tests/support/readme.py``: ``<!-- run: python -->``
blocks must print exactly their ``# prints:`` lines; each ``<!-- run: shell -->`` block's
commands run (with the ``<!-- file: NAME -->`` blocks above them) and must print the
lines the block shows. ``<!-- run: shell slow -->`` blocks (torchrun) and the whole
documents in order are in ``test_readme_runs.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.readme import Block, all_blocks, preceding_files, run_python, run_shell, write_files

BLOCKS = all_blocks()
PYTHON = [block for block in BLOCKS if block.kind == "python"]
SHELL = [block for block in BLOCKS if block.kind == "shell" and not block.slow]


def test_the_runnable_examples_are_found() -> None:
    """The tagged examples are all picked up, in the README and in the docs they moved to."""
    assert len(PYTHON) >= 4, [block.label for block in PYTHON]
    files = {block.name for block in BLOCKS if block.kind == "file"}
    assert files >= {"train.py", "own_loop.py", "train_inprocess.py", "test_with_lifecycle.py", "test_leaky.py"}
    assert len(SHELL) >= 3, [block.label for block in SHELL]
    assert {block.source for block in BLOCKS} >= {"README.md", "docs/howto.md", "docs/reference.md"}


@pytest.mark.parametrize("block", PYTHON, ids=[block.label for block in PYTHON])
def test_a_documented_example_runs_and_prints_what_it_says(block: Block, tmp_path: Path) -> None:
    """Each ``run: python`` example runs alone in a fresh interpreter; its stdout is exactly its ``# prints:`` lines."""
    run_python(block, tmp_path)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("block", SHELL, ids=[block.label for block in SHELL])
def test_a_documented_command_prints_what_its_transcript_shows(block: Block, tmp_path: Path) -> None:
    """Each one-process ``run: shell`` transcript, run in a fresh folder with its files, prints the lines it shows."""
    write_files(preceding_files(BLOCKS, block), tmp_path)
    assert run_shell(block, tmp_path, timeout_s=80)
