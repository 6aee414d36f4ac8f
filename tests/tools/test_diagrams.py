"""The committed diagrams are generated from the table and are fresh."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lifecycle import TRANSITIONS, State
from lifecycle._tools.diagrams import dot, mermaid, render, stale

ROOT = Path(__file__).resolve().parents[2]


def test_committed_diagrams_match_the_table(tmp_path: Path) -> None:
    """Regenerating diagrams/ gives exactly the committed bytes."""
    assert stale(ROOT / "diagrams") == [], "run `make diagrams`"
    subprocess.run([sys.executable, "-m", "lifecycle", "diagrams", "--out", str(tmp_path)], check=True, cwd=ROOT)
    for name, text in render().items():
        assert (tmp_path / name).read_text(encoding="utf-8") == text
        assert (ROOT / "diagrams" / name).read_text(encoding="utf-8") == text


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    """``diagrams --check`` exits 1 and names the file when a diagram differs."""
    subprocess.run([sys.executable, "-m", "lifecycle", "diagrams", "--out", str(tmp_path)], check=True, cwd=ROOT)
    (tmp_path / "lifecycle.mmd").write_text("stale\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "lifecycle", "diagrams", "--check", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "lifecycle.mmd" in result.stderr


def test_every_edge_and_state_is_drawn_and_no_current_state_is_styled() -> None:
    """Mermaid and dot show every declared edge, mark final states, and style no current state."""
    text, graph = mermaid(), dot()
    for e in TRANSITIONS:
        assert f"{e.source.value} --> {e.dest.value}: {e.trigger.value}" in text
        assert f'{e.source.value} -> {e.dest.value} [label="{e.trigger.value}"]' in graph
    assert "class closed final" in text and "class failed final" in text
    assert "taken" not in text and "current" not in text.lower()
    assert {s.value for s in State} <= set(text.replace(":", " ").split())


def test_a_taken_path_is_highlighted() -> None:
    """Edges passed as taken are highlighted in both formats, and only then."""
    path = TRANSITIONS[:2]
    assert "class uninitialized,dist_ready,globals_ready taken" in mermaid(path)
    assert dot(path).count("penwidth") == 2


def test_the_readme_embeds_the_current_mermaid_diagram() -> None:
    """The README shows the same Mermaid diagram as diagrams/lifecycle.mmd."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "```mermaid\n" + mermaid() + "```" in readme
