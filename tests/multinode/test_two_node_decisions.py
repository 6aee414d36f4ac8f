"""The job's decision across two torchrun agents (two network namespaces), ``--max-restarts 3`` each.

Each rank trains once (``decide_worker.py``); after a failure every rank takes the job's decision
(``lifecycle.lowlevel.decide_after``) through torchrun's agent store, mirrored into each node's journal folder, and
exits with its code; torchrun restarts the workers, which read the last decision before they train. Needs root and
iproute2 (as ``test_two_nodes.py``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from multinode import netns
from multinode.cluster import TwoNodeJob
from support.internals import DECISIONS

from lifecycle.journal import RunEnd, read

pytestmark = [pytest.mark.slow, pytest.mark.sampled("two_node_decisions")]  # a seeded share in test-slow

WORKER = Path(__file__).with_name("decide_worker.py")
WAIT_S = 240.0


@pytest.fixture
def nodes() -> Iterator[tuple[netns.Node, netns.Node]]:
    """Two fresh namespaces joined by a veth pair; removed afterwards, whatever happened."""
    reason = netns.unavailable_reason()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the two-node tests must run in CI (root, iproute2), but {reason}")
        pytest.skip(reason)
    netns.sweep_stale()
    with netns.two_nodes() as pair:
        yield pair


def run_job(
    pair: tuple[netns.Node, netns.Node], tmp: Path, fault: str, when: tuple[str, str], steps: tuple[int, int] = (5, 5)
) -> list[dict[str, Any]]:
    """Run the job to its end (node i faults at step ``steps[i]`` when ``when[i]`` says); both nodes' decisions
    (the same, checked), oldest first."""
    env = {"DW_CHECKPOINT_DIR": str(tmp / "ckpt"), "DW_FAULT": fault}
    folders = (tmp / "node-a", tmp / "node-b")
    node_env = tuple(
        {
            "DW_JOURNAL_DIR": str(folders[i]),
            "DW_FAIL": when[i],
            "DW_FAIL_STEP": str(steps[i]),
            "LIFECYCLE_HOST": f"node-{'ab'[i]}",
        }
        for i in (0, 1)
    )
    with TwoNodeJob(pair, env=env, node_env=node_env, max_restarts=3, worker=WORKER) as job:  # type: ignore[arg-type]
        for node in (0, 1):
            assert job.wait_gone(node, WAIT_S), f"node {node} still running:\n{job.output()}"
        out = job.output()
    seen = []
    for folder in folders:
        paths = sorted((folder / DECISIONS).glob("*.json"), key=lambda p: [int(x) for x in p.name.split(".")[1:3]])
        seen.append([json.loads(p.read_text()) for p in paths])
    assert [[r["decision"] for r in s] for s in seen[:1]] == [[r["decision"] for r in s] for s in seen[1:]], out
    _decided_within_a_second(folders)
    return [record["decision"] for record in seen[0]]


def _decided_within_a_second(folders: tuple[Path, Path]) -> None:
    """Each decision was recorded (its first copy, on either node) within 1 s after the attempt's last rank ended."""
    ends: dict[str, float] = {}
    for record in read(list(folders)):
        if isinstance(record, RunEnd) and record.end is not None:
            key = f"{record.origin.restart_count}.{record.origin.attempt}"
            ends[key] = max(ends.get(key, 0.0), record.end)
    made: dict[str, float] = {}
    for folder in folders:
        for path in (folder / DECISIONS).glob("*.json"):
            key = ".".join(path.name.split(".")[1:3])
            made[key] = min(made.get(key, math.inf), path.stat().st_mtime)
    late = {key: made[key] - ends[key] for key in made if key in ends and made[key] - ends[key] >= 1.0}
    assert not late and set(made) <= set(ends), (late, made, ends)


@pytest.mark.timeout(300)
def test_a_transient_fault_restarts_and_finishes(nodes: tuple[netns.Node, netns.Node], tmp_path: Path) -> None:
    """A raise on node b in the first attempt only: one decision, restart, then both nodes close."""
    decisions = run_job(nodes, tmp_path, "raise", ("", "first"))
    assert [(d["decision"], d["reason"]) for d in decisions] == [("restart", "may_recover")]


@pytest.mark.timeout(300)
def test_the_same_raise_stops_after_the_second_attempt(nodes: tuple[netns.Node, netns.Node], tmp_path: Path) -> None:
    """A raise at the same step in every attempt: restart, then stop 'reproducible' after the 2nd, on both nodes."""
    decisions = run_job(nodes, tmp_path, "raise", ("", "always"))
    assert [(d["decision"], d["reason"]) for d in decisions] == [("restart", "may_recover"), ("stop", "reproducible")]


@pytest.mark.timeout(300)
def test_a_crash_always_on_one_host_stops_naming_it(nodes: tuple[netns.Node, netns.Node], tmp_path: Path) -> None:
    """A crash always on node b: stop after K=3 attempts, 'repeated_culprit', naming host node-b."""
    decisions = run_job(nodes, tmp_path, "crash", ("", "always"))
    assert [d["decision"] for d in decisions] == ["restart", "restart", "stop"], decisions
    assert (decisions[-1]["reason"], decisions[-1]["host"]) == ("repeated_culprit", "node-b")


@pytest.mark.timeout(300)
def test_faults_on_alternating_nodes_spend_the_job_wide_budget(
    nodes: tuple[netns.Node, netns.Node], tmp_path: Path
) -> None:
    """Raises on alternating nodes: 3 restarts job-wide (not 3 per agent), then stop 'budget'."""
    # At different steps: the same step on either node would be the same failure ("reproducible").
    decisions = run_job(nodes, tmp_path, "raise", ("odd", "even"), steps=(6, 5))
    assert [d["decision"] for d in decisions] == ["restart"] * 3 + ["stop"], decisions
    assert decisions[-1]["reason"] == "budget"
