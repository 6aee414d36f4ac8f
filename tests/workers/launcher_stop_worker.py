"""One torchrun worker of test_launcher_stop.py: rank 1 dies while rank 0 is busy outside any collective.

Usage (under ``torchrun --max-restarts=0``): ``python tests/workers/launcher_stop_worker.py OUT_DIR``. At the end of
step ``DEATH_STEP`` rank 1 SIGKILLs itself and rank 0 sleeps ``BUSY_S`` in a callback (a long step's compute, with
no collective): torchrun's agent sees rank 1 gone and SIGTERMs rank 0 during that sleep. Liveness runs (kill mode),
so rank 1's monitor publishes its death as rank 1's failure notice. Each rank writes ``OUT_DIR/rank<R>.json``: what
its call raised (type, text, ``stopped_by_launcher``) and ``lifecycle.exit_code`` of it; then exits with that code.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from support.configs import GROUP_TIMEOUT_S, TINY

from lifecycle import (
    Callback,
    CheckpointConfig,
    DistributedConfig,
    LivenessConfig,
    ParallelConfig,
    PretrainConfig,
    SessionHandle,
    TrainingConfig,
    exit_code,
    pretrain,
)

DEATH_STEP = 5
BUSY_S = 5.0
RANK = int(os.environ["RANK"])


class DieOrBusy(Callback):
    """At the end of ``DEATH_STEP``: rank 1 SIGKILLs itself, rank 0 sleeps ``BUSY_S`` (no collective)."""

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        if step != DEATH_STEP:
            return
        if RANK == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(BUSY_S)


def main(out: Path) -> int:
    """Run ``pretrain`` once; record what it raised and the exit code it maps to; exit with that code."""
    config = PretrainConfig(
        distributed=DistributedConfig(backend="gloo", timeout_s=GROUP_TIMEOUT_S),
        parallel=ParallelConfig(micro_batch_size=4),
        model=TINY,
        training=TrainingConfig(iterations=20, log_interval=0, eval_interval=0),
        checkpoint=CheckpointConfig(dir=str(out / "ckpt"), interval=2, resume=True),
        liveness=LivenessConfig(mode="kill", interval_s=0.2),
        journal_dir=str(out / "journal"),
    )
    began = time.monotonic()
    try:
        outcome: object = pretrain(config, callbacks=[DieOrBusy()])
    except BaseException as exc:  # noqa: BLE001 - recorded for the test, then the process exits with its code
        outcome = exc
    code = exit_code(outcome, config.journal_dir)
    record = {
        "type": type(outcome).__name__,
        "text": str(outcome),
        "stopped_by_launcher": getattr(outcome, "stopped_by_launcher", None),
        "exit_code": int(code),
        "seconds": time.monotonic() - began,
    }
    (out / f"rank{RANK}.json").write_text(json.dumps(record))
    return int(code)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
