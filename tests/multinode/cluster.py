"""One torchrun per namespace, c10d rendezvous on node 0: start, watch, kill a node, stop.

Every process of a node (``ip netns exec`` becomes torchrun; torchrun starts its
workers in sessions of their own) carries ``MN_NODE=<run>:<node>`` in its environment,
which is how ``kill_node`` finds all of them and ``close`` leaves nothing behind. Each
output line is timestamped (``time.monotonic``) as it arrives, so a test can measure
from an action to a node's reaction.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from multinode.netns import Node

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("train_multinode.py")
RDZV_PORT = 29400
MARK = "MN_NODE"
_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class Line:
    """One line a node printed, and when it arrived (``time.monotonic``)."""

    at: float
    node: int
    text: str


def torchrun_command(
    node: Node, host: Node, nproc: int, run_id: str, max_restarts: int = 0, worker: Path = WORKER
) -> list[str]:
    """The command docs/multinode.md's launch line becomes on ``node``, with ``host`` serving the rendezvous
    (``max_restarts`` and the ``worker`` script: the decision tests' own)."""
    return node.exec(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={host.addr}:{RDZV_PORT}",
            f"--rdzv-id={run_id}",
            f"--local-addr={node.addr}",
            f"--max-restarts={max_restarts}",
            str(worker),
        ]
    )


class TwoNodeJob:
    """torchrun on both nodes (node 0 hosts the rendezvous); use as a context manager, which stops everything."""

    def __init__(
        self,
        nodes: tuple[Node, Node],
        *,
        nproc: int = 1,
        env: Mapping[str, str] | None = None,
        node_env: tuple[Mapping[str, str], Mapping[str, str]] = ({}, {}),
        max_restarts: int = 0,
        worker: Path = WORKER,
    ) -> None:
        """Start torchrun in both namespaces now: ``nproc`` ranks each; ``env`` (the ``MN_*`` knobs), then
        ``node_env[i]`` on node ``i``, on top of this process's environment."""
        self.run = uuid.uuid4().hex[:12]
        self.nodes = nodes
        self.lines: list[Line] = []
        self._lock = threading.Lock()
        self.procs: list[subprocess.Popen[str]] = []
        self._pumps: list[threading.Thread] = []
        base = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
            "PYTHONWARNINGS": "ignore",
            "OMP_NUM_THREADS": "1",
            "TORCH_CPP_LOG_LEVEL": "error",
            **(env or {}),
        }
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            base.pop(key, None)
        try:
            for node in nodes:
                own = {
                    **base,
                    **node_env[node.index],
                    "GLOO_SOCKET_IFNAME": node.ifname,
                    MARK: f"{self.run}:{node.index}",
                }
                proc = subprocess.Popen(
                    torchrun_command(node, nodes[0], nproc, f"mn-{self.run}", max_restarts, worker),
                    env=own,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    text=True,
                    errors="replace",
                    start_new_session=True,
                )
                self.procs.append(proc)
                pump = threading.Thread(target=self._pump, args=(node.index, proc), daemon=True)
                pump.start()
                self._pumps.append(pump)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> TwoNodeJob:
        """The job itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """``close``."""
        self.close()

    def _pump(self, node: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for text in proc.stdout:
            with self._lock:
                self.lines.append(Line(time.monotonic(), node, text.rstrip("\n")))

    def output(self, node: int | None = None) -> str:
        """Everything node ``node`` (None: both) printed so far, one line each, prefixed ``n<node>``."""
        with self._lock:
            return "\n".join(f"n{ln.node} {ln.text}" for ln in self.lines if node is None or ln.node == node)

    def first(self, pattern: str, node: int | None = None, after: float = 0.0) -> Line | None:
        """The first line (of ``node``, or either) matching the regex ``pattern`` that arrived after ``after``."""
        regex = re.compile(pattern)
        with self._lock:
            return next(
                (
                    ln
                    for ln in self.lines
                    if ln.at >= after and (node is None or ln.node == node) and regex.search(ln.text)
                ),
                None,
            )

    def count(self, pattern: str, node: int | None = None) -> int:
        """How many times ``pattern`` occurs in the output (of ``node``, or either): two ranks' lines may share one."""
        regex = re.compile(pattern)
        with self._lock:
            return sum(len(regex.findall(ln.text)) for ln in self.lines if node is None or ln.node == node)

    def wait_for(self, pattern: str, n: int, timeout_s: float) -> bool:
        """Wait until ``n`` lines match ``pattern`` (True), a torchrun exits first or ``timeout_s`` passes (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.count(pattern) >= n:
                return True
            if any(proc.poll() is not None for proc in self.procs):
                return self.count(pattern) >= n
            time.sleep(_POLL_S)
        return False

    def pids(self, node: int, workers_only: bool = False) -> list[int]:
        """Running processes of ``node`` (``workers_only``: its ranks, not the agent), read from ``/proc``."""
        mark = f"{MARK}={self.run}:{node}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                if mark not in environ:
                    continue
                if workers_only and int(entry.name) == self.procs[node].pid:
                    continue  # torchrun itself (``ip netns exec`` became it), not a rank
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # a zombie has exited
            except (OSError, IndexError):
                continue
            found.append(int(entry.name))
        return found

    def kill_node(self, node: int) -> float:
        """SIGKILL every process of ``node`` (torchrun and its ranks) at once; return when (``time.monotonic``)."""
        pids = self.pids(node)
        at = time.monotonic()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert pids, f"node {node} had no process left to kill"
        return at

    def wait_gone(self, node: int, timeout_s: float, workers_only: bool = False) -> float | None:
        """Wait until ``node`` has no process (``workers_only``: no rank) left; when (``time.monotonic``), or None."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if workers_only:
                if not self.pids(node, workers_only=True):
                    return time.monotonic()
            elif self.procs[node].poll() is not None and not self.pids(node):
                return time.monotonic()
            time.sleep(_POLL_S)
        return None

    def returncode(self, node: int) -> int | None:
        """Node ``node``'s torchrun exit code (negative: killed by that signal), None while it runs."""
        return self.procs[node].poll()

    def close(self) -> None:
        """SIGKILL whatever of this job still runs, on both nodes; reap torchrun; bounded."""
        for node in (0, 1):
            for pid in self.pids(node):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for pump in self._pumps:
            pump.join(timeout=5)
