"""The fault matrix's worker pool: one long-lived process per rank, started apart from the cells it runs.

Start-up and cells have separate bounds, because on a busy machine a fresh worker
spends 20-80 s importing torch, Megatron-core and NVRx, far longer than a cell runs.
``start`` spawns the workers; each says ``("ready", pid)`` once its imports are done;
``wait_ready`` waits for every rank under one start-up bound (``start_timeout_s``),
outside any cell. ``run`` sends a cell only to a ready pool and gives every rank one
deadline together, ``cell_timeout_s`` from the moment the cell is sent: a rank that
has not answered by then (or whose worker died) fails the cell, and the next cell gets
fresh workers.

A worker is any function ``target(conn, rank, world_size, base, ready_after_s)`` that
sends ``("ready", pid)`` first, then answers each ``(cell, ports, options)`` it receives with a
result dict (``rank``, ``problems``, ``elapsed``, ``fired``), until it receives None.
``ready_after_s`` delays its ready message (a worker that is slow to import, for the
pool's own tests).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection, wait
from typing import Any

import psutil

from lifecycle.testing import free_ports

CELL_TIMEOUT_S = 45.0
"""One deadline for every rank of a cell, from the moment it is sent to ready workers."""
START_TIMEOUT_S = float(os.environ.get("LIFECYCLE_MATRIX_START_S", "240"))
"""For every worker of a pool to be ready (its imports done): generous, since a loaded machine is slow to import."""

Worker = Callable[[Connection, int, int, str, float], None]


class PoolNotReady(RuntimeError):
    """Some worker of a pool did not say it was ready within the start-up bound (or exited first)."""


class Pool:
    """One worker process per rank, each serving cells; restarted after a cell that hung or killed a worker."""

    def __init__(
        self,
        world_size: int,
        base: str,
        target: Worker,
        *,
        cell_timeout_s: float = CELL_TIMEOUT_S,
        start_timeout_s: float = START_TIMEOUT_S,
        ready_after_s: Mapping[int, float] | None = None,
    ) -> None:
        """Spawn the workers (they get ready in the background: ``wait_ready`` or ``run`` waits for them)."""
        self.world_size, self.base, self.target = world_size, base, target
        self.cell_timeout_s, self.start_timeout_s = cell_timeout_s, start_timeout_s
        self.ready_after_s = dict(ready_after_s or {})
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self.ready = False
        self.start()

    def start(self) -> None:
        """Spawn one worker per rank; the pool is not ready until each has said so."""
        ctx = multiprocessing.get_context("spawn")
        self.ready = False
        for rank in range(self.world_size):
            parent, child = ctx.Pipe()
            args = (child, rank, self.world_size, self.base, self.ready_after_s.get(rank, 0.0))
            proc = ctx.Process(target=self.target, args=args)
            proc.start()
            child.close()  # the worker holds its end: a worker that dies reads as EOF here
            self.procs.append(proc)
            self.conns.append(parent)

    def wait_ready(self) -> None:
        """Return once every worker said it is ready; else restart the pool and raise ``PoolNotReady``.

        One bound for all ranks together, ``start_timeout_s`` from this call (the workers
        import in parallel).
        """
        if self.ready:
            return
        pending = {conn: rank for rank, conn in enumerate(self.conns)}
        late: list[str] = []
        deadline = time.monotonic() + self.start_timeout_s
        while pending and (left := deadline - time.monotonic()) > 0:
            for conn in wait(list(pending), timeout=left):
                rank = pending.pop(conn)
                try:
                    message = conn.recv()
                except EOFError:
                    late.append(f"rank {rank}: its worker exited before it was ready")
                    continue
                if message[0] != "ready":
                    late.append(f"rank {rank}: said {message!r} before it was ready")
        late += [f"rank {rank}: not ready within {self.start_timeout_s:g} s" for rank in pending.values()]
        if late:
            self.kill()
            self.start()
            raise PoolNotReady("; ".join(late))
        self.ready = True

    def run(self, cell: Any, **options: Any) -> list[dict[str, Any]]:
        """Run ``cell`` on every rank, by rank; a rank without an answer by the cell's deadline fails it.

        ``options`` go to every worker with the cell (the matrix worker's ``run_cell`` keywords).
        """
        self.wait_ready()
        ports = free_ports(4)
        for conn in self.conns:
            conn.send((cell, ports, options))
        deadline = time.monotonic() + self.cell_timeout_s
        pending = {conn: rank for rank, conn in enumerate(self.conns)}
        results: dict[int, dict[str, Any]] = {}
        while pending and (left := deadline - time.monotonic()) > 0:
            for conn in wait(list(pending), timeout=left):
                rank = pending.pop(conn)
                try:
                    results[rank] = conn.recv()
                except EOFError:
                    results[rank] = _missing(rank, "its worker exited during the cell")
        for rank in pending.values():
            results[rank] = _missing(rank, f"no answer within {self.cell_timeout_s:g} s of the cell's start")
        if any(r["elapsed"] is None for r in results.values()):
            self.kill()  # a hung or dead worker: the next cell runs on fresh ones
            self.start()
        return [results[rank] for rank in range(self.world_size)]

    def stop(self) -> None:
        """Ask every worker to exit; kill those (and what they started) that do not within 10 s."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self.procs:
            proc.join(timeout=10)
        self.kill()

    def kill(self) -> None:
        """Kill every worker and every process it started; wait for them."""
        for proc in self.procs:
            if proc.pid is None:
                continue
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=10)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        self.ready = False


def _missing(rank: int, why: str) -> dict[str, Any]:
    """The result of a rank that did not answer."""
    return {"rank": rank, "problems": [why], "elapsed": None, "fired": False}
