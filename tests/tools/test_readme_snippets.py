"""The README's torch-free Python examples run as written and print what their comments say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = [
    block
    for block in re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    if "lifecycle.testing import RecordingActions" in block or block.startswith("from lifecycle import Ledger")
]


def test_the_torch_free_examples_are_found() -> None:
    """The examples of the state machine, plans, teardown errors and except* are all picked up."""
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("block", BLOCKS, ids=[block.splitlines()[0][:40] for block in BLOCKS])
def test_a_readme_example_runs_and_prints_what_it_says(block: str) -> None:
    """Each example runs; every ``print(...)  # value`` comment is a prefix of what that print wrote."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {"__name__": "readme_example"})
    printed = out.getvalue().splitlines()
    promised = [m.group(1).strip() for m in re.finditer(r"^\s*print\(.*\)\s+# (.*)$", block, flags=re.M)]
    for promise in promised:
        head = re.split(r"[:,]\s|\.\.\.", promise)[0].strip()
        assert any(line.startswith(head) or head in line for line in printed), (promise, printed)
