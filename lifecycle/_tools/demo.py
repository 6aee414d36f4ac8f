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
(created if need be, then a file written in each), and the rendezvous address (it
must resolve; the port must be free here, where torchrun hosts the rendezvous).

The launcher owns what it starts. torchrun runs in its own session (a terminal's
Ctrl-C reaches the launcher alone) and gets SIGTERM if the launcher dies; every rank
gets SIGKILL if torchrun dies (Linux: a parent-death signal). The first SIGINT,
SIGTERM or SIGHUP becomes a SIGTERM for torchrun, which forwards it to the ranks:
each takes the requested exit (stops after the same step, saves, closes). The
launcher waits for that at most ``stop_grace_s``, then kills. A second signal kills
torchrun and the ranks at once. Either way, and on every other way out, the timeline
of what the journals hold is printed and no process the demo started is left running.
torchrun gives up a rendezvous it cannot reach after ``--timeout`` seconds, and the
launcher stops a torchrun whose ranks never start.

Exit code: 0 when every rank's last attempt ended ``closed`` (a stop asked for by a
signal included: the ranks then did what was asked); 1 otherwise, whatever torchrun's
own exit code; 2 for a refused option. The last line says which, and why.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import logging
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

from lifecycle import journal as _journal
from lifecycle._core.errors import ConfigError
from lifecycle._core.processes import is_running, process_environments
from lifecycle._tools import show as _show
from lifecycle._torch.config import DistributedConfig, ParallelConfig
from lifecycle._training.config import (
    STEPPED_PHASES,
    CheckpointConfig,
    FaultInjection,
    Phase,
    PretrainConfig,
    TrainingConfig,
)

DEFAULT_STEPS = 1000
"""About a minute in all with 2 ranks sharing 2 CPU cores, start-up included."""

WALL_LIMIT_S = 1800.0
"""The demo stops torchrun after this long: a stuck demo must not hang a terminal or a CI job."""

RANK_MEMORY_MB = 400
"""Memory one demo rank needs: its resident set measured at 394 MB (torch, megatron-core, gloo, the model)."""

AGENT_MEMORY_MB = 230
"""Memory torchrun's agent needs: its resident set measured at 228 MB."""

STARTUP_S = 120.0
"""How long torchrun and its ranks may take to import torch and start, on top of the rendezvous timeout."""

MICRO_BATCH_SIZE = 8

_FLAGS = {
    "world_size": "--nproc",
    "tensor_model_parallel_size": "--tp",
    "model.vocab_size": "--tp",
    "model.num_heads": "--tp",
    "timeout_s": "--timeout",
    "master_addr": "--master-addr",
    "master_port": "--master-port",
    "training.iterations": "--steps",
    "training.log_interval": "--log-interval",
    "training.eval_interval": "--eval-interval",
    "checkpoint.interval": "--checkpoint-interval",
    "checkpoint.dir": "--checkpoint-dir",
    "fault.phase": "--fail-at",
    "fault.rank": "--fail-rank",
    "fault.step": "--fail-step",
}
"""The demo flag that sets each config field ``demo_config`` fills from an option."""

