"""How README blocks are tagged, found and checked (``tests/support/readme.py``), on synthetic READMEs.

These pin that the README tests fail when a block's shown output drifts from what it
prints, and that a tag which cannot be honoured is an error rather than a block
silently not run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.readme import (
    Block,
    all_blocks,
    commands,
    find_blocks,
    line_matches,
    missing_anywhere,
    missing_in_order,
    printed_mismatch,
    prints,
    run_python,
    run_shell,
)

SYNTHETIC = """\
# A README

<!-- run: python -->
```python
print("hello")  # prints: hello
```

<!-- file: greet.py -->
```python
# greet.py: says hello
print("hello from greet")
```

Untagged: not run.

```python
raise SystemExit("never run")
```

<!-- run: shell -->
```console
$ echo one && \\
    echo two
one
...
two
```

<!-- run: shell slow -->
```console
$ .venv/bin/torchrun --nproc-per-node=2 greet.py
```

```bash
srun torchrun train.py
```
"""


def test_tagged_blocks_are_found_in_order_and_untagged_ones_are_left_alone() -> None:
    """Each tag gives one block of its kind, with its line; untagged python and bash blocks are not picked up."""
    blocks = find_blocks(SYNTHETIC)
    assert [(b.kind, b.name, b.slow) for b in blocks] == [
        ("python", "", False),
        ("file", "greet.py", False),
        ("shell", "", False),
        ("shell", "", True),
    ]
    assert blocks[0].text == 'print("hello")  # prints: hello\n'
    assert blocks[0].line == 4  # the opening fence
    assert all("never run" not in b.text and "srun" not in b.text for b in blocks)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("<!-- run: pyhton -->\n```python\nx = 1\n```\n", "unknown tag"),
        ("<!-- runs: python -->\n```python\nx = 1\n```\n", "unknown tag"),
        ("<!-- run: python -->\n\n```python\nx = 1\n```\n", "not directly followed"),
        ("<!-- run: python -->\n```python\nx = 1\n", "never closed"),
        ("<!-- run: python -->\n```console\n$ ls\n```\n", "tags a ```python block"),
        ("<!-- run: shell -->\n```bash\nls\n```\n", "tags a ```console block"),
        ("<!-- file: a.py -->\n```python\nx = 1\n```\n", "first line must be '# a.py"),
    ],
)
def test_a_tag_that_cannot_be_honoured_is_refused_naming_its_line(text: str, complaint: str) -> None:
    """A misspelt tag, a tag away from its fence, an unclosed block, a wrong language, an unnamed file: ValueError."""
    with pytest.raises(ValueError, match=r"README\.md:1") as raised:
        find_blocks(text)
    assert complaint in str(raised.value)


def test_prints_comments_are_the_promised_output_in_order() -> None:
    """``# prints:`` after a statement or on a line of its own; other comments are not output."""
    code = 'print(1)  # prints: 1\n# a comment\nfor x in "ab":\n    print(x)\n# prints: a\n# prints: b\n'
    assert prints(code) == ["1", "a", "b"]


def test_console_commands_are_split_with_continuations_and_their_shown_lines() -> None:
    """``$ `` starts a command, a trailing backslash continues it, the lines below are its shown output."""
    found = commands("$ echo a \\\n  b\na b\n$ true\n$ torchrun x.py\nx\n")
    assert [(c.command, c.shown) for c in found] == [
        ("echo a b", ("a b",)),
        ("true", ()),
        ("torchrun x.py", ("x",)),
    ]
    assert [c.multiprocess for c in found] == [False, False, True]


def test_a_wildcard_stands_for_any_text_within_one_line_and_nothing_else_is_loose() -> None:
    """``...`` matches any text (empty too); everything else is literal, regex characters included."""
    assert line_matches("loss ... | ... tokens/s", "loss 4.2 | 9001 tokens/s")
    assert line_matches("a...b", "ab")
    assert line_matches("[...]", "[1, 2]")
    assert not line_matches("[...]", "(1, 2)")
    assert not line_matches("loss 4.2", "loss 4.25")
    assert not line_matches("a.c", "abc")


def test_a_python_block_whose_shown_output_drifted_fails() -> None:
    """A ``# prints:`` line that differs, an extra printed line or a missing one is a mismatch naming it."""
    assert printed_mismatch(["hello", "n=..."], "hello\nn=3\n") is None
    drifted = printed_mismatch(["hello", "n=4"], "hello\nn=3\n")
    assert drifted is not None and "line 2: shows 'n=4', printed 'n=3'" in drifted
    assert printed_mismatch(["hello"], "hello\nn=3\n") is not None
    assert printed_mismatch(["hello", "n=3", "bye"], "hello\nn=3\n") is not None


def test_a_shell_transcript_line_that_drifted_or_moved_is_reported_missing() -> None:
    """One process: every shown line must be printed in the order shown; unshown lines in between are fine."""
    output = "warning: noise\nstep 5 | loss 4.1\nfailed: boom\nsteps 10→20, closed\n"
    assert missing_in_order(["step 5 | loss ...", "...", "steps 10→20, closed"], output) == []
    assert missing_in_order(["steps 10→20, closed", "failed: boom"], output) == ["failed: boom"]
    assert missing_in_order(["steps 10→30, closed"], output) == ["steps 10→30, closed"]


def test_torchrun_lines_are_found_anywhere_but_as_often_as_shown() -> None:
    """Ranks' lines may share a line (unbuffered ranks); a line shown twice must be printed twice."""
    output = "steps 10→20, closedsteps 10→20, closed\n\nrank 0: ok\n"
    assert missing_anywhere(["steps 10→20, closed", "steps 10→20, closed", "rank 0: ..."], output) == []
    assert missing_anywhere(["rank 0: ok", "rank 0: ok"], output) == ["rank 0: ok"]
    assert missing_anywhere(["rank 1: ok"], output) == ["rank 1: ok"]


def test_a_python_block_that_prints_what_it_shows_passes_and_a_drifted_one_fails(tmp_path: Path) -> None:
    """Run for real: a block printing its ``# prints:`` line passes; the same block showing another line fails."""
    run_python(Block("python", 'print("hello")  # prints: hello\n', 1), tmp_path)
    with pytest.raises(AssertionError, match="shows 'hullo', printed 'hello'"):
        run_python(Block("python", 'print("hello")  # prints: hullo\n', 1), tmp_path)


def test_a_shell_block_that_prints_what_it_shows_passes_and_a_drifted_one_fails(tmp_path: Path) -> None:
    """Run for real: a transcript whose lines the command prints passes; a drifted line or a failed command fails."""
    assert run_shell(Block("shell", "$ echo one; echo two\none\ntwo\n", 1), tmp_path)
    with pytest.raises(AssertionError, match="did not print, in order: \\['too'\\]"):
        run_shell(Block("shell", "$ echo one; echo two\none\ntoo\n", 1), tmp_path)
    with pytest.raises(AssertionError, match="exited 3"):
        run_shell(Block("shell", "$ exit 3\n", 1), tmp_path)


def test_the_real_readme_fails_once_a_shown_output_line_is_edited(tmp_path: Path) -> None:
    """A copy of a real documented block with one ``# prints:`` line edited fails its check; the original passes."""
    block = next(b for b in all_blocks() if b.kind == "python" and "InvalidTransition" in b.text)
    run_python(block, tmp_path)
    edited = block.text.replace("# prints: trigger 'start_training'", "# prints: trigger 'finish'")
    assert edited != block.text
    with pytest.raises(AssertionError, match="differ from what it printed"):
        run_python(Block(block.kind, edited, block.line), tmp_path)
