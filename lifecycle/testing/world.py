"""n-rank worlds for the pytest plugin: a test function run on N gloo ranks, one process each.

The parent (``WorldPool``) starts one worker process per rank (``python -m
lifecycle.testing.world``), each in its own process session and marked like
``launch_ranks``' ranks (``LIFECYCLE_LAUNCH``), so that whatever a rank starts is found
and killed with it. For each test it sends every rank the test's module path, the
function's name and its parametrize values (pickled); each rank imports the module
(asserts rewritten as pytest does), calls the function with ``world`` (a ``World``),
the factory fixtures and those values, tears the factories down, and replies with how
it went and what it left alive. A rank that left nothing alive waits for the next test
(the pool is reused); one that left something exits, and the next test gets fresh
workers. At the timeout every rank still running is sent SIGUSR1 (``faulthandler``
prints its Python stack into its output), then the whole pool is killed.

No torch here: a rank imports what the test module imports.
"""

from __future__ import annotations

import ast
import contextlib
import faulthandler
import gc
import importlib.util
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import IO, TYPE_CHECKING, Any

from lifecycle._core.errors import check_number
from lifecycle._launch.launcher import kill_group, kill_marked, marked, set_parent_death_signal, wait_gone
from lifecycle.testing.launch import _KILL_WAIT_S, LOOPBACK, MARK, _base_env
from lifecycle.testing.ports import free_port

if TYPE_CHECKING:
    from lifecycle._torch.config import DistributedConfig

__all__ = ["FIXTURES", "Call", "RankOutcome", "World", "WorldPool"]

FIXTURES = frozenset({"world", "session", "megatron_parallel"})
"""The fixtures a rank provides itself; a ``world`` test may ask only for these and its parametrize values."""

_HEADER = struct.Struct("!Q")
_STACK_WAIT_S = 2.0  # for a rank to write its stack after SIGUSR1
_START_S = 60.0  # for a new worker to start (an interpreter and lifecycle's imports)
_READ_S = 30.0  # for a message whose first bytes arrived to arrive whole
_STACK_MARK = "most recent call first"


@dataclass(frozen=True, slots=True)
class World:
    """This rank's place in the world of a ``world`` test: ``rank`` of ``size``, rendezvous at ``master_addr:port``.

    The environment carries the same (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``), so ``torch.distributed.init_process_group("gloo")``
    and a ``DistributedConfig()`` with no fields work as under torchrun. ``timeout_s``:
    the test's timeout, after which every rank is killed.
    """

    rank: int
    size: int
    master_addr: str
    master_port: int
    timeout_s: float

    @property
    def group_timeout_s(self) -> float:
        """The group timeout ``config`` and the factory fixtures use: half the test's, at most 30 s."""
        return min(30.0, self.timeout_s / 2)

    def config(self, **fields: Any) -> DistributedConfig:
        """A gloo ``DistributedConfig`` for this rank (``fields`` override any of its values)."""
        from lifecycle._torch.config import DistributedConfig

        values: dict[str, Any] = {
            "backend": "gloo",
            "world_size": self.size,
            "rank": self.rank,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "timeout_s": self.group_timeout_s,
        }
        values.update(fields)
        return DistributedConfig(**values)


@dataclass(frozen=True, slots=True)
class Call:
    """One test for the ranks: its node id, module (name and file), function (qualified name), arguments."""

    nodeid: str
    module: str
    path: str
    qualname: str
    argnames: tuple[str, ...]
    params: bytes
    """The parametrize values the function takes, pickled (a dict by name)."""


@dataclass(frozen=True, slots=True)
class RankOutcome:
    """How one rank ran a test: ``outcome`` is passed, failed, skipped, crashed or timed_out.

    ``summary``: one line (the exception); ``detail``: its traceback, or the rank's
    Python stack when it timed out; ``output``: what it printed during the test;
    ``leaks``: what it left alive (then its worker exited); ``pid``: the worker's;
    ``failed_at``: the wall time its test raised (None if it did not); ``notes``: the
    ``lifecycle:`` notes on its exception (a survivor's names the rank that failed first).
    """

    rank: int
    outcome: str
    summary: str = ""
    detail: str = ""
    output: str = ""
    leaks: tuple[str, ...] = ()
    pid: int = 0
    failed_at: float | None = None
    notes: str = ""

    @property
    def reusable(self) -> bool:
        """True if its worker ran the test to the end and left nothing alive: it can run the next test."""
        return self.outcome in ("passed", "failed", "skipped") and not self.leaks


