"""One rank of test_memory_copy.py: trains with the copy in node memory on, records hashes of its state.

Usage: ``python tests/workers/copy_worker.py MODE OUT_DIR FAULT_STEP`` with ``LIFECYCLE_RUN_ID`` and
``LIFECYCLE_COPY_ROOT`` set (the test's). ``MODE``: ``crash`` (rank 1 is SIGKILLed at ``FAULT_STEP``, after its
backward pass), ``raise`` (rank 1 raises there; both ranks call ``pretrain`` again in this process: an in-process
retry), ``kill`` (every rank SIGKILLs itself at the end of ``FAULT_STEP``: a whole job killed at once),
``resume`` (one call, no fault), ``small`` (no fault, ``CAP_MB`` as the copy's cap when set in the
environment). ``MEMORY_INTERVAL`` in the environment sets the copy's interval (default 1: every
step). Every call appends to ``OUT_DIR/rank<R>.jsonl``: at each step's end the hashes of the model,
optimizer and RNG and the data position (train micro-batches consumed); at the start of training the same of the
restored state (the position read off the first batch it asks for). With ``APART_RNG=1`` rank 1 draws a random
number for each batch it reads in training, so its RNG state differs from rank 0's. Checkpoints are in
``OUT_DIR/ckpt``, journals in ``OUT_DIR/journal``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from support.configs import GROUP_TIMEOUT_S, TINY
from support.torch_internals import SyntheticTokens

from lifecycle import (
    Callback,
    CheckpointConfig,
    DistributedConfig,
    FaultInjection,
    FaultKind,
    ParallelConfig,
    Phase,
    PretrainConfig,
    SessionHandle,
    TrainContext,
    TrainingConfig,
    pretrain,
)

ITERATIONS = 12
INTERVAL = 4
RANK = int(os.environ["RANK"])
APART = os.environ.get("APART_RNG") == "1"


def digest(value: Any) -> str:
    """A SHA-256 of ``value``'s tensors and plain values, in a fixed order."""
    h = hashlib.sha256()

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            h.update(str((v.dtype, tuple(v.shape))).encode())
            h.update(v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(v, dict):
            for k in sorted(v, key=str):
                h.update(repr(k).encode())
                walk(v[k])
        elif isinstance(v, (list, tuple)):
            for item in v:
                walk(item)
        else:
            h.update(repr(v).encode())

    walk(value)
    return h.hexdigest()


class Record(Callback):
    """Appends this rank's state hashes at the start of training and at each step's end (module docstring)."""

    def __init__(self, out: Path, data: SyntheticTokens, kill_at: int | None = None) -> None:
        self.out, self.data, self.kill_at = out, data, kill_at
        self.ctx: TrainContext | None = None
        self.last = -1
        self.first: int | None = None  # the first train index asked for after training started
        self.started = False

    def batch(self, split: str, index: int) -> Any:
        if APART and RANK == 1 and self.started:  # (not setup's probe, which follows the restore)
            torch.rand(1)  # rank 1's RNG runs apart from rank 0's: a copy standing in must not bring rank 0's
        if split == "train":
            if self.started and self.first is None:
                self.first = index
                self.write({"event": "position", "position": index - self.ctx.data_parallel_rank})  # type: ignore[union-attr]
            self.last = index
        return self.data.batch(split, index)

    def hashes(self) -> dict[str, str]:
        assert self.ctx is not None
        return {
            "model": digest(self.ctx.model.state_dict()),
            "optimizer": digest(self.ctx.optimizer.state_dict()),
            "rng": digest(torch.get_rng_state()),
        }

    def write(self, record: dict[str, Any]) -> None:
        with open(self.out / f"rank{RANK}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def on_train_start(self, session: SessionHandle, ctx: TrainContext) -> None:
        self.ctx, self.started, self.first = ctx, True, None
        self.write({"event": "start", "step": ctx.start_step, **self.hashes()})

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        assert self.ctx is not None
        position = self.last - self.ctx.data_parallel_rank + self.ctx.data_parallel_size
        self.write({"event": "step", "step": step, "position": position, **self.hashes()})
        if step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def config(out: Path, fault: FaultInjection | None) -> PretrainConfig:
    """Two gloo ranks, the tiny model, a checkpoint every ``INTERVAL`` steps, a copy in node memory every step."""
    cap = os.environ.get("CAP_MB")
    return PretrainConfig(
        distributed=DistributedConfig(backend="gloo", timeout_s=GROUP_TIMEOUT_S),
        parallel=ParallelConfig(micro_batch_size=4),
        model=TINY,
        training=TrainingConfig(iterations=ITERATIONS, log_interval=0, eval_interval=0),
        checkpoint=CheckpointConfig(
            dir=str(out / "ckpt"),
            interval=INTERVAL,
            resume=True,
            memory_copy=True,
            memory_interval=int(os.environ.get("MEMORY_INTERVAL", "1")),
            memory_cap_mb=None if cap is None else float(cap),
        ),
        journal_dir=str(out / "journal"),
        fault=fault,
    )


def main(mode: str, out: Path, step: int) -> int:
    """Run the mode (module docstring); 0 if the last call closed."""
    record = Record(out, SyntheticTokens(TINY, 4, 1234), step if mode == "kill" else None)
    kind = {"crash": FaultKind.CRASH, "raise": FaultKind.RAISE}.get(mode)
    fault = None if kind is None else FaultInjection(Phase.STEP, rank=1, step=step, kind=kind)
    try:
        pretrain(config(out, fault), callbacks=[record], batch_provider=record.batch)
    except Exception as exc:  # noqa: BLE001 - the failed attempt: retried here in "raise" mode
        print(f"attempt 0 failed: {type(exc).__name__}", flush=True)
        if mode != "raise":
            return 1
        pretrain(config(out, None), callbacks=[record], batch_provider=record.batch, attempt=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])))
