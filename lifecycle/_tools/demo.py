"""``python -m lifecycle demo``: train the default model on CPU/gloo with torchrun, then show the lifecycle.

The command launches ``torch.distributed.run`` (torchrun) with ``--nproc N`` ranks on
one machine, rendezvous on 127.0.0.1 by default; each rank runs ``pretrain`` (and,
with ``--retry``, once more in the same process after a failure). Rank 0 shows
progress. Every rank appends its journal to ``<journal dir>/rank<R>.jsonl``; at the
end the command prints every rank's timeline and writes the diagrams of the path
taken (``python -m lifecycle show`` prints them again later).

Exit code: 0 when every rank's last attempt ended ``closed``; 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

from lifecycle._core import journal as _journal
from lifecycle._tools import show as _show
from lifecycle._training.config import CheckpointConfig, FaultInjection, Phase, PretrainConfig, TrainingConfig

DEFAULT_STEPS = 1000
"""About a minute in all with 2 ranks sharing 2 CPU cores, start-up included."""

WALL_LIMIT_S = 1800.0
"""The demo kills torchrun after this long: a stuck demo must not hang a terminal or a CI job."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lifecycle demo",
        description=(
            "Train a tiny causal LM on synthetic data with torchrun on CPU/gloo, then print each rank's "
            "lifecycle timeline and draw the path the run took."
        ),
    )
    parser.add_argument("--nproc", type=int, default=2, metavar="N", help="ranks to launch (default 2)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N", help="training steps")
    parser.add_argument("--fail-at", choices=[p.value for p in Phase], help="inject a failure at this phase")
    parser.add_argument("--fail-rank", type=int, metavar="R", help="rank that fails (default: the last rank)")
    parser.add_argument(
        "--fail-step", type=int, metavar="N", help="step at or after which a step-phase failure fires (default: half)"
    )
    parser.add_argument(
        "--retry", action="store_true", help="after a failure, run pretrain again in the same processes"
    )
    parser.add_argument("--checkpoint-dir", type=Path, help="checkpoints (default: <journal dir>/checkpoints)")
    parser.add_argument("--checkpoint-interval", type=int, metavar="N", help="steps between saves (default: steps/4)")
    parser.add_argument("--journal-dir", type=Path, help="where journals and diagrams go (default: a new temp dir)")
    parser.add_argument("--eval-interval", type=int, metavar="N", help="steps between evaluations (default: steps/5)")
    parser.add_argument(
        "--log-interval", type=int, metavar="N", help="steps between progress lines (default: steps/20)"
    )
    parser.add_argument("--master-addr", default="127.0.0.1", help="rendezvous address (default 127.0.0.1)")
    parser.add_argument("--master-port", type=int, default=0, help="rendezvous port (default: a free one)")
    parser.add_argument("--timeout", type=float, default=30.0, help="process-group timeout in seconds (default 30)")
    parser.add_argument("--as-worker", action="store_true", help=argparse.SUPPRESS)
    return parser