_RUN_ID = "LIFECYCLE_RUN_ID"
_POLL_S = 0.1
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class UsageError(Exception):
    """A demo option that cannot work: ``flag`` names it, ``message`` says why (exit code 2)."""

    def __init__(self, flag: str, message: str) -> None:
        """Record the flag and the reason; ``str()`` is ``"<flag> <message>"``."""
        self.flag, self.message = flag, message
        super().__init__(f"{flag} {message}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lifecycle demo",
        description=(
            "Train a tiny causal LM on synthetic data with torchrun on CPU/gloo, then print each rank's "
            "lifecycle timeline and draw the path the run took. Exit code 0 when every rank's last attempt "
            "ended closed (a stop asked for by Ctrl-C or SIGTERM included), 1 otherwise, 2 for a refused option. "
            "Ctrl-C once: every rank stops after the same step, saves and closes; twice: everything is killed."
        ),
    )
    parser.add_argument("--nproc", type=int, default=2, metavar="N", help="ranks to launch (default 2)")
    parser.add_argument(
        "--tp",
        type=int,
        default=1,
        metavar="N",
        help="tensor-parallel size: each rank holds 1/N of the model; must divide --nproc (default 1)",
    )
    parser.add_argument(
        "--steps", type=int, default=DEFAULT_STEPS, metavar="N", help=f"training steps (default {DEFAULT_STEPS})"
    )
    parser.add_argument("--fail-at", choices=[p.value for p in Phase], help="inject a failure at this phase")
    parser.add_argument("--fail-rank", type=int, metavar="R", help="rank that fails (default: the last rank)")
    parser.add_argument(
        "--fail-step",
        type=int,
        metavar="N",
        help="for step, eval, checkpoint, callback: fire at the first such phase at or after step N, "
        "1..--steps (default: half the steps)",
    )
    parser.add_argument(
        "--retry", action="store_true", help="after a failure, run pretrain again in the same processes"
    )
    parser.add_argument(
        "--checkpoint-dir", type=Path, metavar="DIR", help="checkpoints (default: <journal dir>/checkpoints)"
    )
    parser.add_argument("--checkpoint-interval", type=int, metavar="N", help="steps between saves (default: steps/4)")
    parser.add_argument(
        "--journal-dir", type=Path, metavar="DIR", help="where journals and diagrams go (default: a new temp dir)"
    )
    parser.add_argument("--eval-interval", type=int, metavar="N", help="steps between evaluations (default: steps/5)")
    parser.add_argument(
        "--log-interval", type=int, metavar="N", help="steps between progress lines (default: steps/20)"
    )
    parser.add_argument(
        "--master-addr", default="127.0.0.1", metavar="ADDR", help="rendezvous address (default 127.0.0.1)"
    )
    parser.add_argument(
        "--master-port", type=int, default=0, metavar="PORT", help="rendezvous port, free here (default: a free one)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="process-group and rendezvous timeout in seconds (default 30)",
    )
    parser.add_argument("--as-worker", action="store_true", help=argparse.SUPPRESS)
    return parser


def demo_main(argv: list[str]) -> int:
    """Run the demo (see the module doc); return the exit code: 0 success, 1 failed run, 2 bad arguments.

    Arguments argparse cannot parse end the process with exit code 2 (``SystemExit``).
    """
    args = _parser().parse_args(argv)
    if args.as_worker:
        return _worker(args)
    try:
        plan = _plan(args)
    except UsageError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # e.g. during a slow name lookup: nothing was started
        print("\ndemo: interrupted while checking the options; nothing was started", file=sys.stderr)
        return 1
    return _launch(plan)


# -- options: checked before anything starts ---------------------------------------------


