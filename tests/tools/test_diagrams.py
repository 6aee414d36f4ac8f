"""The committed diagrams are generated from the table and are fresh.

The tests read the diagrams the public command writes (``python -m lifecycle diagrams``);
only the path highlighting, which the command does not expose (``show`` does, from a
journal), pins the private ``lifecycle._tools.diagrams`` helpers on purpose.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lifecycle import TRANSITIONS, State

ROOT = Path(__file__).resolve().parents[2]


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
    """Mermaid and dot show every declared edge, mark final states, and style no current state."""
    text, graph = generated["lifecycle.mmd"], generated["lifecycle.dot"]
    for e in TRANSITIONS:
        assert f"{e.source.value} --> {e.dest.value}: {e.trigger.value}" in text
        assert f'{e.source.value} -> {e.dest.value} [label="{e.trigger.value}"]' in graph
    assert "class closed final" in text and "class failed final" in text
    assert "taken" not in text and "current" not in text.lower() and "penwidth" not in graph
    assert {s.value for s in State} <= set(text.replace(":", " ").split())


def test_a_taken_path_is_highlighted() -> None:
    """Edges passed as taken are highlighted in both formats, and only they (pins private ``mermaid``/``dot``)."""
    from lifecycle._tools.diagrams import dot, mermaid

    path = TRANSITIONS[:2]
    assert "class uninitialized,dist_ready,globals_ready taken" in mermaid(path)
    assert dot(path).count("penwidth") == 2


def test_the_readme_embeds_the_current_mermaid_diagram(generated: dict[str, str]) -> None:
    """The README shows the same Mermaid diagram as the command generates."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "```mermaid\n" + generated["lifecycle.mmd"] + "```" in readme
