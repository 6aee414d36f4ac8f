"""The committed diagrams are generated from the table and are fresh.

The tests read the diagrams the public command writes (``python -m lifecycle diagrams``);
only the path highlighting, which the command does not expose (``show`` does, from a
journal), and the missing-``graphviz`` error pin the private ``lifecycle._tools.diagrams.draw``
helpers on purpose. The ``.dot`` text is written by transitions' Graphviz engine, so it
is read back statement by statement rather than matched line by line.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lifecycle import State
from lifecycle._tools.diagrams.draw import dot, mermaid
from lifecycle.lowlevel import TRANSITIONS

ROOT = Path(__file__).resolve().parents[2]

STATEMENT = re.compile(r"^\s*(?P<tail>\w+)(?: -> (?P<head>\w+))?(?: \[(?P<attrs>.*)\])?;?$")
ATTRIBUTE = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s"]+)')


def dot_statements(text: str) -> tuple[dict[str, dict[str, str]], dict[tuple[str, str], dict[str, str]]]:
    """The node and edge statements of a flat ``digraph``: attributes by node name, and by (tail, head)."""
    assert text.startswith("digraph lifecycle {\n") and text.endswith("}\n")
    nodes: dict[str, dict[str, str]] = {}
    edges: dict[tuple[str, str], dict[str, str]] = {}
    for line in text.splitlines()[1:-1]:
        match = STATEMENT.match(line)
        assert match, f"not a node or edge statement: {line!r}"
        attrs = {k: v.strip('"') for k, v in ATTRIBUTE.findall(match["attrs"] or "")}
        if match["head"]:
            assert (match["tail"], match["head"]) not in edges, f"edge drawn twice: {line!r}"
            edges[match["tail"], match["head"]] = attrs
        elif match["tail"] not in ("graph", "node", "edge"):
            nodes[match["tail"]] = attrs
    return nodes, edges


def diagrams_command(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m lifecycle diagrams ARGS`` from the repository root."""
    command = [sys.executable, "-m", "lifecycle", "diagrams", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What ``diagrams --out DIR`` writes, by file name."""
    out = tmp_path_factory.mktemp("diagrams")
    done = diagrams_command("--out", str(out))
    assert done.returncode == 0, done.stderr
    return {path.name: path.read_text(encoding="utf-8") for path in sorted(out.iterdir())}


def test_committed_diagrams_match_the_table(generated: dict[str, str]) -> None:
    """Regenerating diagrams/ gives exactly the committed bytes, and ``--check`` on diagrams/ passes."""
    assert set(generated) == {"lifecycle.mmd", "lifecycle.dot", "teardown.md"}
    for name, text in generated.items():
        assert (ROOT / "diagrams" / name).read_text(encoding="utf-8") == text, f"{name}: run `make diagrams`"
    done = diagrams_command("--check", "--out", str(ROOT / "diagrams"))
    assert done.returncode == 0, done.stderr


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    """``diagrams --check`` exits 1 and names the file when a diagram differs."""
    assert diagrams_command("--out", str(tmp_path)).returncode == 0
    (tmp_path / "lifecycle.mmd").write_text("stale\n", encoding="utf-8")
    result = diagrams_command("--check", "--out", str(tmp_path))
    assert result.returncode == 1 and "lifecycle.mmd" in result.stderr
    assert "lifecycle.dot" not in result.stderr  # only the stale one is named


def test_every_edge_and_state_is_drawn_and_no_current_state_is_styled(generated: dict[str, str]) -> None:
    """Mermaid shows every declared edge, marks final states, and styles no current state."""
    text = generated["lifecycle.mmd"]
    for e in TRANSITIONS:
        assert f"{e.source.value} --> {e.dest.value}: {e.trigger.value}" in text
    assert "class closed final" in text and "class failed final" in text
    assert "taken" not in text and "current" not in text.lower()
    assert {s.value for s in State} <= set(text.replace(":", " ").split())


def test_the_dot_file_draws_exactly_the_table(generated: dict[str, str]) -> None:
    """The dot file has one node per state and exactly the declared edges, each labelled with its trigger."""
    nodes, edges = dot_statements(generated["lifecycle.dot"])
    assert set(nodes) == {s.value for s in State} | {"start"}
    assert nodes["start"]["shape"] == "point" and edges.pop(("start", State.UNINITIALIZED.value)) == {}
    assert {pair: attrs["label"] for pair, attrs in edges.items()} == {
        (e.source.value, e.dest.value): e.trigger.value for e in TRANSITIONS
    }


def test_the_dot_file_marks_final_states_and_styles_no_current_state(generated: dict[str, str]) -> None:
    """Exactly the final states have a double border; no node is coloured (as a current state) and no edge is bold."""
    nodes, edges = dot_statements(generated["lifecycle.dot"])
    assert {name for name, attrs in nodes.items() if attrs.get("peripheries") == "2"} == {
        s.value for s in State if s.is_final
    }
    assert not any("color" in attrs or "fillcolor" in attrs for attrs in nodes.values())
    assert not any("penwidth" in attrs or "color" in attrs for attrs in edges.values())


def test_a_taken_path_is_highlighted() -> None:
    """Edges passed as taken are highlighted in both formats, and only they (pins private ``mermaid``/``dot``)."""
    path = TRANSITIONS[:2]
    assert "class uninitialized,dist_ready,globals_ready taken" in mermaid(path)
    nodes, edges = dot_statements(dot(path))
    bold = {pair for pair, attrs in edges.items() if "penwidth" in attrs and "color" in attrs}
    assert bold == {(e.source.value, e.dest.value) for e in path}
    assert {name for name, attrs in nodes.items() if attrs.get("peripheries") == "2"} == {"closed", "failed"}


def test_the_dot_text_is_deterministic() -> None:
    """The same table and taken edges give the same bytes, whatever the order the taken edges come in."""
    assert dot() == dot() == (ROOT / "diagrams" / "lifecycle.dot").read_text(encoding="utf-8")
    assert dot(TRANSITIONS[:3]) == dot(tuple(reversed(TRANSITIONS[:3]))) == dot(set(TRANSITIONS[:3]))


def test_drawing_logs_no_transitions_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Drawing the dot diagram (plain and with a path) logs nothing at WARNING or above from transitions."""
    with caplog.at_level(logging.DEBUG):
        dot()
        dot(TRANSITIONS)
    assert [r for r in caplog.records if r.name.startswith("transitions") and r.levelno >= logging.WARNING] == []


def test_without_the_graphviz_package_dot_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the ``graphviz`` Python package, drawing the dot diagram raises an ImportError naming the install."""
    monkeypatch.setitem(sys.modules, "graphviz", None)  # makes `import graphviz` fail
    with pytest.raises(ImportError, match="pip install graphviz"):
        dot()


def test_the_reference_embeds_the_current_mermaid_diagram(generated: dict[str, str]) -> None:
    """docs/reference.md's States section shows the same Mermaid diagram as the command generates."""
    readme = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    assert "```mermaid\n" + generated["lifecycle.mmd"] + "```" in readme
