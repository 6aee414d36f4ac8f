"""``python -m lifecycle demo``: train the default model on CPU/gloo with torchrun, then show the lifecycle.

The command launches ``torch.distributed.run`` (torchrun) with ``--nproc N`` ranks on
one machine, rendezvous on 127.0.0.1 by default; each rank runs ``pretrain`` (and,
with ``--retry``, once more in the same process after a failure). Rank 0 shows
progress. Every rank appends its journal to ``<journal dir>/rank<R>.jsonl``, labelled
with one run id the launcher makes; at the end the command prints every rank's
timeline and writes the diagrams of the path taken (``python -m lifecycle show``
prints them again later).

Options are checked before torchrun starts, by building the configs every rank
builds (``demo_config``: one source of truth), and a bad one is refused naming the
flag (``--timeout``, not ``timeout_s``): numbers, ``--fail-step`` within
``1..--steps``, ``--nproc`` against the memory available (``RANK_MEMORY_MB`` a rank;
more ranks than CPU cores is only a warning), the checkpoint and journal folders
(an empty path refused; created if need be, then a file written in each; the latest
checkpoint's tensor-parallel size must be ``--tp``'s), and the rendezvous address (it
must resolve; the port must be free here, where torchrun hosts the rendezvous). The
temporary journal folder made when ``--journal-dir`` is not given is removed at exit
unless ``--keep``.

The launcher owns what it starts. torchrun runs in its own session (a terminal's
Ctrl-C reaches the launcher alone) and gets SIGTERM if the launcher dies; every rank
gets SIGKILL if torchrun dies (Linux: a parent-death signal). The first SIGINT,
SIGTERM or SIGHUP becomes a SIGTERM for torchrun, which forwards it to the ranks:
each takes the requested exit (stops after the same step, saves, closes). torchrun
gives them ``stop_grace_s`` for that, then kills them (its shutdown timeout, set from
``--timeout``); the launcher kills torchrun if it is still there 10 s later. A second signal kills
torchrun and the ranks at once; signals within ``SAME_REQUEST_S`` of the first are
that first request (``timeout`` and ``srun`` forward a copy of the terminal's Ctrl-C).
Either way, and on every other way out, the timeline of what the journals hold is
printed and no process the demo started is left running.
torchrun gives up a rendezvous it cannot reach after ``--timeout`` seconds, and the
launcher stops a torchrun whose ranks never start. A torchrun agent that is stopped
(SIGSTOP) never collects its ranks nor exits: once every rank has ended (or none has
journaled anything for ``AGENT_STALL_S``), the launcher says so, SIGKILLs it and collects
its ranks (it is their subreaper), and reports (``_AgentWatch``). A killed agent ends
the wait at once, and is said to be killed; its ranks die with it (their parent-death
signal).

With ``--retry`` a failure that leaves every process alive is retried in the same
processes, and torchrun restarts every rank after a lost one (``--max-restarts``,
default 3): each resumes from the last committed checkpoint (docs/recovery.md).

Exit code, from ``lifecycle.ExitCode`` (docs/recovery.md), whatever torchrun's own:
0 when every rank's last attempt ended ``closed`` after all its steps; 75 when they
closed on a stop asked for by a signal (the ranks did what was asked); 93 when a rank
decided a restart would fail the same way (its marker in the journal folder); 1
otherwise; 2 for a refused option. The last line says which, and why.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

from lifecycle._core.bounds import Bounds
from lifecycle._launch.launcher import (
    become_subreaper,
    child_env,
    die_with,
    kill_group,
    kill_marked,
    marked,
    process_state,
    reap_orphans,
    torchrun_command,
)
from lifecycle._tools.demo.console import RANK_LOGS, TORCHRUN_LOG, RankOutput
from lifecycle._tools.demo.options import (
    SAME_REQUEST_S,
    UsageError,
    check_options,
    demo_config,
    flag_of,
    max_restarts,
    parser,
)
from lifecycle._tools.demo.report import Ending, Run, rank_journals, report
from lifecycle._tools.demo.worker import STOP_MARKER
from lifecycle._training.exits import ExitCode
from lifecycle._training.retry import STOP_FILE

WALL_LIMIT_S = 1800.0
"""The demo stops torchrun after this long: a stuck demo must not hang a terminal or a CI job."""

RANK_MEMORY_MB = 400
"""Memory one demo rank needs: its resident set (torch, megatron-core, gloo, the model), rounded up.

