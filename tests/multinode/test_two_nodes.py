"""Two nodes for real: torchrun --nnodes=2 with c10d rendezvous across two network namespaces.

Node 0 (``10.231.0.1``) hosts the rendezvous store; node 1 (``10.231.0.2``) joins it over
a veth pair. Every rank runs ``pretrain`` inside docs/multinode.md's retry loop
(``train_multinode.py``) with ``DistributedConfig.timeout_s = 15``. The numbers each
scenario measures are printed (``pytest -s``) and written up in docs/multinode.md.

Needs root and iproute2: elsewhere the tests skip with the reason, but under ``CI=true``
that is a failure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from multinode import netns
from multinode.cluster import Line, TwoNodeJob

pytestmark = pytest.mark.slow

TIMEOUT_S = 15.0
"""``DistributedConfig.timeout_s`` of every rank: the group's and the store's timeout."""
START_S = 90.0
"""Bound on both nodes importing torch and Megatron-core and reaching training (about 7 s here)."""
LONG_RUN = {"MN_STEPS": "5000", "MN_STEP_SLEEP_S": "0.05", "MN_TIMEOUT_S": str(TIMEOUT_S)}
"""Training that outlasts the test: the scenario's action lands mid-training."""
TRAINING = r"\] training from step"


@pytest.fixture
def nodes() -> Iterator[tuple[netns.Node, netns.Node]]:
    """Two fresh namespaces joined by a veth pair; removed afterwards (checked), whatever happened."""
    reason = netns.unavailable_reason()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the two-node tests must run in CI (root, iproute2), but {reason}")
        pytest.skip(reason)
    netns.sweep_stale()
    with netns.two_nodes() as pair:
        yield pair
    left = [name for name in netns.ours() if name in (pair[0].netns, pair[1].netns)]
    assert not left, f"namespaces left behind: {left}"


def report(scenario: str, **numbers: float | int | str | None) -> None:
    """Print one scenario's measurements on one line (seen with ``pytest -s``)."""
    shown = ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in numbers.items())
    print(f"\n[multinode] {scenario}: {shown}")


def start_training(job: TwoNodeJob, ranks: int) -> None:
    """Wait until every rank trains, then one more second; fail with both nodes' output if they do not."""
    assert job.wait_for(TRAINING, ranks, START_S), f"not every rank reached training:\n{job.output()}"
    time.sleep(1.0)


@pytest.mark.timeout(180)
def test_training_succeeds_on_both_nodes(nodes: tuple[netns.Node, netns.Node], tmp_path: Path) -> None:
    """Two torchruns, 2 ranks each, rendezvous across the veth pair: all 4 ranks train 8 steps and close, exit 0."""
    started = time.monotonic()
    with TwoNodeJob(nodes, nproc=2, env={"MN_CHECKPOINT_DIR": str(tmp_path / "ckpt")}) as job:
        for node in (0, 1):
            assert job.wait_gone(node, START_S + 60), f"node {node} still running:\n{job.output()}"
        out = job.output()
        assert (job.returncode(0), job.returncode(1)) == (0, 0), out
        for node in (0, 1):
            assert job.count(r"\] closed: steps 0→8, 1 attempt", node) == 2, out
        report("a. success", wall_s=time.monotonic() - started)