def demo_config(args: argparse.Namespace, world_size: int) -> PretrainConfig:
    """The ``pretrain`` config every rank of a ``world_size``-rank demo runs with ``args`` (the first attempt).

    Defaults: a failure on the last rank at half the steps, a checkpoint every steps/4,
    an evaluation every steps/5 and a progress line every steps/20. Raises
    ``ConfigError`` naming the config field of a bad value (``flag_of`` names its flag).
    """
    steps = args.steps
    fault = None
    if args.fail_at is not None:
        fault = FaultInjection(
            Phase(args.fail_at),
            rank=world_size - 1 if args.fail_rank is None else args.fail_rank,
            step=max(1, steps // 2) if args.fail_step is None else args.fail_step,
        )
    return PretrainConfig(
        distributed=DistributedConfig(backend="gloo", timeout_s=args.timeout),
        parallel=ParallelConfig(tensor_model_parallel_size=args.tp, micro_batch_size=MICRO_BATCH_SIZE),
        training=TrainingConfig(
            iterations=steps,
            log_interval=max(1, steps // 20) if args.log_interval is None else args.log_interval,
            eval_interval=max(1, steps // 5) if args.eval_interval is None else args.eval_interval,
        ),
        checkpoint=CheckpointConfig(
            dir=str(args.checkpoint_dir),
            interval=max(1, steps // 4) if args.checkpoint_interval is None else args.checkpoint_interval,
            resume=True,
        ),
        fault=fault,
        journal_dir=str(args.journal_dir),
    )


def flag_of(field: str) -> str:
    """The demo flag that sets config field ``field`` (the field itself if no flag does)."""
    return _FLAGS.get(field, field)


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    """A checked demo: everything torchrun and the ranks will be given."""

    args: argparse.Namespace
    journal_dir: Path
    checkpoint_dir: Path
    port: int
    local: bool


def _plan(args: argparse.Namespace) -> _Plan:
    """Check every option, cheapest first; make the folders. ``UsageError`` naming the flag of the first bad one."""
    _check_numbers(args)
    _check_memory(args.nproc)
    port, local = _check_rendezvous(args.master_addr, args.master_port)
    journal_dir = args.journal_dir
    if journal_dir is None:
        try:
            journal_dir = Path(tempfile.mkdtemp(prefix="lifecycle-demo-"))
        except OSError as exc:
            raise UsageError("--journal-dir", f"not given, and no temporary folder could be made: {exc}") from None
    checkpoint_dir = args.checkpoint_dir or journal_dir / "checkpoints"
    try:
        _check_folder("--journal-dir", journal_dir)
        if _rank_journals(journal_dir):
            raise UsageError("--journal-dir", f"{journal_dir} already holds journals: give an empty folder")
        _check_folder("--checkpoint-dir", checkpoint_dir)
    except UsageError:
        if args.journal_dir is None:  # the temporary folder made above: nothing will use it
            shutil.rmtree(journal_dir, ignore_errors=True)
        raise
    args = argparse.Namespace(**{**vars(args), "journal_dir": journal_dir, "checkpoint_dir": checkpoint_dir})
    return _Plan(args, journal_dir, checkpoint_dir, port, local)


def _check_numbers(args: argparse.Namespace) -> None:
    """The checks that need no file and no network: the configs' own, then the demo's."""
    for flag, value in (("--nproc", args.nproc), ("--steps", args.steps)):
        if value < 1:
            raise UsageError(flag, f"must be at least 1, got {value}")
    if args.fail_at is None:
        for flag, value in (("--fail-rank", args.fail_rank), ("--fail-step", args.fail_step)):
            if value is not None:
                raise UsageError(flag, "needs --fail-at (there is no failure to place)")
    try:
        DistributedConfig(world_size=args.nproc, master_addr=args.master_addr, master_port=args.master_port)
        # The folders are checked later, on the file system: any path will do here.
        folders = {"journal_dir": "journals", "checkpoint_dir": args.checkpoint_dir or "checkpoints"}
        config = demo_config(argparse.Namespace(**{**vars(args), **folders}), args.nproc)
        config.parallel.check_world(args.nproc)
        config.model.check_tensor_parallel(args.tp)
    except ConfigError as exc:
        raise UsageError(flag_of(exc.field), exc.message) from None
    fault = config.fault
    if fault is None:
        return
    if fault.rank >= args.nproc:
        raise UsageError("--fail-rank", f"must be in 0..{args.nproc - 1} (--nproc {args.nproc}), got {fault.rank}")
    if fault.phase in STEPPED_PHASES:
        if fault.step > args.steps:
            raise UsageError(
                "--fail-step", f"must be in 1..{args.steps} (--steps): at {fault.step} the failure would never fire"
            )
        if fault.phase is Phase.EVAL and config.training.eval_interval == 0:
            raise UsageError("--eval-interval", "is 0 (no evaluation), so --fail-at eval would never fire")
    elif args.fail_step is not None:
        stepped = ", ".join(sorted(p.value for p in STEPPED_PHASES))
        raise UsageError("--fail-step", f"only applies to --fail-at {stepped}, not {fault.phase.value}")


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


# -- the launcher (no torch import: it only starts torchrun and reads journals) -----------


def torchrun_command(
    nproc: int, master_addr: str, master_port: int, script: list[str], *, rendezvous_timeout_s: float | None = None
) -> list[str]:
    """The command that runs ``script`` (``-m module args`` or ``path args``) on ``nproc`` local ranks with torchrun.

    Static rendezvous at ``master_addr:master_port``, and no restarts: a rank's failure
    ends the job (torchrun then stops the other ranks). ``rendezvous_timeout_s``:
    torchrun gives up the rendezvous after that long (rounded up to whole seconds;
    None: torchrun's default, 15 minutes).
    """
    timeout = [] if rendezvous_timeout_s is None else [f"--rdzv-conf=timeout={max(1, math.ceil(rendezvous_timeout_s))}"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        f"--master-addr={master_addr}",
        f"--master-port={master_port}",
        "--max-restarts=0",
        *timeout,
        *script,
    ]


def child_env(master_addr: str) -> dict[str, str]:
    """This process's environment, plus quiet, loopback-friendly defaults for torchrun and its ranks."""
    env = dict(os.environ)
    # One thread a rank (torchrun would set it and warn); quiet c10d's C++ logging.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCH_CPP_LOG_LEVEL", "error")
    if master_addr == "127.0.0.1" and sys.platform == "linux":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's own sockets stay on loopback too
    env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")  # torch.cuda's pynvml notice, in every process
    return env


def set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux); False where it cannot.

    If the parent is already gone (this process was re-parented to init), ``signum``
    is sent at once.
    """
    if sys.platform != "linux":
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    if prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        return False
    if os.getppid() == 1:
        os.kill(os.getpid(), signum)
    return True


def _die_with(parent: int, signum: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` giving the child ``signum`` when ``parent`` (this process) dies; None off Linux."""
    if sys.platform != "linux":
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded before the fork: the child only calls it
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the launcher died between the fork and the prctl
            os.kill(os.getpid(), signum)

    return preexec


def stop_grace_s(timeout_s: float) -> float:
    """How long the launcher waits for a requested stop: every rank's step, save and teardown, each within a timeout."""
    return 2 * timeout_s + 30.0


class _Signals:
    """SIGINT, SIGTERM and SIGHUP while the launcher runs: recorded by name, never raised."""

    NAMES: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: list[str] = []
        self._previous: dict[int, object] = {}

    def _record(self, signum: int, frame: FrameType | None) -> None:
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


@dataclasses.dataclass(slots=True)
class _Ending:
    """How the launcher's wait for torchrun ended: torchrun's code, the signals that stopped it, what it did."""

    returncode: int | None = None
    stop_signal: str | None = None
    killed: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)


def _launch(plan: _Plan) -> int:
    """Start torchrun on the checked ``plan``, supervise it, leave nothing running, report; the exit code."""
    args = plan.args
    worker_args = [
        "--as-worker",
        f"--steps={args.steps}",
        f"--journal-dir={plan.journal_dir}",
        f"--checkpoint-dir={plan.checkpoint_dir}",
        f"--timeout={args.timeout}",
        f"--tp={args.tp}",
    ]
    for name in ("fail_at", "fail_rank", "fail_step", "checkpoint_interval", "eval_interval", "log_interval"):
        value = getattr(args, name)
        if value is not None:
            worker_args.append(f"--{name.replace('_', '-')}={value}")
    if args.retry:
        worker_args.append("--retry")
    command = torchrun_command(
        args.nproc,
        args.master_addr,
        plan.port,
        ["-m", "lifecycle._tools.demo", *worker_args],
        rendezvous_timeout_s=args.timeout,
    )
    env = child_env(args.master_addr)
    # Every rank labels its journal with this run id (see ``lifecycle.journal.run_id``);
    # it also marks every process the demo starts, so that none is left behind.
    run_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    env[_RUN_ID] = run_id
    rendezvous = f"{args.master_addr}:{plan.port}"
    layout = f"TP{args.tp} PP1 DP{args.nproc // args.tp}"
    print(f"demo: {args.nproc} ranks ({layout}), {args.steps} steps, rendezvous {rendezvous}", flush=True)
    print(f"demo: journals in {plan.journal_dir}, checkpoints in {plan.checkpoint_dir}", flush=True)
    started = time.monotonic()
    with _Signals().installed() as signals:
        process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own session: a terminal's Ctrl-C reaches the launcher only
            preexec_fn=_die_with(os.getpid(), signal.SIGTERM),  # safe: the launcher runs no other thread
        )
        try:
            ending = _supervise(process, signals, plan, rendezvous, started)
        finally:
            if process.poll() is None:
                _kill(process)
            _kill_marked(run_id)
        for note in ending.notes:
            print(f"demo: {note}", file=sys.stderr, flush=True)
        return _report(plan, run_id, ending, rendezvous, time.monotonic() - started)


def _supervise(
    process: subprocess.Popen[bytes], signals: _Signals, plan: _Plan, rendezvous: str, started: float
) -> _Ending:
    """Wait for torchrun; turn the first signal into a graceful stop and the second into a kill; bound each wait."""
    timeout = plan.args.timeout
    ending = _Ending()
    handled = 0
    wall_deadline = started + WALL_LIMIT_S
    start_deadline: float | None = started + STARTUP_S + timeout
    stop_deadline = math.inf
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
                stop_deadline = now + grace
            else:
                ending.killed = f"{name} again: killed torchrun and the ranks"
                break
        elif now > stop_deadline:
            ending.killed = f"still running {stop_grace_s(timeout):.0f} s after {ending.stop_signal}: killed"
            break
        elif now > wall_deadline and ending.stop_signal is None:
            ending.notes.append(f"still running after {WALL_LIMIT_S:.0f} s; stopping it")
            ending.stop_signal = "the wall-clock limit"
            process.send_signal(signal.SIGTERM)
            stop_deadline = now + stop_grace_s(timeout)
        elif start_deadline is not None and now > start_deadline:
            if _rank_journals(plan.journal_dir):
                start_deadline = None
            else:
                ending.killed = (
                    f"no rank started within {now - started:.0f} s: the rendezvous at {rendezvous} was not "
                    f"reached (--timeout {timeout:g}); killed torchrun"
                )
                break
    if ending.killed is not None:
        _kill(process)
    ending.returncode = process.wait()
    return ending


def _kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL torchrun's process group (its ranks, in sessions of their own, follow by their death signal)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _marked(run_id: str) -> list[int]:
    """The running processes whose environment carries ``LIFECYCLE_RUN_ID=run_id`` (none off Linux)."""
    mark = f"{_RUN_ID}={run_id}".encode()
    return [pid for pid, environment in process_environments() if mark in environment]


def _kill_marked(run_id: str) -> None:
    """SIGKILL every process the demo started that is still running (the death signals' backstop); wait for them."""
    deadline = time.monotonic() + 10.0
    killed: set[int] = set()
    while ((left := _marked(run_id)) or any(map(is_running, killed))) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed.update(left)
        time.sleep(0.05)


def _rank_journals(folder: Path) -> list[Path]:
    """The journals (``rank<R>.jsonl`` files) in ``folder``; none if it cannot be listed."""
    try:
        return _journal.journal_files(folder)
    except OSError:
        return []


def _report(plan: _Plan, run_id: str, ending: _Ending, rendezvous: str, elapsed: float) -> int:
    """Print the timeline and the diagrams' paths, then the verdict from the journals; return the exit code."""
    journal_dir, nproc = plan.journal_dir, plan.args.nproc
    records: list[_journal.Record] = []
    try:
        loaded = _journal.load([journal_dir])
    except (OSError, ValueError) as exc:
        print(f"demo: cannot read the journals: {exc}", file=sys.stderr)
    else:
        # Only this demo's ranks: a journal another run left here is not this run's story.
        records = [r for r in loaded.records if r.origin.run_id == run_id and r.origin.rank < nproc]
        for where in loaded.torn:
            print(f"demo: {where}: torn line skipped (its writer was killed mid-write?)", file=sys.stderr)
        for note in getattr(loaded, "ignored", ()):
            print(f"demo: {note}", file=sys.stderr)
    print("\n=== timeline (seconds since the first rank started) ===")
    print("\n".join(_show.timeline_lines(records, verdicts=True)))
    if records:
        paths = _show.write_diagrams(records, journal_dir)
        paths.append(_show.write_page(records, journal_dir / "show.html", journal_dir))
        print("\n=== lifecycle diagrams (path taken highlighted) ===")
        print("\n".join(f"  {p}" for p in paths))
        print(f"\ndemo: see it again with: {sys.executable} -m lifecycle show {journal_dir}")
    else:
        print()
    states = {rank: "no journal" for rank in range(nproc)} | _show.final_states(records)
    ok = all(state == "closed" for state in states.values())
    shown = {"?": "cut short (no end record)"}
    listed = ", ".join(f"rank {rank}: {shown.get(state, state)}" for rank, state in states.items())
    facts = f"({listed}; torchrun exit code {ending.returncode})"
    if ok and ending.stop_signal is not None:
        verdict = f"stopped on {ending.stop_signal} in {elapsed:.1f} s, as asked: every rank saved and closed {facts}"
    elif ok:
        verdict = f"succeeded in {elapsed:.1f} s {facts}"
    else:
        why = ending.killed or _why_failed(states, records, plan, rendezvous)
        verdict = f"FAILED in {elapsed:.1f} s: {why} {facts}"
    print(f"demo: {verdict}", flush=True)
    return 0 if ok else 1


def _why_failed(states: dict[int, str], records: list[_journal.Record], plan: _Plan, rendezvous: str) -> str:
    """The reason the verdict gives for a run where some rank's last attempt did not end ``closed``."""
    if not records:
        where = "" if plan.local else ", not an address of this machine"
        return (
            f"no rank wrote a journal: torchrun ended before any rank started (see its output above; "
            f"the rendezvous was {rendezvous}{where}, --timeout {plan.args.timeout:g})"
        )
    how = {"failed": "ended failed", "?": "cut short (killed?)", "no journal": "never started pretrain"}
    parts = []
    for state, said in how.items():
        ranks = [str(rank) for rank, s in states.items() if s == state]
        if ranks:
            parts.append(f"{'ranks' if len(ranks) > 1 else 'rank'} {', '.join(ranks)} {said}")
    return "; ".join(parts) or "not every rank ended closed"


# -- one rank (runs under torchrun) ------------------------------------------------------


def _quiet_libraries() -> None:
    """Keep the demo's output to progress and results: megatron's import notices and INFO/WARNING chatter off."""
    warnings.filterwarnings("ignore", module=r"megatron\.")
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("megatron").setLevel(logging.ERROR)


def _worker(args: argparse.Namespace) -> int:
    """One rank, under torchrun: ``pretrain`` with the config ``demo_config`` builds (and a retry if asked)."""
    # A rank must not outlive torchrun (which runs it in a session of its own).
    set_parent_death_signal(signal.SIGKILL)
    _quiet_libraries()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    log = logging.getLogger("lifecycle")
    if rank == 0:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[rank 0] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    config = demo_config(args, world)
    # A peer may need a whole group timeout to notice a failure that no collective of
    # its own ran into (e.g. one in ``dist``): the retry waits twice that to rendezvous.
    retry = dataclasses.replace(
        config, fault=None, distributed=dataclasses.replace(config.distributed, timeout_s=2 * args.timeout)
    )
    attempts = [config, retry] if args.retry else [config]
    code = _run_attempts(attempts, rank)
    # Skip the interpreter's final garbage collection over torch's and Megatron-core's
    # objects (over a second here): everything this rank owes is already released and
    # its journal written, and torchrun waits for every rank before reporting.
    gc.freeze()
    return code


def _run_attempts(attempts: list[PretrainConfig], rank: int) -> int:
    """Run ``pretrain`` per config until one succeeds; report each outcome. 0 on success, else 1.

    The launcher's verdict comes from the journals, not from this code: a failure
    after an exit was requested (e.g. SIGTERM) ends the rank (no retry), and its
    journal says ``failed``; a requested exit that the loop took ends ``closed``.
    """
    # Imported here, after the warning filters: this loads torch and megatron-core.
    from lifecycle._training.pretrain import pretrain

    for attempt, config in enumerate(attempts):
        try:
            result = pretrain(config, attempt=attempt)
        except Exception as exc:  # noqa: BLE001 - the demo reports it, and retries if asked
            print(f"[rank {rank}] attempt {attempt} failed: {type(exc).__name__}: {exc}", flush=True)
            for note in getattr(exc, "__notes__", ()):
                print(f"[rank {rank}]   {note}", flush=True)
            requested = getattr(exc, "requested_exit", None)
            if requested is not None:
                print(f"[rank {rank}] an exit was requested ({requested}): not retrying", flush=True)
                return 1
            if attempt + 1 < len(attempts):
                print(f"[rank {rank}] retrying in the same process (attempt {attempt + 1})", flush=True)
            continue
        if rank == 0:
            first, last = (result.losses[0][1], result.losses[-1][1]) if result.losses else (float("nan"),) * 2
            print(
                f"[rank 0] attempt {attempt} succeeded: steps {result.start_step}→{result.final_step} "
                f"({result.exit_reason.value}), loss {first:.3f}→{last:.3f}, "
                f"last checkpoint step {result.checkpoint_step}",
                flush=True,
            )
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(demo_main(sys.argv[1:]))
