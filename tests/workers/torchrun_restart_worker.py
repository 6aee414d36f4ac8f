"""One torchrun worker of test_torchrun_restarts.py: trains, and in torchrun's first worker group one rank dies hard.

Usage (under ``torchrun --max-restarts=N``): ``python tests/workers/torchrun_restart_worker.py HOW OUT_DIR``.
``HOW`` is ``exit`` (``os._exit(1)``) or ``sigkill`` (SIGKILL to itself): rank 1 does it at the end of step
``CRASH_STEP``, once the checkpoint of step ``CRASH_STEP - 1`` is committed, only while
``TORCHELASTIC_RESTART_COUNT`` is 0 (no ``finally``, no ``atexit``, no journal end record). Every call that
returns writes ``OUT_DIR/result-rank<R>-restart<N>.json``: where it resumed, where it stopped, what it committed.
The checkpoints are in ``OUT_DIR/ckpt``, the journals in ``OUT_DIR/journal``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from support.configs import GROUP_TIMEOUT_S, TINY

from lifecycle import (
    Callback,
    CheckpointConfig,
    DistributedConfig,
    ParallelConfig,
    PretrainConfig,
    SessionHandle,
    TrainingConfig,
    pretrain,
)

ITERATIONS = 8
INTERVAL = 2
CRASH_STEP = 5
"""Rank 1 dies at the end of this step: step ``CRASH_STEP - 1``'s checkpoint is committed by then."""
CRASH_RANK = 1

RANK = int(os.environ["RANK"])
RESTART = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


class CrashOnce(Callback):
    """Dies hard (``how``) at the end of ``CRASH_STEP`` on ``CRASH_RANK``, in torchrun's first worker group only."""

    def __init__(self, how: str) -> None:
        self.how = how

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        if RESTART != 0 or RANK != CRASH_RANK or step != CRASH_STEP:
            return
        if self.how == "exit":
            os._exit(1)
        os.kill(os.getpid(), signal.SIGKILL)


def main(how: str, out: Path) -> int:
    """Run ``pretrain`` once (resuming from ``out/ckpt``); write this call's result; 0 if it closed."""
    config = PretrainConfig(
        distributed=DistributedConfig(backend="gloo", timeout_s=GROUP_TIMEOUT_S),
        parallel=ParallelConfig(micro_batch_size=4),
        model=TINY,
        training=TrainingConfig(iterations=ITERATIONS, log_interval=0, eval_interval=0),
        checkpoint=CheckpointConfig(dir=str(out / "ckpt"), interval=INTERVAL, resume=True),
        journal_dir=str(out / "journal"),
    )
    result = pretrain(config, callbacks=[CrashOnce(how)])
    record = {
        "rank": result.rank,
        "restart": RESTART,
        "start_step": result.start_step,
        "final_step": result.final_step,
        "checkpoint_step": result.checkpoint_step,
    }
    (out / f"result-rank{RANK}-restart{RESTART}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
