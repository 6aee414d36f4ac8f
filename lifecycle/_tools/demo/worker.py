"""One demo rank, under torchrun: ``python -m lifecycle._tools.demo.worker ARGS`` with the user's own demo arguments.

The rank parses them with the demo's parser and builds its config with ``demo_config``
(torchrun's environment gives the world, the rank and the rendezvous), then runs
``pretrain``, and with ``--retry`` once more in the same process after a failure that
left every process alive. It exits with ``lifecycle.exit_code`` of its last call (see
docs/recovery.md): after a lost peer (the launcher's stop, or a peer's process gone)
it exits at once and leaves the restart to torchrun (``--max-restarts``), whose new
workers resume from the last committed checkpoint with no fault injected (unless
``--fault-again``). After each failure every rank takes the job's decision
(``lifecycle._training.retry.decide_after``: restart, or stop with 93 and a reason, its
budget ``--max-restarts`` job-wide); a stop leaves ``STOP_MARKER`` in the journal
folder, and a worker that finds a stop decision (or the marker) exits 93 before it
starts anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import signal
import sys
import warnings
from pathlib import Path

from lifecycle import journal as _journal
from lifecycle._launch.launcher import set_parent_death_signal
from lifecycle._tools.demo.options import demo_config, max_restarts, parser
from lifecycle._training.config import PretrainConfig
from lifecycle._training.decide import RestartPolicy
from lifecycle._training.exits import ExitCode, StoppedByLauncher, exit_code
from lifecycle._training.retry import DecisionStore, decide_after, last_decision, note_host, stop_requests_held

STOP_MARKER = "do-not-restart.txt"
"""In the journal folder: a rank decided its run is not worth restarting (the reason inside)."""

LAUNCHER_WAIT_S = 0.5
"""Before retrying in its own process, how long a rank waits for the launcher's SIGTERM (a peer's process gone).

