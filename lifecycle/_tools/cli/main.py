"""``python -m lifecycle``: the command line (demo, show, diagrams).

A closed stdout (``python -m lifecycle show DIR | head``) ends a command quietly:
the rest of its output is dropped, no ``BrokenPipeError`` traceback, exit code 141
(128 + SIGPIPE, what a shell reports for a tool that a closed pipe stopped).
"""

from __future__ import annotations

import sys
from pathlib import Path

USAGE = """usage: python -m lifecycle COMMAND [ARGS]

commands:
  demo [OPTIONS]      train the demo model with 2 ranks on CPU/gloo (see `demo --help`)
  show JOURNAL... [--out DIR] [--html PATH]
                      print each attempt's verdict (who failed first, how every rank
                      ended) and timeline; draw the path taken and a gantt chart, and
                      with --html one self-contained page (see `show --help`)
  diagrams [--check] [--out DIR]
                      write the diagrams generated from the table into DIR (default:
                      diagrams/); with --check, write nothing and exit 1 if any is stale
"""


def _diagrams(argv: list[str]) -> int:
    from lifecycle._tools.diagrams import draw as _diagrams

    check = "--check" in argv
    rest = [a for a in argv if a != "--check"]
    out = Path("diagrams")
    if rest[:1] == ["--out"] and len(rest) == 2:
        out = Path(rest[1])
    elif rest:
        print(USAGE, file=sys.stderr)
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
        print(USAGE)
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
    print(f"unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2