See docs/benchmarks.md, demo-rank-rss: re-measure it when the demo's model or stack changes.
"""

AGENT_MEMORY_MB = 230
"""Memory torchrun's agent needs: its resident set, rounded up (see docs/benchmarks.md, demo-agent-rss)."""

STARTUP_S = 120.0
"""How long torchrun and its ranks may take to import torch and start, on top of the rendezvous timeout."""

AGENT_CONFIRM_S = 1.0
"""How long torchrun's agent must have been seen stopped with every rank ended before the launcher kills it."""

REAP_S = 10.0
"""How long the launcher waits, once torchrun is gone, for ranks re-parented to it to end and be collected."""

AGENT_STALL_S = 30.0
"""How long torchrun's agent may be stopped while no rank journals anything, ranks still running, before it is killed.

The ranks' own liveness monitors fail them (``StoreHostLost``) within the phase's
deadline and 4 intervals of the store falling silent; this bounds a run without them."""

_RUN_ID = "LIFECYCLE_RUN_ID"
_POLL_S = 0.1
WORKER = "lifecycle._tools.demo.worker"
"""The module every rank runs, with the user's own demo arguments."""


def demo_main(argv: list[str]) -> int:
    """Run the demo (see the module doc); return its exit code (``lifecycle.ExitCode``: 0, 1, 2, 75 or 93).

    Arguments argparse cannot parse end the process with exit code 2 (``SystemExit``).
    The temporary folder the demo makes when ``--journal-dir`` is not given is removed
    at the end, however the demo ends, unless ``--keep``.
    """
    options = parser().parse_args(argv)
    try:
        plan = _plan(options, argv)
    except UsageError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # e.g. during a slow name lookup: nothing was started
        print("\ndemo: interrupted while checking the options; nothing was started", file=sys.stderr)
        return 1
    try:
        return _launch(plan)
    finally:
        if plan.temporary is not None and not options.keep:
            shutil.rmtree(plan.temporary, ignore_errors=True)