@pytest.mark.timeout(180)
def test_failure_on_node_1_is_retried_on_both_nodes(nodes: tuple[netns.Node, netns.Node], tmp_path: Path) -> None:
    """A fault at step 5 on node 1 fails attempt 0 on both nodes; the loop's retry resumes and closes on both."""
    env = {"MN_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "MN_FAIL_STEP": "5", "MN_TIMEOUT_S": str(TIMEOUT_S)}
    with TwoNodeJob(nodes, env=env, node_env=({}, {"MN_FAIL_HERE": "1"})) as job:
        for node in (0, 1):
            assert job.wait_gone(node, START_S + 4 * TIMEOUT_S), f"node {node} still running:\n{job.output()}"
        out = job.output()
        assert (job.returncode(0), job.returncode(1)) == (0, 0), out
        injected = job.first(r"failed in state training: InjectedFault", node=1)  # lifecycle's log, as it fails
        retried = job.first(r"\] attempt 0 failed: injected failure at phase 'step'", node=1)
        peer = job.first(r"\] attempt 0 failed: ", node=0)
        assert injected is not None and retried is not None and peer is not None, out
        # Node 1's teardown closes its connections: node 0 learns of the failure at once, not at the timeout.
        took = peer.at - injected.at
        assert took < TIMEOUT_S / 3, f"node 0 failed {took:.1f} s after node 1:\n{out}"
        closed = [job.first(r"\] closed: steps \d+→8, 2 attempt", node) for node in (0, 1)]
        assert all(closed), out
        starts = {line.text.split("steps ")[1].split("→")[0] for line in closed if line}
        assert starts in ({"2"}, {"4"}), f"the retry did not resume from one committed step on both nodes:\n{out}"
        report("b. retry", peer_failed_after_s=took, resumed_from=starts.pop())


@pytest.mark.timeout(180)
def test_killing_the_non_host_node_releases_the_host_node_quickly(nodes: tuple[netns.Node, netns.Node]) -> None:
    """SIGKILL of node 1 (torchrun and ranks) fails node 0's rank within timeout_s / 3; node 0 then exits 1."""
    with TwoNodeJob(nodes, env=LONG_RUN) as job:
        start_training(job, 2)
        killed = job.kill_node(1)
        released = _wait_line(job, r"\] attempt 0 failed: ", 0, killed, TIMEOUT_S + 10)
        gone = job.wait_gone(0, 2 * TIMEOUT_S + 30)
        out = job.output()
        assert released is not None, f"node 0's rank never failed after node 1 died:\n{out}"
        assert released.at - killed < TIMEOUT_S / 3, f"released {released.at - killed:.1f} s after the kill:\n{out}"
        assert gone is not None, f"node 0 still running {2 * TIMEOUT_S + 30:.0f} s after the kill:\n{out}"
        assert job.returncode(0) not in (0, None) and job.count(r"\] gave up: ", 0) == 1, out
        ending = _ending(job, 0)
        report("c. non-host killed", released_s=released.at - killed, node0_exit_s=gone - killed, ended_by=ending)


@pytest.mark.timeout(180)
def test_losing_the_host_node_releases_node_1(nodes: tuple[netns.Node, netns.Node]) -> None:
    """SIGKILL of node 0 (the rendezvous host) fails node 1's rank at once; its torchrun then exits with an error."""
    with TwoNodeJob(nodes, env=LONG_RUN) as job:
        start_training(job, 2)
        killed = job.kill_node(0)
        released = _wait_line(job, r"\] attempt 0 failed: ", 1, killed, TIMEOUT_S + 10)
        ranks_gone = job.wait_gone(1, TIMEOUT_S + 30, workers_only=True)
        gone = job.wait_gone(1, 90)
        out = job.output()
        assert released is not None, f"node 1's rank never failed after node 0 died:\n{out}"
        assert released.at - killed < TIMEOUT_S / 3, f"released {released.at - killed:.1f} s after the kill:\n{out}"
        assert ranks_gone is not None, f"node 1's rank still running {TIMEOUT_S + 30:.0f} s after the kill:\n{out}"
        assert gone is not None, f"node 1's torchrun still running 90 s after the kill:\n{out}"
        assert job.returncode(1) not in (0, None), out
        sigterm = job.first("closing signal SIGTERM", 1)  # torchrun stopping its rank, if it did
        report(
            "d. host killed",
            released_s=released.at - killed,
            node1_ranks_gone_s=ranks_gone - killed,
            node1_torchrun_exit_s=gone - killed,
            node1_rc=job.returncode(1),
            node1_torchrun_sigterm_s=sigterm.at - killed if sigterm else None,
            ended_by=_ending(job, 1),
        )


@pytest.mark.timeout(240)
def test_partition_releases_both_nodes_at_the_group_timeout(nodes: tuple[netns.Node, netns.Node]) -> None:
    """With the link down mid-training, both ranks fail at the group timeout and exit after the retry; never hang."""
    with TwoNodeJob(nodes, env=LONG_RUN) as job:
        start_training(job, 2)
        cut = time.monotonic()
        netns.set_link(nodes[0], up=False)
        released = [_wait_line(job, r"\] attempt 0 failed: ", node, cut, TIMEOUT_S + 15) for node in (0, 1)]
        ranks_gone = [job.wait_gone(node, 2 * TIMEOUT_S + 30, workers_only=True) for node in (0, 1)]
        host_gone = job.wait_gone(0, 30)
        # Node 1's torchrun, cut off from the store it must report to, is given a bounded look only.
        joiner_gone = job.wait_gone(1, 15)
        out = job.output()
        for node in (0, 1):
            line = released[node]
            assert line is not None, f"node {node}'s rank never failed after the partition:\n{out}"
            assert 0.8 * TIMEOUT_S <= line.at - cut <= TIMEOUT_S + 15, f"node {node} released at {line.at - cut:.1f} s"
            assert ranks_gone[node] is not None, f"node {node}'s rank still running after the retry's bound:\n{out}"
            assert job.count(r"\] gave up: ", node) == 1, out
        assert host_gone is not None and job.returncode(0) not in (0, None), out
        report(
            "d. partition",
            node0_released_s=released[0].at - cut if released[0] else None,
            node1_released_s=released[1].at - cut if released[1] else None,
            node0_ranks_gone_s=ranks_gone[0] - cut if ranks_gone[0] else None,
            node1_ranks_gone_s=ranks_gone[1] - cut if ranks_gone[1] else None,
            node0_torchrun_exit_s=host_gone - cut,
            node1_torchrun_exit_s=joiner_gone - cut if joiner_gone else "still running (killed by the test)",
            ended_by=f"{_ending(job, 0)} | {_ending(job, 1)}",
        )


CONVICTION_S = TIMEOUT_S / 3
"""The conviction floor at this group timeout (patience 1); the monitors look every 0.5 s (``train_multinode``)."""


@pytest.mark.timeout(240)
def test_partition_with_liveness_releases_both_sides_at_the_conviction_deadline(
    nodes: tuple[netns.Node, netns.Node],
) -> None:
    """With monitors on and the link down, each side's rank waits inside a collective nobody can leave: both are
    convicted ``collective_hang`` and killed within the conviction deadline + 2 intervals + 2 s, not the group
    timeout (issue 40). The store's side names its silent neighbour, the far side the unreachable store's host.

    A partition resets no connection, and a rank waiting in a collective cannot run a
    handler: its monitor's kill is the release. Before collective positions both sides
    waited for the 15 s group timeout.
    """
    with TwoNodeJob(nodes, env={**LONG_RUN, "MN_LIVENESS": "kill"}) as job:
        start_training(job, 2)
        cut = time.monotonic()
        netns.set_link(nodes[0], up=False)
        hung = r"lifecycle liveness: rank \d+ hung inside a collective that no rank of its group left"
        named = [_wait_line(job, hung, node, cut, TIMEOUT_S + 15) for node in (0, 1)]
        gone = [job.wait_gone(node, 2 * TIMEOUT_S + 30, workers_only=True) for node in (0, 1)]
        out = job.output()
        bound = CONVICTION_S + 2 * 0.5 + 2.0
        for node, line in enumerate(named):
            assert line is not None, f"node {node}'s rank was not convicted after the partition:\n{out}"
            assert line.at - cut <= bound, f"node {node} convicted at {line.at - cut:.1f} s (bound {bound:.1f} s)"
        assert "whose monitor has been silent" in named[0].text, named[0].text
        assert "the store's host" in named[1].text and "is unreachable" in named[1].text, named[1].text
        assert all(g is not None for g in gone), out
        report(
            "e. partition with liveness",
            node0_convicted_s=named[0].at - cut,
            node1_convicted_s=named[1].at - cut,
        )


def _wait_line(job: TwoNodeJob, pattern: str, node: int, after: float, timeout_s: float) -> Line | None:
    """The first line of ``node`` matching ``pattern`` that arrived after ``after``, waiting up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = job.first(pattern, node, after)
        if line is not None:
            return line
        time.sleep(0.02)
    return job.first(pattern, node, after)


def _ending(job: TwoNodeJob, node: int) -> str:
    """The start of the error ``node``'s rank gave up with, for the report."""
    line = job.first(r"\] gave up: ", node)
    return line.text.split("gave up: ", 1)[1][:90] if line else "no 'gave up' line"
