"""One rank of the two-node tests: ``pretrain`` inside the retry loop docs/multinode.md documents.

Runs under torchrun (the rank, world and store address come from torchrun's
environment). ``train`` (between the ``retry loop`` markers) is docs/multinode.md's
loop, character for character (``test_multinode_docs.py`` checks it). Knobs, from the
environment: ``MN_STEPS`` (steps), ``MN_TIMEOUT_S`` (``DistributedConfig.timeout_s``),
``MN_ATTEMPTS`` (the loop's bound), ``MN_FAIL_HERE=1`` / ``MN_FAIL_STEP`` (a
``FaultInjection`` at that step on this process's rank, set on one node only; the loop
drops it for the retry, so it fires on the first attempt only), ``MN_STEP_SLEEP_S`` (a pause after each step,
so a test can act mid-training), ``MN_CHECKPOINT_DIR`` and ``MN_LIVENESS`` (a ``LivenessConfig`` mode, at a
0.5 s interval; off when unset).

Prints one line per event: ``[rank R] training from step S`` (an attempt's loop
started), ``[rank R] attempt A failed: ...`` (the retry loop's line), ``[rank R] closed:
steps S→F, N attempt(s) reached training`` or ``[rank R] gave up: ...``; exits 0 or 1 accordingly.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
import warnings
from collections.abc import Sequence

from lifecycle import (
    Callback,
    CheckpointConfig,
    DistributedConfig,
    FaultInjection,
    LivenessConfig,
    ParallelConfig,
    PretrainConfig,
    PretrainResult,
    SessionHandle,
    TrainContext,
    TrainingConfig,
    pretrain,
)


# --- retry loop (docs/multinode.md) ---
def train(config: PretrainConfig, callbacks: Sequence[Callback] = (), max_attempts: int = 2) -> PretrainResult:
    """``pretrain``, retried in the same processes after a failure; every rank of every node runs this loop."""
    for attempt in range(max_attempts):
        try:
            return pretrain(config, callbacks=callbacks, attempt=attempt)
        except Exception as exc:
            if getattr(exc, "requested_exit", None) or attempt + 1 == max_attempts:
                raise  # a SIGTERM (scheduler, torchrun) arrived during the failure, or no attempt is left
            print(f"[rank {os.environ['RANK']}] attempt {attempt} failed: {exc}", flush=True)
            config = dataclasses.replace(config, fault=None)  # the retry: no injected fault; resume=True resumes
    raise AssertionError("unreachable: the last attempt returns or raises")


# --- end of retry loop ---


def say(line: str) -> None:
    """Print ``line`` in one write: the ranks of a node share torchrun's stdout (``print`` writes twice)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Paced(Callback):
    """Says when each attempt starts training; pauses after each step so a test can act while ranks train."""

    def __init__(self, sleep_s: float) -> None:
        """Pause ``sleep_s`` seconds after every step."""
        self.sleep_s = sleep_s
        self.attempts = 0

    def on_train_start(self, session: SessionHandle, ctx: TrainContext) -> None:
        """Print ``training from step S`` and count the attempt."""
        self.attempts += 1
        say(f"[rank {ctx.rank}] training from step {ctx.start_step}")

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        """Pause after the step."""
        if self.sleep_s:
            time.sleep(self.sleep_s)


def main() -> int:
    """Train with the knobs from the environment; 0 once an attempt closed, 1 if the last one failed."""
    warnings.filterwarnings("ignore")
    logging.getLogger("megatron").setLevel(logging.ERROR)
    env = os.environ
    rank = int(env["RANK"])
    # Which global rank lands on which node is the rendezvous's choice: a node marks its own ranks.
    fail_step = int(env.get("MN_FAIL_STEP", "5"))
    fault = FaultInjection("step", rank=rank, step=fail_step) if env.get("MN_FAIL_HERE") == "1" else None
    checkpoint_dir = env.get("MN_CHECKPOINT_DIR")
    checkpoint = CheckpointConfig(dir=checkpoint_dir, interval=2, resume=True) if checkpoint_dir else CheckpointConfig()
    mode = env.get("MN_LIVENESS")
    liveness = LivenessConfig(mode=mode, interval_s=0.5) if mode else LivenessConfig()  # type: ignore[arg-type]
    config = PretrainConfig(
        distributed=DistributedConfig(backend="gloo", timeout_s=float(env.get("MN_TIMEOUT_S", "15"))),
        parallel=ParallelConfig(micro_batch_size=4),
        training=TrainingConfig(iterations=int(env.get("MN_STEPS", "8")), log_interval=0),
        checkpoint=checkpoint,
        fault=fault,
        liveness=liveness,
    )
    paced = Paced(float(env.get("MN_STEP_SLEEP_S", "0")))
    try:
        result = train(config, [paced], int(env.get("MN_ATTEMPTS", "2")))
    except Exception as exc:  # noqa: BLE001 - reported for the test, which also reads the exit code
        say(f"[rank {rank}] gave up: {type(exc).__name__}: {exc}")
        return 1
    steps = f"{result.start_step}→{result.final_step}"
    say(f"[rank {rank}] closed: steps {steps}, {paced.attempts} attempt(s) reached training")
    return 0


if __name__ == "__main__":
    sys.exit(main())
