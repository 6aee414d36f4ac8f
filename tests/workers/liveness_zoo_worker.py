"""One rank of the liveness zoo (``tests/liveness/test_zoo.py``): healthy but slow episodes, none of them a fault.

Usage: ``liveness_zoo_worker.py OUT_DIR`` with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` set. ``pretrain`` at the demo's liveness defaults (kill mode, 1 s interval,
patience 1, a 30 s group timeout: a 10 s conviction floor), 50 ms steps, and at fixed steps,
each followed by a plain stretch: a first step 50x the rest (every rank); a 4 s callback on
rank 0; 4 s of CPU on rank 0; a periodic step 20x the usual on every rank (three of them);
a 3 s SIGSTOP/SIGCONT of the last rank; a 5 s stop of rank 0's monitor; a whole-job 5 s
suspend (every rank and its monitor); a 5 s batch on rank 0; an evaluation pass 40x a step
(every rank); checkpoint saves all along; then a SIGTERM to every rank, which must be a
requested stop with a final save. Prints one JSON line: this rank, its error, how it ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from support.configs import TINY  # noqa: E402
from support.internals import describe, liveness_rank  # noqa: E402

from lifecycle import (  # noqa: E402
    Callback,
    CheckpointConfig,
    DistributedConfig,
    LivenessConfig,
    ParallelConfig,
    PretrainConfig,
    SessionHandle,
    TrainingConfig,
    pretrain,
)

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
STEP_S = 0.05
STEPS = 700
"""Never reached: the SIGTERM at step 620 ends the run (a requested stop)."""
EVAL_AT = 540
EVAL_BATCHES = 20
SAVE_EVERY = 290
EPISODES = {
    1: "first-step-50x",
    60: "callback-4s-rank0",
    140: "cpu-4s-rank0",
    220: "periodic-20x",
    240: "periodic-20x",
    260: "periodic-20x",
    320: "sigstop-3s-last",
    400: "monitor-stall-5s-rank0",
    460: "whole-job-suspend-5s",
    500: "batch-5s-rank0",
    620: "sigterm-every-rank",
}
"""The step at the end of which each episode starts; a plain stretch of 20 or more steps follows each (the
evaluation pass at ``EVAL_AT``, and the saves every ``SAVE_EVERY`` steps, are episodes of their own)."""
SLOW_BATCH = [False]
"""Set by the callback on rank 0 at ``batch-5s-rank0``: the next training batch takes 5 s."""


def batches(split: str, index: int) -> dict[str, torch.Tensor]:
    """Micro-batch ``index`` of ``split``: random tokens; 5 s for the one after ``batch-5s-rank0``, 0.1 s in eval."""
    if split == "train" and SLOW_BATCH[0]:
        SLOW_BATCH[0] = False
        time.sleep(5.0)
    elif split == "eval":
        time.sleep(2 * STEP_S)  # EVAL_BATCHES of them: a pass 40x a step
    generator = torch.Generator().manual_seed(index * 2 + (split == "eval"))
    seq = torch.randint(0, TINY.vocab_size, (4, TINY.seq_length + 1), generator=generator)
    return {"tokens": seq[:, :-1], "labels": seq[:, 1:]}


def _later(command: str) -> None:
    """Run ``command`` in a shell of its own, detached (it may stop this very process)."""
    subprocess.Popen(["sh", "-c", command], start_new_session=True)


class Zoo(Callback):
    """Sleeps a step after each step; at ``EPISODES``' steps, plays the episode (on its ranks)."""

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        episode = EPISODES.get(step, "")
        me = os.getpid()
        watching = liveness_rank.current()
        monitor = watching.process.pid if watching is not None else 0
        if episode == "first-step-50x":
            time.sleep(50 * STEP_S)
        elif episode == "callback-4s-rank0" and RANK == 0:
            time.sleep(4.0)
        elif episode == "cpu-4s-rank0" and RANK == 0:
            until = time.monotonic() + 4.0
            while time.monotonic() < until:
                pass
        elif episode == "periodic-20x":
            time.sleep(20 * STEP_S)
        elif episode == "sigstop-3s-last" and RANK == WORLD - 1:
            _later(f"kill -STOP {me}; sleep 3; kill -CONT {me}")
            time.sleep(0.5)
        elif episode == "monitor-stall-5s-rank0" and RANK == 0 and monitor:
            _later(f"kill -STOP {monitor}; sleep 5; kill -CONT {monitor}")
        elif episode == "whole-job-suspend-5s" and monitor:
            _later(f"kill -STOP {me} {monitor}; sleep 5; kill -CONT {monitor} {me}")
            time.sleep(0.5)
        elif episode == "batch-5s-rank0" and RANK == 0:
            SLOW_BATCH[0] = True
        elif episode == "sigterm-every-rank":
            os.kill(me, signal.SIGTERM)  # as a launcher's stop (a preemption) would: handled, not fatal
        time.sleep(STEP_S)


def main(out: Path) -> int:
    config = PretrainConfig(
        distributed=DistributedConfig(timeout_s=30.0),
        parallel=ParallelConfig(micro_batch_size=4),
        model=TINY,
        training=TrainingConfig(iterations=STEPS, log_interval=0, eval_interval=EVAL_AT, eval_iterations=EVAL_BATCHES),
        checkpoint=CheckpointConfig(dir=str(out / "ckpt"), interval=SAVE_EVERY),
        journal_dir=str(out),
        liveness=LivenessConfig(mode="kill"),  # type: ignore[arg-type]
    )
    error: BaseException | None = None
    ended: dict[str, Any] = {}
    try:
        result = pretrain(config, callbacks=[Zoo()], batch_provider=batches)
        ended = {"exit_reason": str(result.exit_reason), "final_step": result.final_step}
        ended |= {"checkpoint_step": result.checkpoint_step, "evals": [step for step, _ in result.eval_losses]}
    except Exception as exc:  # noqa: BLE001 - what the test inspects
        error = exc
    report: dict[str, Any] = {"rank": RANK, "error": error and describe(error), **ended}
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
