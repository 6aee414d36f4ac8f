"""One declaration per option and exit code: the help texts and the docs' tables are rendered from it, never restated.

``ExitCode`` declares each code's meaning; the demo's ``OPTIONS`` and ``show``'s parser
declare their options. ``demo --help``, ``python -m lifecycle --help`` and the tables in
docs/reference.md and docs/recovery.md come from them; a docs table that drifts fails here.
"""

from __future__ import annotations

import argparse
import re
import sys

import pytest
from support.launch import REPO

from lifecycle import ExitCode, Phase
from lifecycle._tools.cli import main as cli
from lifecycle._tools.cli import usage
from lifecycle._tools.demo import options as demo_options

GENERATED = re.compile(r"<!-- generated: (\w+) from [^\n]*-->\n(.*?)\n<!-- end generated -->", re.S)
"""A generated block in the docs: the renderer's name, then exactly what it rendered."""

RENDERERS = {"options_table": demo_options.options_table, "exit_codes_table": usage.exit_codes_table}


def blocks(doc: str) -> list[tuple[str, str]]:
    """The generated blocks of ``docs/<doc>``: (renderer name, text)."""
    return GENERATED.findall((REPO / "docs" / doc).read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("doc", "names"),
    [("reference.md", ["options_table", "exit_codes_table"]), ("recovery.md", ["exit_codes_table"])],
)
def test_the_docs_tables_are_what_the_declarations_render(doc: str, names: list[str]) -> None:
    """Each generated table in the docs equals its renderer's output today (paste the rendering to fix a drift)."""
    found = blocks(doc)
    assert [name for name, _ in found] == names
    for name, text in found:
        assert text == RENDERERS[name](), f"docs/{doc}: the {name} is stale; it should read:\n{RENDERERS[name]()}"


def test_the_options_table_lists_every_declared_flag_once() -> None:
    """The rendered options table has one row per ``Option``, in declaration order, and no other."""
    rows = demo_options.options_table().splitlines()[2:]
    assert [row.split("`")[1].split()[0] for row in rows] == [option.flag for option in demo_options.OPTIONS]


def test_every_exit_code_is_declared_with_its_meaning_and_next_step() -> None:
    """``ExitCode`` is 0, 1, 2, 75 and 93, each with a meaning and what to do next; a lookup by value still works."""
    assert [int(code) for code in ExitCode] == [0, 1, 2, 75, 93]
    assert all(code.meaning and code.next_step for code in ExitCode)
    assert ExitCode(75) is ExitCode.STOPPED and ExitCode(93) is ExitCode.DO_NOT_RESTART


def test_the_demo_help_states_every_exit_code_and_the_stepped_phases() -> None:
    """``demo --help`` lists 0, 1, 2, 75 and 93 by name, and ``batch`` among ``--fail-at``'s and ``--fail-step``'s."""
    text = demo_options.parser().format_help()
    for code in ExitCode:
        assert re.search(rf"^  {int(code)} +{code.name}: ", text, re.M), code
    helps = {action.option_strings[-1]: str(action.help) for action in demo_options.parser()._actions}
    stepped = [phase.value for phase in Phase if phase in demo_options.STEPPED_PHASES]
    assert stepped[0] == "batch" and helps["--fail-step"].startswith(f"for {', '.join(stepped)}:")
    assert all(phase.value in helps["--fail-at"] for phase in Phase)


def test_the_command_line_help_lists_every_command_with_the_options_its_parser_declares() -> None:
    """``python -m lifecycle --help`` names each command with every option of its parser (``show --ranks`` included)."""
    text = " ".join(cli.usage().split())
    for option in demo_options.OPTIONS:
        assert f"[{option.flag}" in text, option.flag
    assert "show JOURNAL... [--out DIR] [--ranks LIST] [--html PATH] [--strict]" in text
    assert "diagrams [--check] [--out DIR]" in text


def test_a_list_in_a_help_epilog_keeps_one_line_per_item() -> None:
    """``LineFormatter`` wraps each epilog line on its own, an item's continuation under its text; a description as
    argparse's own formatter would."""
    made = argparse.ArgumentParser(
        prog="p", description="word " * 30, epilog="head:\n  1   " + "long " * 30, formatter_class=usage.LineFormatter
    )
    plain = argparse.ArgumentParser(prog="p", description="word " * 30)
    text = made.format_help()
    assert plain.format_help() in text
    epilog = text.split("head:\n", 1)[1].splitlines()
    assert epilog[0].startswith("  1   long") and all(line.startswith("      long") for line in epilog[1:])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
