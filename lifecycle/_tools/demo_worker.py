"""One demo rank, under torchrun: ``python -m lifecycle._tools.demo_worker ARGS`` with the user's own demo arguments.

The rank parses them with the demo's parser and builds its config with ``demo_config``
(torchrun's environment gives the world, the rank and the rendezvous), then runs
``pretrain``, and with ``--retry`` once more in the same process after a failure.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import signal
import sys
import warnings

from lifecycle._tools.demo_options import demo_config, parser
from lifecycle._tools.launcher import set_parent_death_signal
from lifecycle._training.config import PretrainConfig


def _quiet_libraries() -> None:
    """Keep the demo's output to progress and results: megatron's import notices and INFO/WARNING chatter off."""
    warnings.filterwarnings("ignore", module=r"megatron\.")
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("megatron").setLevel(logging.ERROR)


def worker_main(argv: list[str]) -> int:
    """Run this rank with the demo arguments ``argv`` (and a retry if asked); 0 when an attempt succeeded, else 1."""
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
    # A peer may need a whole group timeout to notice a failure that no collective of
    # its own ran into (e.g. one in ``dist``): the retry waits twice that to rendezvous.
    timeout_s = 2 * config.distributed.timeout_s
    retry = dataclasses.replace(
        config, fault=None, distributed=dataclasses.replace(config.distributed, timeout_s=timeout_s)
    )
    attempts = [config, retry] if options.retry else [config]
    code = _run_attempts(attempts, rank)
    # Skip the interpreter's final garbage collection over torch's and Megatron-core's
    # objects (slow: see docs/benchmarks.md, demo-final-gc): everything this rank owes is
    # already released and its journal written, and torchrun waits for every rank before
    # reporting.
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
    sys.exit(worker_main(sys.argv[1:]))
