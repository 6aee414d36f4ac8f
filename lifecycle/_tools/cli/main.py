"""``python -m lifecycle``: the command line (demo, show, diagrams).

A closed stdout (``python -m lifecycle show DIR | head``) ends a command quietly:
the rest of its output is dropped, no ``BrokenPipeError`` traceback, exit code 141
(128 + SIGPIPE, what a shell reports for a tool that a closed pipe stopped).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from lifecycle._tools.cli import usage as _usage

DIAGRAMS_ARGS = ["[--check]", "[--out DIR]"]
"""The ``diagrams`` command's arguments, as ``_diagrams`` reads them."""

SUMMARIES = {
    "demo": "train the demo model with 2 ranks on CPU/gloo (see `demo --help`, which lists the exit codes)",
    "show": (
        "print each attempt's verdict (who failed first, how every rank ended) and timeline; draw the path taken "
        "and a gantt chart, and with --html one self-contained page (see `show --help`)"
    ),
    "diagrams": (
        "write the diagrams generated from the table into DIR (default: diagrams/); with --check, write nothing "
        "and exit 1 if any is stale"
    ),
}
"""What each command does, in ``usage``'s words; the commands in its order."""

WIDTH = 88
"""The width ``usage`` wraps its lines to."""


def usage() -> str:
    """``python -m lifecycle --help``: every command with its arguments, each read from its parser, and what it does."""
    from lifecycle._tools.demo import options as _demo_options
    from lifecycle._tools.show import main as _show

    arguments = {
        "demo": _usage.synopsis(_demo_options.parser()),
        "show": _usage.synopsis(_show.parser()),
        "diagrams": DIAGRAMS_ARGS,
    }
    lines = ["usage: python -m lifecycle COMMAND [ARGS]", "", "commands:"]
    for command, summary in SUMMARIES.items():
        lines += _usage.wrap_items([command, *arguments[command]], WIDTH, "  ", " " * (len(command) + 3))
        lines += textwrap.wrap(summary, WIDTH, initial_indent=" " * 22, subsequent_indent=" " * 22)
    return "\n".join(lines) + "\n"


def _diagrams(argv: list[str]) -> int:
    """``diagrams [--check] [--out DIR]``: write the table's diagrams, or with ``--check`` name the stale ones."""
    from lifecycle._tools.diagrams import draw as _diagrams

    check = "--check" in argv
    rest = [a for a in argv if a != "--check"]
    out = Path("diagrams")
    if rest[:1] == ["--out"] and len(rest) == 2:
        out = Path(rest[1])
    elif rest:
        print(usage(), file=sys.stderr)
        return 2
    if check:
        stale = _diagrams.stale(out)
        for name in stale:
            print(f"stale: {out / name} (run `python -m lifecycle diagrams`)", file=sys.stderr)
        return 1 if stale else 0
    for path in _diagrams.write(out):
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command named by ``argv[0]``; return the process exit code (141 if stdout closed early)."""
    try:
        code = _run(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader of stdout has gone: end quietly
        from lifecycle._tools.show import main as _show

        _show.drop_stdout()
        return _show.CLOSED_PIPE
    return code


def _run(args: list[str]) -> int:
    """The command named by ``args[0]``, run; its exit code."""
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "diagrams":
        return _diagrams(rest)
    if command == "demo":
        from lifecycle._tools.demo.main import demo_main

        return demo_main(rest)
    if command == "show":
        from lifecycle._tools.show.main import show_main

        return show_main(rest)
    print(f"unknown command {command!r}\n\n{usage()}", file=sys.stderr)
    return 2