def demo_main(argv: list[str]) -> int:
    """Run the demo (see the module doc); return the exit code: 0 success, 1 failed run, 2 bad arguments."""
    parser = _parser()
    args = parser.parse_args(argv)
    for name in ("nproc", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.fail_rank is not None and not 0 <= args.fail_rank < args.nproc:
        parser.error(f"--fail-rank must be in 0..{args.nproc - 1}")
    if args.as_worker:
        return _worker(args)
    return _launch(args)


# -- the launcher (no torch import: it only starts torchrun and reads journals) -----------


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        port: int = s.getsockname()[1]
        return port


def torchrun_command(nproc: int, master_addr: str, master_port: int, script: list[str]) -> list[str]:
    """The command that runs ``script`` (``-m module args`` or ``path args``) on ``nproc`` local ranks with torchrun.

    Static rendezvous at ``master_addr:master_port``, and no restarts: a rank's failure
    ends the job (torchrun then stops the other ranks).
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        f"--master-addr={master_addr}",
        f"--master-port={master_port}",
        "--max-restarts=0",
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


def _launch(args: argparse.Namespace) -> int:
    journal_dir: Path = args.journal_dir or Path(tempfile.mkdtemp(prefix="lifecycle-demo-"))
    journal_dir.mkdir(parents=True, exist_ok=True)
    if any(journal_dir.glob("rank*.jsonl")):
        print(f"{journal_dir} already holds journals: give an empty --journal-dir", file=sys.stderr)
        return 2
    checkpoint_dir: Path = args.checkpoint_dir or journal_dir / "checkpoints"
    port = args.master_port or _free_port(args.master_addr)
    worker_args = [
        "--as-worker",
        f"--steps={args.steps}",
        f"--journal-dir={journal_dir}",
        f"--checkpoint-dir={checkpoint_dir}",
        f"--timeout={args.timeout}",
    ]
    for name in ("fail_at", "fail_rank", "fail_step", "checkpoint_interval", "eval_interval", "log_interval"):
        value = getattr(args, name)
        if value is not None:
            worker_args.append(f"--{name.replace('_', '-')}={value}")
    if args.retry:
        worker_args.append("--retry")
    command = torchrun_command(args.nproc, args.master_addr, port, ["-m", "lifecycle._tools.demo", *worker_args])
    env = child_env(args.master_addr)
    # Every rank labels its journal with this run id (see ``lifecycle._core.journal.run_id``).
    env["LIFECYCLE_RUN_ID"] = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    print(f"demo: {args.nproc} ranks, {args.steps} steps, rendezvous {args.master_addr}:{port}", flush=True)
    print(f"demo: journals in {journal_dir}, checkpoints in {checkpoint_dir}", flush=True)
    started = time.monotonic()
    process = subprocess.Popen(command, env=env)
    try:
        returncode = process.wait(timeout=WALL_LIMIT_S)
    except subprocess.TimeoutExpired:
        print(f"demo: still running after {WALL_LIMIT_S:.0f} s; stopping it", file=sys.stderr)
        returncode = _stop(process)
    except KeyboardInterrupt:
        # The terminal sent SIGINT to torchrun and the ranks too; let them wind down.
        returncode = _stop(process)
    elapsed = time.monotonic() - started
    return _report(journal_dir, args.nproc, returncode, elapsed)


def _stop(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM torchrun (it forwards it to the ranks: a graceful exit), then SIGKILL if it lingers."""
    process.terminate()
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def _report(journal_dir: Path, nproc: int, returncode: int, elapsed: float) -> int:
    records: list[_journal.Record] = []
    try:
        loaded = _journal.load([journal_dir])
    except (OSError, ValueError) as exc:
        print(f"demo: cannot read the journals: {exc}", file=sys.stderr)
    else:
        records = list(loaded.records)
        for where in loaded.torn:
            print(f"demo: {where}: torn line skipped (its writer was killed mid-write?)", file=sys.stderr)
    print("\n=== timeline (seconds since the first rank started) ===")
    print("\n".join(_show.timeline_lines(records)))
    if records:
        paths = _show.write_diagrams(records, journal_dir)
        print("\n=== lifecycle diagrams (path taken highlighted) ===")
        print("\n".join(f"  {p}" for p in paths))
    states = {rank: "no journal (stopped by torchrun?)" for rank in range(nproc)} | _show.final_states(records)
    ok = returncode == 0 and all(state == "closed" for state in states.values())
    listed = ", ".join(f"rank {r}: {s}" for r, s in states.items())
    print(f"\ndemo: {'succeeded' if ok else 'FAILED'} in {elapsed:.1f} s ({listed}; torchrun exit code {returncode})")
    print(f"demo: see it again with: {sys.executable} -m lifecycle show {journal_dir}")
    return 0 if ok else 1


# -- one rank (runs under torchrun) ------------------------------------------------------


def _quiet_libraries() -> None:
    """Keep the demo's output to progress and results: megatron's import notices and INFO/WARNING chatter off."""
    warnings.filterwarnings("ignore", module=r"megatron\.")
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("megatron").setLevel(logging.ERROR)


def _worker(args: argparse.Namespace) -> int:
    _quiet_libraries()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    log = logging.getLogger("lifecycle")
    if rank == 0:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[rank 0] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    # Imported here, after the filters: this loads torch and megatron-core.
    from lifecycle._torch.config import DistributedConfig, ParallelConfig

    steps = args.steps
    fault = None
    if args.fail_at is not None:
        fail_rank = world - 1 if args.fail_rank is None else args.fail_rank
        fault = FaultInjection(Phase(args.fail_at), rank=fail_rank, step=args.fail_step or max(1, steps // 2))
    config = PretrainConfig(
        distributed=DistributedConfig(backend="gloo", timeout_s=args.timeout),
        parallel=ParallelConfig(micro_batch_size=8),
        training=TrainingConfig(
            iterations=steps,
            log_interval=args.log_interval if args.log_interval is not None else max(1, steps // 20),
            eval_interval=args.eval_interval if args.eval_interval is not None else max(1, steps // 5),
        ),
        checkpoint=CheckpointConfig(
            dir=str(args.checkpoint_dir),
            interval=args.checkpoint_interval if args.checkpoint_interval is not None else max(1, steps // 4),
            resume=True,
        ),
        fault=fault,
        journal_dir=str(args.journal_dir),
    )
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
    """Run ``pretrain`` per config until one succeeds; report each outcome. 0 on success, else 1."""
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
