"""Every Mermaid file ``show`` writes parses with the pinned ``mermaid`` npm package (``make mermaid``).

The journals cover the shapes the verdict and the gantt chart take: a failure ordered
by the store's sequence number, one by wall time only, a SIGKILLed rank, two ranks
failing at once, no failure, and 1,024 ranks. ``tools/mermaid/parse.mjs`` runs
``mermaid.parse`` (and computes a gantt chart's tasks) on each file in one node
process. A deliberately broken chart is rejected, so the check can fail. Skipped only
where ``node`` is absent, and under ``CI=true`` that is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.internals import synthetic

from lifecycle._tools.show.main import show_main
from lifecycle.journal import Origin, Record

pytestmark = pytest.mark.slow

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "mermaid"
TIMEOUT_S = 120


def node() -> str:
    """The ``node`` program; the test skips without it (fails under ``CI=true``), fails without ``make mermaid``."""
    found = shutil.which("node")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("node is not installed (CI=true: the Mermaid parse check must run)")
        pytest.skip("node is not installed")
    if not (TOOLS / "node_modules" / "mermaid").is_dir():
        pytest.fail(f"the pinned mermaid package is not installed in {TOOLS}: run `make mermaid`")
    return found


def parse(files: list[Path]) -> subprocess.CompletedProcess[str]:
    """``node tools/mermaid/parse.mjs FILES``, run to its end (bounded)."""
    return subprocess.run(
        [node(), str(TOOLS / "parse.mjs"), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def journals(root: Path) -> dict[str, dict[int, list[Record]]]:
    """The runs to draw, by name: rank → records."""

    def one(world: int, ends: dict[int, dict[str, object]]) -> dict[int, list[Record]]:
        return {
            rank: synthetic.rank_call(
                Origin("r", rank, 0, "ordinary", 0), world, 1_000.0, steps=5, **{"end": "closed", **ends.get(rank, {})}
            )  # type: ignore[arg-type]
            for rank in range(world)
        }

    at = 1_000.2
    return {
        "by-seq": synthetic.failing_run("r", 4, 3),
        "by-wall-time": one(
            3,
            {r: {"end": "failed", "fail_at": at + r / 50, "error": "E: x", "failure_record": False} for r in range(3)},
        ),
        "sigkill": one(4, {1: {"end": "killed"}, 0: {"end": "failed", "fail_at": at, "error": "E: x", "seq": 1}}),
        "two-failures": one(
            4,
            {
                1: {"end": "failed", "fail_at": at, "error": "InjectedFault: a; b # c: d", "seq": 1},
                2: {"end": "failed", "fail_at": at + 0.002, "error": "InjectedFault: <two>", "seq": 2},
            },
        ),
        "no-failure": one(4, {}),
        "1024-ranks": synthetic.failing_run("r", 1024, 2),
    }


def test_every_generated_mermaid_file_parses(tmp_path: Path) -> None:
    """The state diagrams and gantt charts of every shape of run parse with mermaid; the charts are under 50,000
    characters (GitHub's limit); the page carries no script (issue 27: its pictures are lifecycle's SVG, the bundle
    is for this check only)."""
    node()  # skip (or fail under CI) before anything needs the installed package
    files: list[Path] = []
    for name, ranks in journals(tmp_path).items():
        synthetic.write(tmp_path / name, ranks)
        out = tmp_path / name / "d"
        assert show_main([str(tmp_path / name), "--out", str(out), "--html", str(out / "page.html")]) == 0
        files += sorted(out.glob("*.mmd")) + sorted(out.glob("*.mermaid"))
        assert "<script" not in (out / "page.html").read_text(encoding="utf-8")  # SVG drawn by lifecycle, no bundle
    assert len([f for f in files if f.suffix == ".mermaid"]) == 9
    assert all(len(f.read_text(encoding="utf-8")) < 50_000 for f in files)
    result = parse(files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("\nok ") + result.stdout.startswith("ok ") == len(files), result.stdout


def test_a_broken_diagram_is_rejected(tmp_path: Path) -> None:
    """A chart with a task line cut before its colon, and one whose task ends before it starts, fail the check
    (exit 1, each named): the parse check can fail."""
    node()
    synthetic.write(tmp_path, synthetic.failing_run("r", 2, 1))
    assert show_main([str(tmp_path), "--out", str(tmp_path / "d")]) == 0
    good = (tmp_path / "d" / "attempt0-gantt.mermaid").read_text(encoding="utf-8")
    cut = tmp_path / "cut.mermaid"
    cut.write_text(good + "    a task without its data\n", encoding="utf-8")
    backwards = tmp_path / "backwards.mermaid"
    backwards.write_text(good + "    backwards :t999, 50, 10\n", encoding="utf-8")
    result = parse([tmp_path / "d" / "attempt0.mmd", cut, backwards])
    assert result.returncode == 1
    assert f"FAIL {cut}: Parse error" in result.stdout and f"FAIL {backwards}: gantt task" in result.stdout
    assert f"ok {tmp_path / 'd' / 'attempt0.mmd'}" in result.stdout
