"""Transcripts of ``python -m lifecycle`` in the README and docs/*.md: found, run, normalised and compared.

A transcript is a ```` ```console ```` block whose ``$ COMMAND`` lines run ``python -m
lifecycle``. Each carries a tag on the line before its fence (an HTML comment, invisible
once rendered): ``<!-- transcript -->`` (``make test``: cheap, such as a refused option or
``show`` on a journal), ``<!-- transcript slow -->`` (``make test-slow``: the demo trains),
and ``exit N`` when its commands exit ``N`` (default 0): ``<!-- transcript exit 2 -->``.
An untagged one is an error (``untagged``), so that none goes unchecked.

Each command runs with bash from the checkout's root (``.venv/bin/python`` is this
interpreter), every ``/tmp/NAME`` in it moved into the test's folder, and the output
(stdout and stderr together) is normalised, as are the lines shown, then compared line by
line (``mismatch``):

- normalised on both sides: durations (``5.1 s``, ``333.3 ms``, ``+0.947s``), pids and
  hosts (``pid 18918 on vm``), ports after an IPv4 address, run ids
  (``demo-20261201-012118-0df02a``), losses and other decimals of 3 or 4 places, token
  rates, runs of spaces inside a line (alignment that follows a number's width); lines that
  name an ``.svg`` or ``.png`` file are dropped (written only where Graphviz's ``dot`` is
  installed); on the output side, the test's folder reads ``/tmp`` again and this
  interpreter's path ``.venv/bin/python``;
- a shown line that is only ``^C`` is a Ctrl-C: the demo runs in a session of its own, and
  once it has printed the shown line above the ``^C`` (compared as below), its process
  group gets SIGINT, as a terminal's foreground group does; the ``^C`` is not compared;
- a shown line that is only ``...`` stands for any number of lines (none included), and
  ``...`` inside a line for any text on it; every other shown line must be the next line
  of the output: nothing printed may be missing from a transcript without a ``...`` there;
- legitimately variable order: the demo follows each rank's output file, so the lines of
  different ranks (``[rank N] ...``) interleave differently from run to run. The lines are
  therefore compared per source, each source's lines in order as above: the demo's own
  (every line without a ``[rank N]`` prefix) and each rank's. A ``...`` line elides in
  every source.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lifecycle.testing import run_command
from support.launch import REPO, RunningDemo, started_demo, suite_env

DOCUMENTS: tuple[Path, ...] = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
"""Where transcripts are looked for: the README, then docs/*.md by name."""

FIXTURES = REPO / "tests" / "tools" / "fixtures" / "transcripts"
"""Files the cheap transcripts read, laid out as under ``/tmp`` (a real demo's ``rdm-retry/rank1.jsonl``)."""

ELISION = "..."

INTERRUPT = "^C"
"""A shown line that is only this is a terminal's Ctrl-C: SIGINT to the command's process group, not output."""

__all__ = [
    "DOCUMENTS",
    "ELISION",
    "FIXTURES",
    "INTERRUPT",
    "Transcript",
    "find_transcripts",
    "mismatch",
    "normalise",
    "run_transcript",
    "untagged",
]

_TAG = re.compile(r"<!--\s*transcript\b(.*?)-->")
_OPTIONS = re.compile(r"(?:\s+(slow)|\s+exit\s+(\d+))*\s*")
_FENCE = "```console"
_LIFECYCLE = re.compile(r"(^|\s)(\S*python\S*)\s+-m\s+lifecycle\b")
_RANK = re.compile(r"\[rank (\d+)\] ")

# Applied in this order, to shown and printed lines alike.
_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"demo-\d{8}-\d{6}-[0-9a-f]+"), "demo-<RUN>"),
    (re.compile(r"\bpid \d+ on [^\s,)]+"), "pid <PID> on <HOST>"),
    (re.compile(r"\bpid \d+"), "pid <PID>"),
    (re.compile(r"(\d+\.\d+\.\d+\.\d+\]?):\d+"), r"\1:<PORT>"),
    (re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ms|s)\b"), "<T>"),
    (re.compile(r"\d+ tokens/s"), "<N> tokens/s"),
    (re.compile(r"(?<![\w.])\d+\.\d{3,4}(?![\w.])"), "<X>"),
    (re.compile(r"(?<=\S) {2,}"), " "),
)
_PICTURE = re.compile(r"\S+\.(?:svg|png)$")


@dataclass(frozen=True, slots=True)
class Transcript:
    """One tagged console block: its commands, each with the lines shown under it.

    ``source`` is the document (``docs/tutorial.md``), ``line`` the fence's line (1-based).
    """

    source: str
    line: int
    commands: tuple[tuple[str, tuple[str, ...]], ...]
    slow: bool = False
    exit_code: int = 0

    @property
    def label(self) -> str:
        """``SOURCE:LINE`` and the first command, for test ids and messages."""
        return f"{self.source}:{self.line} $ {self.commands[0][0][:60]}"


def _console_blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """Every console block of ``text``: the fence's index, the line before it, and its lines."""
    lines = text.splitlines()
    found = []
    index = 0
    while index < len(lines):
        if lines[index].strip() == _FENCE:
            end = lines.index("```", index + 1)
            found.append((index, lines[index - 1].strip() if index else "", lines[index + 1 : end]))
            index = end
        index += 1
    return found


def _commands(body: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The ``$ COMMAND`` lines of a block (a trailing backslash continues one), each with the lines under it."""
    found: list[tuple[str, list[str]]] = []
    continued = False
    for line in body:
        if continued:
            found[-1] = (found[-1][0].removesuffix("\\").rstrip() + " " + line.strip(), found[-1][1])
        elif line.startswith("$ "):
            found.append((line[2:].strip(), []))
        elif found:
            found[-1][1].append(line.rstrip())
        continued = bool(found) and line.rstrip().endswith("\\") and not found[-1][1]
    return tuple((command, tuple(shown)) for command, shown in found)


def _runs_lifecycle(body: list[str]) -> bool:
    """Whether a block's commands run ``python -m lifecycle``."""
    return any(_LIFECYCLE.search(command) for command, _ in _commands(body))


def find_transcripts(text: str, source: str) -> list[Transcript]:
    """The tagged transcripts of ``text`` (the document ``source``); ValueError naming the line of a bad tag."""
    found = []
    for index, before, body in _console_blocks(text):
        tag = _TAG.fullmatch(before)
        if tag is None:
            continue
        where = f"{source}:{index + 1}"
        options = _OPTIONS.fullmatch(tag.group(1))
        if options is None:
            raise ValueError(f"{where}: bad tag {before!r} (<!-- transcript [slow] [exit N] -->)")
        if not _runs_lifecycle(body):
            raise ValueError(f"{where}: a transcript's commands must run python -m lifecycle")
        slow, code = options.group(1) is not None, int(options.group(2) or 0)
        found.append(Transcript(source, index + 1, _commands(body), slow=slow, exit_code=code))
    return found


def untagged(text: str, source: str) -> list[str]:
    """Where ``text`` has a console block running ``python -m lifecycle`` without a transcript tag."""
    return [
        f"{source}:{index + 1}"
        for index, before, body in _console_blocks(text)
        if _runs_lifecycle(body) and _TAG.fullmatch(before) is None
    ]


def normalise(line: str) -> str:
    """``line`` with what varies from run to run replaced (module docstring), trailing space dropped."""
    for pattern, replacement in _RULES:
        line = pattern.sub(replacement, line)
    return line.rstrip()


def _pattern(shown: str) -> re.Pattern[str]:
    """A normalised shown line as a regular expression: literal, each ``...`` any text within the line."""
    return re.compile(".*?".join(re.escape(part) for part in shown.split(ELISION)))


def _source(line: str) -> str:
    """Which source printed ``line``: ``rank N`` for a ``[rank N]`` line, else ``demo``."""
    match = _RANK.match(line)
    return f"rank {match.group(1)}" if match else "demo"


def _split(lines: list[str]) -> dict[str, list[str]]:
    """``lines`` per source, each in order; an elision line goes to every source (those of the others too)."""
    sources = {_source(line) for line in lines if line.strip() != ELISION}
    return {name: [line for line in lines if line.strip() == ELISION or _source(line) == name] for name in sources}


def _compare(shown: list[str], printed: list[str]) -> str | None:
    """None if ``printed`` is ``shown`` line by line, ``...`` lines eliding any number; else the first difference."""
    segments: list[list[str]] = [[]]
    for line in shown:
        if line.strip() == ELISION:
            segments.append([])
        else:
            segments[-1].append(line)
    position = 0
    for number, segment in enumerate(segments):
        first, last = number == 0, number == len(segments) - 1
        patterns = [_pattern(line) for line in segment]

        def fits(at: int, patterns: list[re.Pattern[str]] = patterns) -> bool:
            """Whether the segment's lines are printed lines ``at``, ``at + 1``, ..."""
            return at + len(patterns) <= len(printed) and all(
                p.fullmatch(printed[at + k]) for k, p in enumerate(patterns)
            )

        if last:
            at = len(printed) - len(segment)
            if at < position or (first and at != 0) or not fits(at):
                return _where(segment, printed, max(at, position), "at the end" if not first else "exactly")
            return None
        if first:
            if not fits(0):
                return _where(segment, printed, 0, "at the start")
            position = len(segment)
            continue
        at = next((i for i in range(position, len(printed) - len(segment) + 1) if fits(i)), None)
        if at is None:
            return _where(segment, printed, position, "in order, one after the other")
        position = at + len(segment)
    return None


def _where(segment: list[str], printed: list[str], position: int, how: str) -> str:
    """Say which shown lines were not printed ``how``, from where the output was searched, and the first difference."""
    shown = "\n".join(f"    {line}" for line in segment)
    said = f"these shown lines were not printed {how} (from printed line {position + 1}):\n{shown}"
    if how == "in order, one after the other":
        return said
    for k, line in enumerate(segment):
        actual = printed[position + k] if position + k < len(printed) else "(nothing)"
        if not _pattern(line).fullmatch(actual):
            return f"{said}\n  first difference: shown {line!r}, printed {actual!r}"
    return f"{said}\n  printed {len(printed) - position} lines there, shown {len(segment)}"


def mismatch(shown: tuple[str, ...] | list[str], output: str) -> str | None:
    """None if ``output`` prints what ``shown`` shows (module docstring); else what differs, per source."""
    wanted = [normalise(line) for line in shown if not _PICTURE.search(line.strip()) and line.strip() != INTERRUPT]
    printed = [normalise(line) for line in output.splitlines() if not _PICTURE.search(line.strip())]
    printed_by = _split(printed)
    shown_by = _split(wanted)
    problems = []
    for name in sorted(set(printed_by) | set(shown_by)):
        # A source the transcript never names may print only where it elides something.
        elisions = [line for line in wanted if line.strip() == ELISION]
        found = _compare(shown_by.get(name, elisions), printed_by.get(name, []))
        if found is not None:
            problems.append(f"{name}: {found}")
    return "\n".join(problems) or None


def run_transcript(
    transcript: Transcript, folder: Path, timeout_s: float, ran: dict[str, str] | None = None
) -> list[str]:
    """Run each command of ``transcript`` in the checkout's root, ``/tmp/`` moved to ``folder``; the problems found.

    ``ran`` caches output by command, across calls: the same command in two documents (the
    README's and the tutorial's failing run) runs once, as a reader's second run would find
    the first one's journals (the demo refuses such a folder). Without ``ran``, ``folder``
    is first seeded with ``FIXTURES``, which stand in for the journals a slow transcript
    above would have written.
    """
    if ran is None:
        ran = {}
        for fixture in FIXTURES.rglob("*"):
            if fixture.is_file():
                target = folder / fixture.relative_to(FIXTURES)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(fixture, target)
    problems = []
    for command, shown in transcript.commands:
        where = f"{transcript.source}:{transcript.line} $ {command}"
        if command not in ran:
            real = re.sub(r"(?<![\w.])/tmp/", f"{folder}/", command)
            if INTERRUPT in shown:
                returncode, output, left = _interrupted(real, shown, timeout_s)
            else:
                real = _LIFECYCLE.sub(lambda m: f"{m.group(1)}{sys.executable} -m lifecycle", real)
                done = run_command(["bash", "-c", real], timeout_s=timeout_s, env=suite_env(), cwd=REPO)
                if done.timed_out:
                    problems.append(f"{where}: ran past {timeout_s} s:\n{done.output}")
                    continue
                returncode, output, left = done.returncode, done.output, done.left_behind
            if returncode != transcript.exit_code:
                problems.append(f"{where}: exited {returncode}, not {transcript.exit_code}:\n{output}")
                continue
            if left:
                problems.append(f"{where}: left processes behind: {left}")
            ran[command] = output.replace(f"{folder}/", "/tmp/").replace(sys.executable, ".venv/bin/python")
        found = mismatch(shown, ran[command])
        if found is not None:
            problems.append(f"{where}: the transcript differs from what it printed:\n{found}\nprinted:\n{ran[command]}")
    return problems


def _interrupted(command: str, shown: tuple[str, ...], timeout_s: float) -> tuple[int, str, list[int]]:
    """Run a demo ``command`` whose transcript holds ``^C``; its exit code, output and processes left running.

    The SIGINT goes to the demo's process group once it printed the line shown above the
    ``^C`` (an ``AssertionError`` if that does not come within ``timeout_s``, or before the
    demo ended); everything it started is killed on the way out whatever happens.
    """
    words = shlex.split(command)
    if words[:4] != [words[0], "-m", "lifecycle", "demo"] or shown.count(INTERRUPT) != 1:
        raise ValueError(f"{command!r}: a ^C transcript runs python -m lifecycle demo and holds one ^C")
    trigger = shown[shown.index(INTERRUPT) - 1] if shown.index(INTERRUPT) else ELISION
    if trigger.strip() == ELISION:
        raise ValueError(f"{command!r}: the line above ^C must be one the demo prints (when to press it), not ...")
    deadline = time.monotonic() + timeout_s
    with started_demo(*words[4:], cwd=REPO) as demo:
        _wait_for_line(demo, _pattern(normalise(trigger)), deadline)
        os.killpg(demo.process.pid, signal.SIGINT)
        done = demo.finish(timeout=max(deadline - time.monotonic(), 1.0))
        return done.returncode, done.stdout, demo.left_running(within=10.0)


def _wait_for_line(demo: RunningDemo, pattern: re.Pattern[str], deadline: float) -> None:
    """Return once the demo printed a line that, normalised, is ``pattern``; AssertionError past ``deadline``."""
    while not any(pattern.fullmatch(normalise(line)) for line in demo.output.splitlines()):
        if time.monotonic() > deadline or demo.process.poll() is not None:
            raise AssertionError(f"no line {pattern.pattern!r} before the ^C; output:\n{demo.output[-4000:]}")
        time.sleep(0.05)  # polls the output the reader thread collects: an event, not a guessed time
