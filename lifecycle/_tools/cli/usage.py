"""Help and docs rendered from the declarations: the exit codes (``ExitCode``), a parser's options, Markdown tables.

Nothing here declares an option or a code: ``ExitCode`` holds each code's meaning, the
demo's ``OPTIONS`` and ``show``'s ``parser`` hold their options. This module renders
them for a terminal (``exit_codes_text``, ``synopsis``, ``LineFormatter``) and for the
docs (``exit_codes_table``, ``markdown_table``); tests/tools/test_usage.py keeps the
docs' tables equal to what it renders. It imports no product, so every product may use it.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Iterable, Sequence

from lifecycle._training.exits import ExitCode


def plain(markdown: str) -> str:
    """``markdown`` for a terminal: code spans lose their backticks."""
    return markdown.replace("`", "")


def exit_codes_text() -> str:
    """The exit codes for ``--help``: a heading, then one line per ``ExitCode`` member (code, name, meaning, next)."""
    lines = ["exit codes (lifecycle.ExitCode):"]
    lines += [f"  {code:<3d} {code.name}: {plain(code.meaning)}; next: {plain(code.next_step)}" for code in ExitCode]
    return "\n".join(lines)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table of ``rows`` under ``header``, one line per row, ``|`` in a cell escaped; no final newline."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(row) for row in rows)])


def exit_codes_table() -> str:
    """The docs' table of exit codes (docs/recovery.md, docs/reference.md): one row per ``ExitCode`` member."""
    rows = [(str(int(code)), f"`{code.name}`", code.meaning, code.next_step) for code in ExitCode]
    return markdown_table(("code", "`lifecycle.ExitCode`", "meaning", "what next"), rows)


def option_label(action: argparse.Action) -> str:
    """How an option reads in a synopsis or a table: ``--steps N``, ``--retry``, ``JOURNAL...``."""
    if not action.option_strings:
        name = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        return f"{name}..." if action.nargs in ("+", "*") else name
    flag = action.option_strings[-1]
    if action.nargs == 0:
        return flag
    if isinstance(action.metavar, str):
        return f"{flag} {action.metavar}"
    if action.choices is not None:
        return f"{flag} {{{','.join(map(str, action.choices))}}}"
    return f"{flag} {action.dest.upper()}"


def synopsis(parser: argparse.ArgumentParser) -> list[str]:
    """A command's arguments, from its ``parser``: the positional ones, then ``[--flag VALUE]`` each (no ``-h``)."""
    actions = [action for action in parser._actions if not isinstance(action, argparse._HelpAction)]
    positional = [option_label(action) for action in actions if not action.option_strings]
    return positional + [f"[{option_label(action)}]" for action in actions if action.option_strings]


def wrap_items(items: Sequence[str], width: int, indent: str, hanging: str) -> list[str]:
    """``items`` joined by spaces into lines of at most ``width`` (an item longer than that on its own), never split."""
    lines = [indent]
    for item in items:
        prefix = lines[-1]
        if prefix.strip() and len(prefix) + 1 + len(item) > width:
            lines.append(hanging + item)
        else:
            lines[-1] = f"{prefix} {item}" if prefix.strip() else prefix + item
    return lines


class LineFormatter(argparse.HelpFormatter):
    """argparse's formatter, but each line of a description or epilog is wrapped on its own (a list stays a list).

    A line that starts with spaces (an item) keeps its indent and wraps under its text.
    """

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            item = len(line) - len(line.lstrip())
            hanging = indent + " " * (item + 4 if item else 0)
            lines.append(
                textwrap.fill(line.strip(), width, initial_indent=indent + " " * item, subsequent_indent=hanging)
            )
        return "\n".join(lines)
