"""One rank of a torchrun job for the SIGTERM test: a real SIGTERM reaches one rank mid-training.

Usage (under torchrun): ``pretrain_sigterm_worker.py OUT_DIR SIGTERM_RANK SIGTERM_STEP``. Each rank
writes ``OUT_DIR/result-rank<R>.json`` when ``pretrain`` returns, and its journal to ``OUT_DIR/journal``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

from support.configs import TINY  # noqa: E402 - after the warning filter

from lifecycle import (  # noqa: E402
    Callback,
    CheckpointConfig,
    DistributedConfig,
    ParallelConfig,
    PretrainConfig,
    SessionHandle,
    TrainingConfig,
    pretrain,
)


class SigtermAt(Callback):
    """Sends this process a SIGTERM at the end of ``step`` on ``rank``, as a scheduler would."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        if step == self.step and int(os.environ["RANK"]) == self.rank:
            os.kill(os.getpid(), signal.SIGTERM)


def main(out: Path, sigterm_rank: int, sigterm_step: int) -> int:
    config = PretrainConfig(
        distributed=DistributedConfig(timeout_s=20),
        parallel=ParallelConfig(micro_batch_size=4),
        model=TINY,
        training=TrainingConfig(iterations=1000, log_interval=0),
        checkpoint=CheckpointConfig(dir=str(out / "ckpt"), interval=3),
        journal_dir=str(out / "journal"),
    )
    result = pretrain(config, callbacks=[SigtermAt(sigterm_rank, sigterm_step)])
    summary = {
        "rank": result.rank,
        "final_step": result.final_step,
        "exit_reason": result.exit_reason.value,
        "exit_detail": result.exit_detail,
        "checkpoint_step": result.checkpoint_step,
        "sigterm_handler_restored": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
    }
    (out / f"result-rank{result.rank}.json").write_text(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