torchrun's agent looks at its workers every 0.1 s and stops the survivors of a dead one;
a retry started meanwhile would block in its rendezvous, where a SIGTERM cannot reach
Python, until the agent's SIGKILL 30 s later. Not waited for when the job's decision says
the cause raised and lives (``Decision.cause_lives``): no process is gone, no stop comes.
"""


def _quiet_libraries() -> None:
    """Keep the demo's output to progress and results: megatron's import notices and INFO/WARNING chatter off."""
    warnings.filterwarnings("ignore", module=r"megatron\.")
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("megatron").setLevel(logging.ERROR)


def worker_main(argv: list[str]) -> int:
    """Run this rank with the demo arguments ``argv`` (and a retry if asked); its ``lifecycle.ExitCode``."""
    # A rank must not outlive torchrun (which runs it in a session of its own).
    set_parent_death_signal(signal.SIGKILL)
    _quiet_libraries()
    # The launcher puts "--" before them for torchrun; an argparse that keeps it in the script's arguments passes it on.
    options = parser().parse_args(argv[1:] if argv[:1] == ["--"] else argv)
    rank = int(os.environ.get("RANK", "0"))
    log = logging.getLogger("lifecycle")
    if rank == 0:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[rank 0] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    config = demo_config(options)
    marker = Path(str(config.journal_dir)) / STOP_MARKER
    from lifecycle._torch.store import job_store  # loads torch: after the warning filters

    store = job_store()  # torchrun's agent store: the job's decisions, on every node
    if store is not None:
        note_host(store, rank)  # a peer that decides after this rank died names its host
    decided = last_decision(config.journal_dir, store=store)
    if decided is not None and decided.stop:  # read before it trains: the job's decision, whoever made it
        print(f"[rank {rank}] not starting: the job decided to {decided.line()}", flush=True)
        return decided.exit_code
    if marker.exists():
        print(f"[rank {rank}] not starting: {marker.read_text().strip()}", flush=True)
        return ExitCode.DO_NOT_RESTART
    if _journal.restart_count() > 0 and not options.fault_again:
        config = dataclasses.replace(config, fault=None)  # torchrun restarted the ranks: the fault happened once
    # A peer may need a whole group timeout to notice a failure that no collective of
    # its own ran into (e.g. one in ``dist``): the retry waits twice that to rendezvous.
    timeout_s = 2 * config.distributed.timeout_s
    retry = dataclasses.replace(
        config,
        fault=config.fault if options.fault_again else None,
        distributed=dataclasses.replace(config.distributed, timeout_s=timeout_s),
    )
    attempts = [config, retry] if options.retry else [config]
    policy = RestartPolicy(max_restarts=max_restarts(options)) if max_restarts(options) else RestartPolicy()
    code = _run_attempts(attempts, rank, marker, policy, store)
    # Skip the interpreter's final garbage collection over torch's and Megatron-core's
    # objects (slow: see docs/benchmarks.md, demo-final-gc): everything this rank owes is
    # already released and its journal written, and torchrun waits for every rank before
    # reporting.
    gc.freeze()
    return code


def _run_attempts(
    attempts: list[PretrainConfig], rank: int, marker: Path, policy: RestartPolicy, store: DecisionStore | None
) -> int:
    """Run ``pretrain`` per config until one succeeds or a retry here cannot help; report each; the exit code.

    The launcher's verdict comes from the journals, not from this code. A failure after
    an exit was requested (e.g. SIGTERM), or one not worth restarting, ends the rank; so
    does one after which a peer's process is gone (the launcher's SIGTERM came, or comes
    within ``LAUNCHER_WAIT_S`` unless the cause raised and lives): torchrun restarts every
    rank, if it may.
    """
    # Imported here, after the warning filters: this loads torch and megatron-core.
    from lifecycle._training.pretrain import pretrain

    # What the imports made (some 400,000 objects) goes to the permanent generation: a full
    # collection no longer walks it, 200 ms that could fall on any step, set-up or retry
    # (docs/recovery.md, "Measured here").
    gc.freeze()
    code = ExitCode.RESTART
    for attempt, config in enumerate(attempts):
        try:
            result = pretrain(config, attempt=attempt)
        except BaseException as exc:  # noqa: BLE001 - the demo reports it, and retries if it can help
            with stop_requests_held():  # torchrun's SIGTERM to a survivor must not cut its report and decision
                print(f"[rank {rank}] attempt {attempt} failed: {type(exc).__name__}: {exc}", flush=True)
                for note in getattr(exc, "__notes__", ()):
                    print(f"[rank {rank}]   {note}", flush=True)
                code = exit_code(exc)
                if code is ExitCode.STOPPED:
                    print(f"[rank {rank}] an exit was requested ({getattr(exc, 'requested_exit', None)}): not retrying")
                    return code
                # The job's decision (the same on every rank, within a second of the last rank's end): restart or stop.
                decision = decide_after(exc, config.journal_dir, rank=rank, policy=policy, store=store)
                print(f"[rank {rank}] decision after attempt {attempt}: {decision.line()}", flush=True)
                code = decision.exit_code
                if decision.stop:
                    with contextlib.suppress(OSError):
                        marker.write_text(f"rank {rank}: attempt {attempt} failed; {decision.line()}\n")
                    print(f"[rank {rank}] not worth restarting: exiting {code.value}", flush=True)
                    return code
                if isinstance(exc, StoppedByLauncher) or getattr(exc, "stopped_by_launcher", None) is not None:
                    print(f"[rank {rank}] stopped by the launcher: torchrun restarts every rank, if it may", flush=True)
                    return code
                if attempt + 1 < len(attempts):
                    if not decision.cause_lives and _launcher_stops_us(LAUNCHER_WAIT_S):
                        print(f"[rank {rank}] the launcher stopped this rank: a peer's process is gone", flush=True)
                        return code
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
        return exit_code(result)
    return code


def _launcher_stops_us(wait_s: float) -> bool:
    """Wait up to ``wait_s`` for a SIGTERM (held back meanwhile); True if one came. Off Linux: False at once."""
    sigtimedwait = getattr(signal, "sigtimedwait", None)
    if sigtimedwait is None:
        return False
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        return sigtimedwait({signal.SIGTERM}, wait_s) is not None
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