def _send(sock: socket.socket, message: object) -> None:
    data = pickle.dumps(message)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def _receive(sock: socket.socket) -> Any:
    """The next message, or None once the other side closed (or broke) the connection."""
    try:
        header = _exactly(sock, _HEADER.size)
        if header is None:
            return None
        body = _exactly(sock, _HEADER.unpack(header)[0])
    except OSError:
        return None
    return None if body is None else pickle.loads(body)


class WorldPool:
    """The worker processes of one world size: rank ``r`` is ``procs[r]``. Not thread-safe.

    ``env``: added to the workers' environment; ``sys_path`` and ``cwd``: the test
    process's, so that a rank imports test modules as it does.
    """

    def __init__(self, size: int, *, sys_path: list[str], cwd: str, env: dict[str, str] | None = None) -> None:
        """Start ``size`` workers (they get ready in the background: ``run`` waits for them)."""
        check_number("size", size, at_least=1)
        self.size = size
        self.launch = uuid.uuid4().hex
        self.procs: list[subprocess.Popen[bytes]] = []
        self.socks: list[socket.socket] = []
        self.logs: list[IO[bytes]] = []
        self._ready = False
        package_root = str(Path(__file__).resolve().parents[2])
        base = _base_env(env)
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, base.get("PYTHONPATH")]))
        try:
            for rank in range(size):
                ours, theirs = socket.socketpair()
                # Appended to by the worker, read with pread; closed by kill().
                log = tempfile.TemporaryFile(mode="a+b")  # noqa: SIM115
                self.socks.append(ours)
                self.logs.append(log)
                with theirs:
                    self.procs.append(
                        subprocess.Popen(
                            [sys.executable, "-m", "lifecycle.testing.world", str(theirs.fileno())],
                            pass_fds=(theirs.fileno(),),
                            env={**base, MARK: f"{self.launch}:{rank}"},
                            cwd=cwd,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                            start_new_session=True,
                        )
                    )
                _send(ours, {"op": "init", "rank": rank, "size": size, "sys_path": sys_path, "cwd": cwd})
        except BaseException:
            self.kill()
            raise

    @property
    def pids(self) -> tuple[int, ...]:
        """The workers' process ids, by rank."""
        return tuple(proc.pid for proc in self.procs)

    def alive(self) -> bool:
        """True while every worker runs."""
        return all(proc.poll() is None for proc in self.procs)

    def _wait_ready(self) -> list[RankOutcome]:
        """Wait for every worker's ready message; the ranks that did not start in time, as crashed outcomes."""
        if self._ready:
            return []
        pending = dict(enumerate(self.socks))
        deadline = time.monotonic() + _START_S
        failed: list[RankOutcome] = []
        while pending and time.monotonic() < deadline:
            readable, _, _ = select.select(list(pending.values()), [], [], max(deadline - time.monotonic(), 0.0))
            for rank, sock in list(pending.items()):
                if sock in readable:
                    del pending[rank]
                    if _receive(sock) is None:
                        failed.append(self._crashed(rank, "its worker exited before it was ready", 0))
        failed += [self._crashed(rank, f"its worker did not start within {_START_S:g} s", 0) for rank in pending]
        self._ready = not failed
        return failed

    def _output(self, rank: int, since: int) -> str:
        fd = self.logs[rank].fileno()
        size = os.fstat(fd).st_size
        return os.pread(fd, max(size - since, 0), since).decode(errors="replace")

    def _crashed(self, rank: int, why: str, since: int) -> RankOutcome:
        proc = self.procs[rank]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(1.0)
        code = proc.poll()
        how = f"exit code {code}" if code is not None and code >= 0 else f"killed by signal {-(code or 0)}"
        return RankOutcome(rank, "crashed", f"{why} ({how})", "", self._output(rank, since), pid=proc.pid)

    def run(self, call: Call, *, master_port: int | None = None, timeout_s: float) -> list[RankOutcome]:
        """Run ``call`` on every rank; return how each rank ran it, by rank.

        Within ``timeout_s`` (the workers' start not counted) every rank replies, or
        exits (``crashed``); at the timeout every rank still running has its Python stack
        printed into its output (``detail``) and the pool is killed (``timed_out``).
        After a crash or a timeout the pool is dead (``alive()`` is False).
        """
        not_started = self._wait_ready()
        if not_started:
            self.kill()
            started = {o.rank for o in not_started}
            return sorted(not_started + [RankOutcome(r, "crashed", "a peer did not start") for r in range(self.size)
                                         if r not in started], key=lambda o: o.rank)  # fmt: skip
        port = free_port(LOOPBACK) if master_port is None else master_port
        since = [os.fstat(log.fileno()).st_size for log in self.logs]
        message = {"op": "run", "call": call, "port": port, "timeout_s": timeout_s}
        for sock in self.socks:
            with contextlib.suppress(OSError):  # its reply is missing: reported as crashed below
                _send(sock, message)
        outcomes: dict[int, RankOutcome] = {}
        pending = dict(enumerate(self.socks))
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            readable, _, _ = select.select(list(pending.values()), [], [], max(deadline - time.monotonic(), 0.0))
            for rank, sock in list(pending.items()):
                if sock not in readable:
                    continue
                del pending[rank]
                sock.settimeout(_READ_S)
                reply = _receive(sock)
                sock.settimeout(None)
                if reply is None:
                    outcomes[rank] = self._crashed(rank, "its process exited during the test", since[rank])
                else:
                    outcomes[rank] = RankOutcome(**{**reply, "output": self._output(rank, since[rank])})
        if pending:
            outcomes.update(self._stacks(pending, since, timeout_s))
            self.kill()
        return [outcomes[rank] for rank in range(self.size)]

    def _stacks(self, late: dict[int, socket.socket], since: list[int], timeout_s: float) -> dict[int, RankOutcome]:
        """SIGUSR1 each late rank (its faulthandler prints every thread's stack); collect the stacks."""
        before = {rank: self._output(rank, since[rank]).count(_STACK_MARK) for rank in late}
        for rank in late:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.procs[rank].pid, signal.SIGUSR1)
        deadline = time.monotonic() + _STACK_WAIT_S
        while time.monotonic() < deadline:
            if all(self._output(r, since[r]).count(_STACK_MARK) > before[r] for r in late):
                break
            time.sleep(0.02)
        time.sleep(0.05)  # the rest of the dump
        found = {}
        for rank in late:
            output = self._output(rank, since[rank])
            start = output.find("Thread 0x") if "Thread 0x" in output else output.find("Current thread")
            stack = output[start:] if start >= 0 else "(no stack: the rank did not answer SIGUSR1)"
            summary = f"still running after {timeout_s:g} s: killed"
            found[rank] = RankOutcome(rank, "timed_out", summary, stack, output, pid=self.procs[rank].pid)
        return found

    def close(self) -> None:
        """Ask every worker to exit; kill them (and what they started) if they do not within a second."""
        for sock in self.socks:
            with contextlib.suppress(OSError):
                _send(sock, {"op": "exit"})
        deadline = time.monotonic() + 1.0
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(deadline - time.monotonic(), 0.0))
        self.kill()

    def kill(self) -> None:
        """Kill every worker and every process they started (found by their mark); wait until they are gone."""
        mark = f"{self.launch}:"
        doomed = set(marked(MARK, mark))
        for proc in self.procs:
            kill_group(proc)
        kill_marked(MARK, mark)  # what they started in sessions of its own
        wait_gone(doomed, _KILL_WAIT_S)
        for sock in self.socks:
            sock.close()
        for log in self.logs:
            log.close()
        self.socks, self.logs = [], []