# -- the checks that need the machine: memory, folders, the rendezvous ---------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    """A checked demo: everything torchrun and the ranks will be given.

    ``worker_args``: the user's own arguments, plus ``--journal-dir`` when the demo made
    the folder (the ranks parse them as the launcher did). ``temporary``: that folder,
    removed once the demo has reported unless ``--keep``.
    """

    options: argparse.Namespace
    worker_args: list[str]
    journal_dir: Path
    checkpoint_dir: Path
    port: int
    local: bool
    temporary: Path | None = None
    liveness: str = ""
    """The liveness deadlines in force, in words ("" when liveness is off), for the start line."""


def _plan(options: argparse.Namespace, argv: list[str]) -> _Plan:
    """Check every option, cheapest first; make the folders. ``UsageError`` naming the flag of the first bad one."""
    with warnings.catch_warnings(record=True) as warned:  # the config's own warnings, said as the demo's
        warnings.simplefilter("always")
        check_options(options)
    for said in dict.fromkeys(str(warning.message) for warning in warned):
        field, _, rest = said.partition(" ")
        print(f"demo: warning: {flag_of(field)} {rest}", file=sys.stderr)
    _check_memory(options.nproc)
    port, local = _check_rendezvous(options.master_addr, options.master_port)
    worker_args = list(argv)
    made = None
    if options.journal_dir is None:
        try:
            made = Path(tempfile.mkdtemp(prefix="lifecycle-demo-"))
        except OSError as exc:
            raise UsageError("--journal-dir", f"not given, and no temporary folder could be made: {exc}") from None
        worker_args.append(f"--journal-dir={made}")
    # The folders every rank will use: its own config, built from its own arguments.
    with warnings.catch_warnings():  # said above
        warnings.simplefilter("ignore", RuntimeWarning)
        ranks = demo_config(parser().parse_args(worker_args))
    journal_dir, checkpoint_dir = Path(str(ranks.journal_dir)), Path(str(ranks.checkpoint.dir))
    try:
        _check_folder("--journal-dir", journal_dir)
        if rank_journals(journal_dir):
            raise UsageError("--journal-dir", f"{journal_dir} already holds journals: give an empty folder")
        _check_folder("--checkpoint-dir", checkpoint_dir)
        check_checkpoint_layout(checkpoint_dir, options.tp)
    except UsageError:
        if made is not None:  # the temporary folder made above: nothing will use it
            shutil.rmtree(made, ignore_errors=True)
        raise
    in_force = ranks.liveness.in_force(ranks.distributed.timeout_s)
    return _Plan(options, worker_args, journal_dir, checkpoint_dir, port, local, made, liveness=in_force)


def _latest_layout(folder: Path) -> tuple[int, dict[str, int] | None] | None:
    """The step and recorded layout of ``folder``'s latest checkpoint (as ``lifecycle.checkpoint.layout`` writes it).

    None when there is none, or it cannot be read: the ranks' own resume then decides.
    Read here with ``json`` alone: ``lifecycle.checkpoint`` loads torch, which the launcher never imports.
    """
    try:
        step = json.loads((folder / "latest").read_bytes())["step"]
        manifest = json.loads((folder / f"step_{int(step):010d}" / "manifest.json").read_bytes())
        layout = manifest.get("layout")
        return int(step), None if layout is None else {key: int(layout[key]) for key in ("tensor", "pipeline", "data")}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_checkpoint_layout(folder: Path, tp: int) -> None:
    """Refuse a checkpoint folder whose latest checkpoint another ``--tp`` wrote: every rank would refuse to resume."""
    found = _latest_layout(folder)
    if found is None:
        return
    step, layout = found
    if layout is not None and (layout["tensor"], layout["pipeline"]) == (tp, 1):
        return  # another data-parallel size is fine: the ranks reload their slice's shard
    wrote = "one shard per rank (no layout)" if layout is None else f"TP{layout['tensor']} PP{layout['pipeline']}"
    use = "" if layout is None else f", or --tp {layout['tensor']}"
    raise UsageError(
        "--checkpoint-dir",
        f"{folder} holds a checkpoint (step {step}) written at {wrote}; this run is TP{tp} PP1 (--tp {tp}), and "
        f"a resume needs the same tensor and pipeline sizes: give another --checkpoint-dir{use}",
    )


def _available_memory_mb() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo``, in MB (None where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name == "MemAvailable":
                return int(value.split()[0]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cpu_cores() -> int:
    """The CPU cores this process may run on."""
    sched_getaffinity: Callable[[int], set[int]] | None = getattr(os, "sched_getaffinity", None)
    return len(sched_getaffinity(0)) if sched_getaffinity is not None else os.cpu_count() or 1


def _check_memory(nproc: int) -> None:
    """Refuse more ranks than the available memory holds; warn when ranks outnumber the CPU cores."""
    available = _available_memory_mb()
    needed = nproc * RANK_MEMORY_MB + AGENT_MEMORY_MB
    if available is not None and needed > available:
        raise UsageError(
            "--nproc",
            f"{nproc}: each rank needs about {RANK_MEMORY_MB} MB and torchrun about {AGENT_MEMORY_MB} MB, "
            f"{needed} MB in all, but this machine has {available} MB available "
            f"(at most {max(0, (available - AGENT_MEMORY_MB) // RANK_MEMORY_MB)} ranks)",
        )
    cores = _cpu_cores()
    if nproc > cores:
        print(
            f"demo: warning: --nproc {nproc} ranks share {cores} CPU cores: training is slower, "
            "and a rank starved of CPU may need a longer --timeout",
            file=sys.stderr,
        )


def _bindable(family: int, host: str, port: int) -> bool:
    """Whether a TCP socket binds ``host:port`` here (as torchrun's store does: with ``SO_REUSEADDR``)."""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _check_rendezvous(addr: str, port: int) -> tuple[int, bool]:
    """Resolve ``addr``; check or pick the port torchrun's store will listen on here; return (port, addr is local).

    torchrun (node 0 of one) hosts the rendezvous store itself, listening on every
    interface, so ``port`` must be free here whatever ``addr`` is; 0 picks a free one.
    An ``addr`` that is no address of this machine is only warned about: it works if
    it leads back here, and torchrun gives up on it after ``--timeout``.
    """
    try:
        found = socket.getaddrinfo(addr, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        why = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise UsageError("--master-addr", f"{addr!r} does not resolve: {why}") from None
    addresses = list(dict.fromkeys((family, str(sockaddr[0])) for family, _, _, _, sockaddr in found))
    family = addresses[0][0]
    local = any(_bindable(fam, host, 0) for fam, host in addresses)
    if port:
        if not _bindable(family, "", port):
            raise UsageError("--master-port", f"{port} is in use on this machine, where torchrun hosts the rendezvous")
    else:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            port = int(sock.getsockname()[1])
    if not local:
        shown = ", ".join(host for _, host in addresses)
        print(
            f"demo: warning: --master-addr {addr} ({shown}) is not an address of this machine; torchrun hosts "
            f"the rendezvous here, so it works only if that address leads back here",
            file=sys.stderr,
        )
    return port, local


def _check_folder(flag: str, folder: Path) -> None:
    """Create ``folder`` if need be and write (and remove) a file in it; ``UsageError`` naming ``flag`` if not."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(flag, f"{folder} is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(flag, f"{folder} cannot be created: {exc.strerror or exc}") from None
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".demo-probe-")
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise UsageError(flag, f"{folder} is not writable: {exc.strerror or exc}") from None


# -- the launcher: torchrun supervised, nothing left running ----------------------------


def stop_grace_s(timeout_s: float) -> float:
    """How long the ranks get for a requested stop before torchrun's SIGKILL (``Bounds.stop_grace_s``, said why).

    The launcher itself kills torchrun only ``LAUNCHER_MARGIN_S`` later (``Bounds.launcher_grace_s``).
    """
    return Bounds(timeout_s).stop_grace_s


class _Signals:
    """SIGINT, SIGTERM and SIGHUP while the launcher runs: recorded by name, never raised.

    ``received`` holds one name per request: a signal within ``SAME_REQUEST_S`` of the
    first one is that request again (a forwarding parent's copy of one Ctrl-C), not
    recorded; ``merged`` counts those.
    """

    NAMES: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.received: list[str] = []
        self.merged = 0
        self._clock = clock
        self._first: float | None = None
        self._previous: dict[int, object] = {}

    def _record(self, signum: int, frame: FrameType | None) -> None:
        now = self._clock()
        if self._first is None:
            self._first = now
        elif now - self._first < SAME_REQUEST_S:
            self.merged += 1
            return
        self.received.append(signal.Signals(signum).name)

    @contextlib.contextmanager
    def installed(self) -> Iterator[_Signals]:
        """Record the signals inside the block; the previous handlers are back after it."""
        for signum in self.NAMES:
            self._previous[signum] = signal.signal(signum, self._record)
        try:
            yield self
        finally:
            for signum, previous in self._previous.items():
                signal.signal(signum, previous)  # type: ignore[arg-type]


def _launch(plan: _Plan) -> int:
    """Start torchrun on the checked ``plan``, supervise it, leave nothing running, report; the exit code."""
    args = plan.options
    # After "--", torchrun's own parser leaves the demo's flags alone (it would take
    # --nproc for an ambiguous prefix of its --nproc-per-node, and refuse it).
    script = ["-m", WORKER, "--", *plan.worker_args]
    rank_logs = plan.journal_dir / RANK_LOGS
    command = torchrun_command(
        args.nproc,
        args.master_addr,
        plan.port,
        script,
        rendezvous_timeout_s=args.timeout,
        max_restarts=max_restarts(args),
        rank_logs=rank_logs,
    )
    env = child_env(args.master_addr, group_timeout_s=args.timeout)  # torchrun's own stop grace: the derived one
    env.setdefault("PYTHONUNBUFFERED", "1")  # the ranks' lines reach their files, and the terminal, as printed
    # Every rank labels its journal with this run id (see ``lifecycle.journal.run_id``);
    # it also marks every process the demo starts, so that none is left behind.
    run_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    env[_RUN_ID] = run_id
    rendezvous = f"{args.master_addr}:{plan.port}"
    layout = f"TP{args.tp} PP1 DP{args.nproc // args.tp}"
    print(f"demo: {args.nproc} ranks ({layout}), {args.steps} steps, rendezvous {rendezvous}", flush=True)
    print(f"demo: journals in {plan.journal_dir}, checkpoints in {plan.checkpoint_dir}", flush=True)
    if plan.liveness:
        print(f"demo: liveness {plan.liveness}", flush=True)
    torchrun_log = plan.journal_dir / TORCHRUN_LOG
    started = time.monotonic()
    with _Signals().installed() as signals, torchrun_log.open("ab") as log:
        # Said once a Ctrl-C is a stop asked for (recorded, never raised): a test waits for this line to send one.
        print(f"demo: torchrun's own output goes to {torchrun_log}, each rank's to {rank_logs}/", flush=True)
        become_subreaper()  # ranks a stopped torchrun leaves behind come here to be collected
        process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session: a terminal's Ctrl-C reaches the launcher only
            preexec_fn=die_with(os.getpid(), signal.SIGTERM),  # safe: the launcher runs no other thread yet
        )
        console = RankOutput(rank_logs).start()  # the ranks' lines, live; torchrun's stay in its file
        try:
            ending = _supervise(process, signals, plan, rendezvous, started, run_id)
        finally:
            if process.poll() is None:
                kill_group(process)
            kill_marked(_RUN_ID, run_id)  # the death signals' backstop
            reap_orphans(within_s=REAP_S)  # what torchrun left (ranks it never collected), re-parented here
            console.stop()
        for note in ending.notes:
            print(f"demo: {note}", file=sys.stderr, flush=True)
        removed = plan.temporary is not None and not args.keep
        run = Run(plan.journal_dir, args.nproc, run_id, rendezvous, plan.local, args.timeout, removed)
        return _exit_code(report(run, ending, time.monotonic() - started), plan, ending)


def _supervise(
    process: subprocess.Popen[bytes], signals: _Signals, plan: _Plan, rendezvous: str, started: float, run_id: str
) -> Ending:
    """Wait for torchrun; turn the first signal into a graceful stop and the second into a kill; bound each wait.

    A stopped torchrun (``_AgentWatch``) is killed once its ranks have ended or stalled.
    """
    timeout = plan.options.timeout
    ending = Ending()
    handled = 0
    wall_deadline = started + WALL_LIMIT_S
    start_deadline: float | None = started + STARTUP_S + timeout
    stop_deadline = math.inf
    agent = _AgentWatch(process.pid, plan.journal_dir, run_id)
    while process.poll() is None:
        time.sleep(_POLL_S)
        now = time.monotonic()
        if len(signals.received) > handled:
            name, handled = signals.received[-1], len(signals.received)
            if ending.stop_signal is None and handled == 1:
                ending.stop_signal = name
                grace = stop_grace_s(timeout)
                print(
                    f"\ndemo: {name}: asking every rank to stop after its current step, save and close "
                    f"(at most {grace:.0f} s; again to kill them now)",
                    file=sys.stderr,
                    flush=True,
                )
                process.send_signal(signal.SIGTERM)
                stop_deadline = now + Bounds(timeout).launcher_grace_s
            else:
                ending.killed = f"{name} again: killed torchrun and the ranks"
                break
        elif now > stop_deadline:
            ending.killed = f"still running {Bounds(timeout).launcher_grace_s:.0f} s after {ending.stop_signal}: killed"
            break
        elif now > wall_deadline and ending.stop_signal is None:
            ending.notes.append(f"still running after {WALL_LIMIT_S:.0f} s; stopping it")
            ending.stop_signal = "the wall-clock limit"
            process.send_signal(signal.SIGTERM)
            stop_deadline = now + Bounds(timeout).launcher_grace_s
        elif (stuck := agent.check(now)) is not None:
            ending.killed = stuck
            break
        elif start_deadline is not None and now > start_deadline:
            if rank_journals(plan.journal_dir):
                start_deadline = None
            else:
                ending.killed = (
                    f"no rank started within {now - started:.0f} s: the rendezvous at {rendezvous} was not "
                    f"reached (--timeout {timeout:g}); killed torchrun"
                )
                break
    if ending.killed is not None:
        kill_group(process)
    ending.returncode = process.wait()
    if ending.returncode < 0 and ending.killed is None and ending.stop_signal is None:  # not the launcher's signal
        name = signal.Signals(-ending.returncode).name if -ending.returncode in signal.valid_signals() else ""
        ending.notes.append(
            f"torchrun's agent was killed by {name or f'signal {-ending.returncode}'}: its ranks die with it "
            "(their parent-death signal); a rank named below may be one of them"
        )
    return ending


class _AgentWatch:
    """Notices torchrun's agent stopped (state ``T``, a SIGSTOP) while nothing can end the run any more.

    A stopped agent neither collects its ranks (they stay zombies once they exit, on a
    ``StoreHostLost`` or at their last step) nor exits, and a stopped process cannot be
    asked to stop; ``check`` says when to kill it: every rank ended (no live process of
    the run but the agent) for ``AGENT_CONFIRM_S``, or ranks running with no journal
    growing for ``AGENT_STALL_S``. Reads ``/proc/<agent>/stat`` each poll, and more only
    while the agent is stopped.
    """

    def __init__(self, pid: int, journal_dir: Path, run_id: str) -> None:
        self.pid, self.journal_dir, self.run_id = pid, journal_dir, run_id
        self.since: float | None = None
        self.ended: float | None = None
        self.size = -1
        self.progressed = 0.0

    def check(self, now: float) -> str | None:
        """Why the agent must be killed now, or None (it is not stopped, or may still be waited for)."""
        if process_state(self.pid) not in ("T", "t"):
            self.since = self.ended = None
            return None
        size = sum(_size(path) for path in rank_journals(self.journal_dir))
        if self.since is None or size != self.size:
            self.since = now if self.since is None else self.since
            self.size, self.progressed = size, now
        ranks = [pid for pid in marked(_RUN_ID, self.run_id) if pid != self.pid]
        self.ended = None if ranks else (now if self.ended is None else self.ended)
        who = f"torchrun's agent (pid {self.pid}) is stopped (state T)"
        if self.ended is not None and now - self.ended >= AGENT_CONFIRM_S:
            return f"{who} and every rank has ended: it would never exit; killed it and collected its ranks"
        if ranks and now - self.progressed >= AGENT_STALL_S:
            return f"{who} and no rank has journaled anything for {AGENT_STALL_S:.0f} s: killed torchrun and the ranks"
        return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _exit_code(verdict: int, plan: _Plan, ending: Ending) -> int:
    """The demo's exit code from ``report``'s ``verdict`` (0 every rank closed, else 1), as ``lifecycle.ExitCode`` says.

    A rank's "do not restart" marker (or the job's stop decision, ``STOP_FILE``) wins; a run that closed on a
    stop signal exited as asked (``STOPPED``).
    """
    if (plan.journal_dir / STOP_MARKER).exists() or (plan.journal_dir / STOP_FILE).exists():
        return ExitCode.DO_NOT_RESTART
    if verdict == 0:
        return ExitCode.STOPPED if ending.stop_signal is not None else ExitCode.SUCCESS
    return ExitCode.RESTART
