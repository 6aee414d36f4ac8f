"""Runnable blocks of the README and docs/*.md: how they are tagged, found, run and checked against what they show.

Every document in ``DOCUMENTS`` follows the same rules; a block's ``source`` names its
document, and a shell block finds only the ``file:`` blocks above it in the same one.

A tag is an HTML comment (invisible once rendered) on the line just before a block's
opening fence:

- ``<!-- run: python -->`` before a ```` ```python ```` block: the block is a whole script.
  It runs alone, in a fresh interpreter and an empty folder, with no launcher variables
  (``WORLD_SIZE``, ``RANK``...). Its stdout must be exactly the lines it shows as
  ``# prints: LINE`` comments (after a statement or on a line of their own), in order.
- ``<!-- file: NAME -->`` before a block: the block is the file ``NAME``; its first line
  must start with ``# NAME`` so that a reader sees the name too. Shell blocks further
  down find it in their folder.
- ``<!-- run: shell -->`` before a ```` ```console ```` block: each ``$ COMMAND`` line (a
  trailing backslash continues it) runs with bash, in order, in a folder holding every
  ``file:`` block above it and a ``.venv`` link to this interpreter's environment (the
  README's commands run from the checkout's root). The lines up to the next command are
  what the block shows of that command's output, stdout and stderr together as a
  terminal shows them. The command must exit 0, leave no process behind, and print
  every shown line: in the order shown for one process (run unbuffered, as on a
  terminal). For a command that runs ``torchrun``, in any order, each at least as often
  as shown, and not necessarily at the start of a line: torchrun runs its ranks
  unbuffered, and ``print`` writes its text and its newline separately, so two ranks'
  lines can end up on one (``closedsteps 10→20, closed``). Output the block does not
  show is allowed.
  ``<!-- run: shell slow -->``: the same, but only in ``make test-slow`` (torchrun).

In a shown line, ``...`` matches any text (timings, losses, addresses); a shown line
that is only ``...`` marks elided output and matches nothing. Trailing whitespace is
ignored. Blocks without a tag are not run, on purpose: commands for Slurm or other
hosts, fragments such as ``...  # the loop``.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from lifecycle.testing import run_command
from support.launch import REPO, suite_env

README = REPO / "README.md"
DOCUMENTS: tuple[Path, ...] = (README, *sorted((REPO / "docs").glob("*.md")))
"""The documents whose tagged blocks run: the README, then docs/*.md by name."""

__all__ = [
    "DOCUMENTS",
    "README",
    "Block",
    "Command",
    "all_blocks",
    "commands",
    "document_blocks",
    "find_blocks",
    "line_matches",
    "missing_anywhere",
    "missing_in_order",
    "preceding_files",
    "printed_mismatch",
    "prints",
    "readme_blocks",
    "run_python",
    "run_shell",
    "write_files",
]

_TAG = re.compile(r"<!--\s*((?:run|file)\w*)\s*:?\s*(.*?)\s*-->")  # "runs python" too: refused below
_FENCE = re.compile(r"```(\w*)\s*$")
_PRINTS = re.compile(r"#\s*prints:\s?(.*)$")
_KINDS = {"run: python": "python", "run: shell": "shell", "run: shell slow": "shell"}


@dataclass(frozen=True, slots=True)
class Block:
    """One tagged block: ``kind`` ``python``, ``shell`` or ``file``; ``line`` is where its fence opens (1-based).

    ``source``: the document it is in, relative to the checkout (``README.md``, ``docs/howto.md``).
    """

    kind: str
    text: str
    line: int
    name: str = ""
    slow: bool = False
    source: str = "README.md"

    @property
    def label(self) -> str:
        """A short name for test ids and messages: ``SOURCE:LINE`` and the file or first line."""
        first = self.name or (self.text.splitlines() or [""])[0][:40]
        return f"{self.source}:{self.line} {first}".strip()


@dataclass(frozen=True, slots=True)
class Command:
    """One ``$ COMMAND`` of a shell block and the output lines shown under it."""

    command: str
    shown: tuple[str, ...]

    @property
    def multiprocess(self) -> bool:
        """Whether it runs torchrun: its ranks' lines interleave, so neither their order nor line starts are checked."""
        return "torchrun" in self.command


def find_blocks(text: str, source: str = "README.md") -> list[Block]:
    """Every tagged block of ``text`` (the document ``source``), in order; ValueError naming the line of a bad tag.

    Refused: an unknown tag, a tag not directly followed by a fence, a block that is not
    closed, a ``run: python`` tag on a non-python block or ``run: shell`` on a non-console
    one, a ``file:`` block whose first line does not name the file.
    """
    lines = text.splitlines()
    blocks = []
    for index, line in enumerate(lines):
        tag = _TAG.fullmatch(line.strip())
        if tag is None:
            continue
        where = f"{source}:{index + 1}"
        fence = _FENCE.fullmatch(lines[index + 1]) if index + 1 < len(lines) else None
        if fence is None:
            raise ValueError(f"{where}: tag {line.strip()!r} is not directly followed by a ``` fence")
        try:
            end = lines.index("```", index + 2)
        except ValueError:
            raise ValueError(f"{where}: the block after {line.strip()!r} is never closed") from None
        body = "\n".join(lines[index + 2 : end]) + "\n"
        language, key, value = fence.group(1), tag.group(1), tag.group(2)
        if key not in ("run", "file"):
            raise ValueError(
                f"{where}: unknown tag {line.strip()!r} (run: python, run: shell, run: shell slow, file: NAME)"
            )
        if key == "file":
            if not value or not body.startswith(f"# {value}"):
                raise ValueError(f"{where}: a file block's first line must be '# {value} ...' (name it for the reader)")
            blocks.append(Block("file", body, index + 2, name=value, source=source))
            continue
        kind = _KINDS.get(f"run: {value}")
        if kind is None:
            raise ValueError(
                f"{where}: unknown tag {line.strip()!r} (run: python, run: shell, run: shell slow, file: NAME)"
            )
        wanted = "python" if kind == "python" else "console"
        if language != wanted:
            raise ValueError(f"{where}: 'run: {value}' tags a ```{wanted} block, not ```{language}")
        blocks.append(Block(kind, body, index + 2, slow=value.endswith("slow"), source=source))
    return blocks


def prints(code: str) -> list[str]:
    """The lines a python block says it prints: each ``# prints: LINE`` comment, in order."""
    return [match.group(1).rstrip() for match in map(_PRINTS.search, code.splitlines()) if match]


def commands(console: str) -> list[Command]:
    """The ``$ COMMAND`` lines of a console block (backslash continuations joined), each with its shown output."""
    found: list[tuple[str, list[str]]] = []
    continued = False
    for line in console.splitlines():
        if continued:
            command = found[-1][0].removesuffix("\\").rstrip() + " " + line.strip()
            found[-1] = (command, found[-1][1])
        elif line.startswith("$ "):
            found.append((line[2:].strip(), []))
        elif found:
            found[-1][1].append(line.rstrip())
        continued = bool(found) and line.rstrip().endswith("\\") and not found[-1][1]
    return [Command(command, tuple(shown)) for command, shown in found]


def _pattern(shown: str) -> re.Pattern[str]:
    """``shown`` as a regular expression: literal, with each ``...`` matching any text within one line."""
    return re.compile(".*?".join(re.escape(part) for part in shown.rstrip().split("...")))


def line_matches(shown: str, actual: str) -> bool:
    """Whether output line ``actual`` is what ``shown`` shows: equal, with ``...`` standing for any text."""
    return _pattern(shown).fullmatch(actual.rstrip()) is not None


def _shown(lines: tuple[str, ...] | list[str]) -> list[str]:
    """The lines to look for: all but the ``...`` elision markers."""
    return [line for line in lines if line.strip() != "..."]


def printed_mismatch(shown: list[str], stdout: str) -> str | None:
    """None if ``stdout`` is exactly the ``shown`` lines (with wildcards); else what differs, line by line."""
    actual = stdout.splitlines()
    wanted = _shown(shown)
    if len(actual) == len(wanted) and all(map(line_matches, wanted, actual)):
        return None
    diff = [
        f"  line {n + 1}: shows {w!r}, printed {a!r}"
        for n, (w, a) in enumerate(zip(wanted, actual, strict=False))
        if not line_matches(w, a)
    ]
    if len(actual) != len(wanted):
        diff.append(f"  shows {len(wanted)} lines, printed {len(actual)}")
    return "\n".join(["the block's '# prints:' lines differ from what it printed:", *diff, "printed:", stdout])


def missing_in_order(shown: tuple[str, ...] | list[str], output: str) -> list[str]:
    """The shown lines ``output`` does not print in that order: the first one not found after its predecessor, on."""
    actual = output.splitlines()
    wanted = _shown(shown)
    position = 0
    for index, line in enumerate(wanted):
        found = next((i for i in range(position, len(actual)) if line_matches(line, actual[i])), None)
        if found is None:
            return wanted[index:]
        position = found + 1
    return []


def missing_anywhere(shown: tuple[str, ...] | list[str], output: str) -> list[str]:
    """The shown lines ``output`` does not hold as often as shown: anywhere, in any order, counted without overlap."""
    wanted = Counter(_shown(shown))
    return [line for line, count in wanted.items() if len(_pattern(line).findall(output)) < count]


def write_files(blocks: list[Block], folder: Path) -> None:
    """Write every ``file:`` block into ``folder``, and link ``folder/.venv`` to this interpreter's environment."""
    for block in blocks:
        if block.kind == "file":
            (folder / block.name).write_text(block.text, encoding="utf-8")
    venv = folder / ".venv"
    if not venv.exists():
        venv.symlink_to(Path(sys.prefix), target_is_directory=True)


def run_python(block: Block, folder: Path, timeout_s: float = 60.0) -> None:
    """Run a ``run: python`` block as a script in ``folder``; AssertionError unless it exits 0 printing what it shows.

    The whole stdout is compared with the block's ``# prints:`` lines; stderr is only quoted on failure.
    """
    script = folder / "block.py"
    script.write_text(block.text, encoding="utf-8")
    # Only stdout is compared: stderr (log lines, warnings) goes to a file, quoted on failure.
    command = ["bash", "-c", f'exec "{sys.executable}" block.py 2>stderr.txt']
    done = run_command(command, timeout_s=timeout_s, env=suite_env(), cwd=folder)
    stderr = (folder / "stderr.txt").read_text(encoding="utf-8", errors="replace")
    where = block.label
    assert not done.timed_out, f"{where} ran past {timeout_s} s:\n{done.output}{stderr}"
    assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.output}{stderr}"
    assert not done.left_behind, f"{where} left processes behind: {done.left_behind}"
    mismatch = printed_mismatch(prints(block.text), done.output)
    assert mismatch is None, f"{where}: {mismatch}"


def run_shell(block: Block, folder: Path, timeout_s: float = 120.0) -> list[tuple[Command, str]]:
    """Run a ``run: shell`` block's commands in ``folder``, in order; return each with its output, all checked.

    AssertionError, naming the block and the command, for a command that times out,
    exits non-zero, leaves a process behind or does not print a shown line.
    """
    ran = []
    for command in commands(block.text):
        where = f"{block.label}: $ {command.command}"
        # One process: unbuffered, so its stdout and stderr lines keep their order, as on a
        # terminal. Ranks: buffered (empty means off), so that no rank's line is cut by another's.
        extra = {"PYTHONUNBUFFERED": "" if command.multiprocess else "1"}
        done = run_command(["bash", "-c", command.command], timeout_s=timeout_s, env=suite_env(extra), cwd=folder)
        assert not done.timed_out, f"{where} ran past {timeout_s} s:\n{done.output}"
        assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.output}"
        assert not done.left_behind, f"{where} left processes behind: {done.left_behind}"
        check = missing_anywhere if command.multiprocess else missing_in_order
        missing = check(command.shown, done.output)
        order = "anywhere, as often as shown" if command.multiprocess else "in order"
        assert not missing, f"{where} did not print, {order}: {missing}\noutput:\n{done.output}"
        ran.append((command, done.output))
    return ran


def document_blocks(path: Path) -> list[Block]:
    """The tagged blocks of the document at ``path`` (one of ``DOCUMENTS``)."""
    return find_blocks(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))


def readme_blocks() -> list[Block]:
    """The tagged blocks of this checkout's README."""
    return document_blocks(README)


def all_blocks() -> list[Block]:
    """The tagged blocks of every document, the README's first."""
    return [block for path in DOCUMENTS for block in document_blocks(path)]


def preceding_files(blocks: list[Block], block: Block) -> list[Block]:
    """The ``file:`` blocks above ``block`` in its own document."""
    return [b for b in blocks if b.kind == "file" and b.source == block.source and b.line < block.line]
