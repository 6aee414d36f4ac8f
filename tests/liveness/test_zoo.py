"""The liveness zoo: healthy but slow episodes at the demo's defaults end in no verdict and no kill.

One run of 2 gloo ranks goes through its episodes in sequence (``tests/workers/liveness_zoo_worker.py``):
a first step 50x the rest, a 4 s callback and 4 s of CPU on rank 0, periodic steps 20x the usual on
every rank, a 3 s SIGSTOP/SIGCONT of one rank, a 5 s stall of one monitor, a whole-job 5 s suspend,
a 5 s batch on one rank, an evaluation pass 40x a step, checkpoint saves; then a SIGTERM to every
rank. Suspicions may appear and be withdrawn; none may become a verdict; the SIGTERM is a requested
stop with a final save (the demo's exit 75), never ``StoppedByLauncher``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.launch import run_workers


def _kinds(out: Path) -> dict[str, int]:
    """How many records of each kind the ranks' journals under ``out`` hold."""
    counts: dict[str, int] = {}
    for path in out.glob("rank*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                kind = json.loads(line)["kind"]
                counts[kind] = counts.get(kind, 0) + 1
    return counts


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_zoo_at_the_demos_defaults_has_no_verdict_and_no_kill(tmp_path: Path) -> None:
    """Every healthy episode passes: no verdict, suspicions withdrawn; a SIGTERM after them is a requested stop."""
    results = run_workers("liveness_zoo_worker", str(tmp_path), world_size=2, timeout_s=400)
    assert not any(result.timed_out for result in results), [str(r) for r in results]
    for result in results:
        print("\n".join(line for line in result.output.splitlines() if "liveness" in line))
        assert result.returncode == 0, result.output[-3000:]
        report = json.loads([line for line in result.output.splitlines() if line.startswith("{")][-1])
        assert report["error"] is None, report
        # Stopped by the SIGTERM at step 620 (the ranks agree on the step after), saved there; one eval pass before.
        assert report["exit_reason"] == "requested" and 620 <= report["final_step"] < 700, report
        assert report["checkpoint_step"] == report["final_step"] and 540 in report["evals"], report
    kinds = _kinds(tmp_path)
    print("zoo journal records:", kinds, "in", sorted(p.name for p in tmp_path.iterdir()))
    assert kinds.get("verdict", 0) == 0, kinds
    assert kinds.get("suspicion", 0) == kinds.get("withdrawal", 0), kinds