# -- the worker ---------------------------------------------------------------------------------


def _import(name: str, path: str) -> ModuleType:
    """The test module ``name`` from ``path``, imported once per file (asserts rewritten where pytest allows)."""
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None) == path:
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None:
        raise ImportError(f"cannot import {name} from {path}")
    module = importlib.util.module_from_spec(spec)
    source = Path(path).read_bytes()
    tree = ast.parse(source, filename=path)
    with contextlib.suppress(Exception):  # pytest's rewriter is internal: plain asserts if it changed
        from _pytest.assertion.rewrite import rewrite_asserts

        rewrite_asserts(tree, source, path, None)
    sys.modules[name] = module
    try:
        exec(compile(tree, path, "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _function(module: ModuleType, qualname: str) -> Any:
    """The test function (a method of a fresh instance of its class, for a test in a class)."""
    *owners, name = qualname.split(".")
    target: Any = module
    for owner in owners:
        target = getattr(target, owner)
    if owners:
        target = target()
    return getattr(target, name)


def _children() -> list[int]:
    """pids of the processes this one started that still run (Linux ``/proc``; none elsewhere)."""
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").glob("[0-9]*/stat") if Path("/proc").is_dir() else ():
        try:
            stat = entry.read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == me and fields[0] not in ("Z", "X"):
            found.append(int(entry.parent.name))
    return found


def _test_frames(exc: BaseException) -> TracebackType | None:
    """The traceback from the test's frames on (this module's call into the test left out)."""
    tb = exc.__traceback__
    return tb.tb_next if tb is not None and tb.tb_next is not None else tb


def _lifecycle_notes(exc: BaseException) -> str:
    """The ``lifecycle:`` notes on ``exc`` and the exceptions it chains, one a line."""
    notes: list[str] = []
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        notes += [n for n in getattr(current, "__notes__", ()) if isinstance(n, str) and n.startswith("lifecycle:")]
        todo += [current.__cause__, current.__context__]
    return "\n".join(notes)


def _one_line(exc: BaseException) -> str:
    """``Type: the first line of its message``."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _run(call: Call, rank: int, size: int, port: int, timeout_s: float, base_env: dict[str, str]) -> dict[str, Any]:
    """Run one test on this rank: its reply (``RankOutcome`` fields, output aside)."""
    import pytest

    from lifecycle.testing.factories import GROUP_TIMEOUT_ENV, MegatronParallelFactory, SessionFactory
    from lifecycle.testing.leaks import THREAD, find_leaks, snapshot

    world = World(rank, size, LOOPBACK, port, timeout_s)
    os.environ.clear()
    os.environ.update(base_env)
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(size),
            "LOCAL_WORLD_SIZE": str(size),
            "MASTER_ADDR": LOOPBACK,
            "MASTER_PORT": str(port),
            GROUP_TIMEOUT_ENV: str(world.group_timeout_s),
        }
    )
    before = snapshot()
    sessions = SessionFactory()
    outcome, summary, detail = "passed", "", ""
    failed_at: float | None = None
    notes = ""
    try:
        function = _function(_import(call.module, call.path), call.qualname)
        params = pickle.loads(call.params)
        provided = {"world": world, "session": sessions, "megatron_parallel": MegatronParallelFactory(sessions)}
        function(**{name: provided[name] if name in provided else params[name] for name in call.argnames})
    except pytest.skip.Exception as exc:
        outcome, summary = "skipped", str(exc)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, with the rank
        failed_at, notes = time.time(), _lifecycle_notes(exc)
        outcome, summary = "failed", _one_line(exc)
        detail = "".join(traceback.format_exception(type(exc), exc, _test_frames(exc)))
        traceback.clear_frames(exc.__traceback__)
    finally:
        try:
            sessions.close()
        except BaseException as exc:  # noqa: BLE001 - a teardown error fails a test that passed
            if outcome == "passed":
                outcome, summary = "failed", f"tearing down its sessions: {_one_line(exc)}"
                detail = "".join(traceback.format_exception(exc))
    del sessions
    found = find_leaks(before)
    if any(leak.kind != THREAD for leak in found):
        gc.collect()  # a reference cycle (a failure's traceback) may be all that holds it: look again
        found = find_leaks(before, wait_threads=False)
    leaks = [str(leak) for leak in found]
    leaks += [f"process {pid} started during the test, still running" for pid in _children()]
    sys.stdout.flush()
    sys.stderr.flush()
    return {"rank": rank, "outcome": outcome, "summary": summary, "detail": detail, "leaks": tuple(leaks),
            "pid": os.getpid(), "failed_at": failed_at, "notes": notes}  # fmt: skip


def main(fd: int) -> None:
    """A rank's worker: run tests as the parent sends them until it says exit, closes, or a test leaks."""
    set_parent_death_signal(signal.SIGKILL)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    sock = socket.socket(fileno=fd)
    init = _receive(sock)
    if init is None:
        return
    sys.path[:] = init["sys_path"]
    os.chdir(init["cwd"])
    base_env = dict(os.environ)
    _send(sock, {"op": "ready", "pid": os.getpid()})
    while True:
        message = _receive(sock)
        if message is None or message["op"] == "exit":
            return
        reply = _run(message["call"], init["rank"], init["size"], message["port"], message["timeout_s"], base_env)
        _send(sock, reply)
        if reply["leaks"]:
            os._exit(0)  # what it left (a thread, a group) ends with the process; the next test gets a fresh one


if __name__ == "__main__":
    main(int(sys.argv[1]))
