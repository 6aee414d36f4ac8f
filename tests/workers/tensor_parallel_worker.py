"""One rank of the tensor-parallel ``pretrain`` tests in ``tests/training/test_tensor_parallel.py``.

Usage: ``tensor_parallel_worker.py OUT_DIR TP [--slow] [--keep-errors]`` with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` set (``lifecycle.testing.launch_ranks`` sets them).
Every ``pretrain`` call of one launch runs in these same processes, one after the other:

1. ``whole``: an uninterrupted run with tensor-parallel size TP (checkpoints every 3 steps).
2. ``fault-<phase>``: for every ``Phase``, a run with a fault injected on one rank (rank
   ``i % world``); each must raise, and the next call must start from a clean slate. With
   ``--keep-errors`` the exceptions are kept, as a caller may keep them: their tracebacks
   hold the model, whose megatron-core layers held the tensor-parallel group (``pretrain``
   drops those references; without that, a peer waited on the group and the ranks fell
   out of step).
3. ``resumed``: a retry resuming from ``fault-step``'s checkpoint folder: its losses must
   equal ``whole``'s, bit for bit.
4. ``dp``/``dp-part`` (not ``--slow``): tensor-parallel size 1, so data-parallel size =
   world: an uninterrupted run and one stopped at step 4, for the resume on another
   data-parallel size, which the test runs in its own process.

Every torch.distributed collective the successful runs issue (outermost calls only, on
the training thread and any other) is recorded as ``(operation, group, device)``. Prints
one JSON line: losses, the local parameter count, faults seen, collectives.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")

import torch  # noqa: E402 - after the warning filter
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from support.configs import TINY  # noqa: E402

from lifecycle import (  # noqa: E402
    Callback,
    CheckpointConfig,
    DistributedConfig,
    FaultInjection,
    ParallelConfig,
    Phase,
    PretrainConfig,
    SessionHandle,
    TrainContext,
    TrainingConfig,
    pretrain,
)

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
ITERATIONS = 6
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "reduce",
    "gather",
    "scatter",
    "barrier",
    "broadcast_object_list",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "isend",
    "irecv",
)
"""The torch.distributed functions watched: every collective and point-to-point call it offers."""


class Recorder:
    """Records ``(operation, group, device)`` of every outermost torch.distributed collective while ``on``."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str, str]] = set()
        self.on = False
        self._depth = threading.local()

    @staticmethod
    def group_name(group: Any) -> str:
        """``world``, ``tensor`` or ``data``: which of megatron-core's groups ``group`` is; ``other`` else."""
        if group is None or group is dist.group.WORLD:
            return "world"
        if parallel_state.model_parallel_is_initialized():
            if group is parallel_state.get_tensor_model_parallel_group():
                return "tensor"
            if group is parallel_state.get_data_parallel_group():
                return "data"
        return "other"

    @staticmethod
    def device(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> str:
        """The device type of the collective's first tensor; ``object`` for object collectives, ``none`` without."""
        if name.endswith(("_object", "_object_list")):
            return "object"
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor):
                return value.device.type
            if isinstance(value, list | tuple) and value and isinstance(value[0], torch.Tensor):
                return value[0].device.type
        return "none"

    def wrap(self, name: str, collective: Callable[..., Any]) -> Callable[..., Any]:
        """``collective``, recording each outermost call while ``on``."""

        @functools.wraps(collective)
        def watched(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "n", 0)
            if self.on and depth == 0:
                self.seen.add((name, self.group_name(kwargs.get("group")), self.device(args, kwargs, name)))
            self._depth.n = depth + 1
            try:
                return collective(*args, **kwargs)
            finally:
                self._depth.n = depth
                # A failed call's traceback keeps this frame: it must not keep the group (its sockets).
                del args, kwargs

        return watched

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Replace every watched function on ``torch.distributed`` for the block."""
        originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
        try:
            for name, original in originals.items():
                setattr(dist, name, self.wrap(name, original))
            yield
        finally:
            for name, original in originals.items():
                setattr(dist, name, original)


class ShardSize(Callback):
    """Notes how many parameter elements this rank's model holds."""

    def __init__(self) -> None:
        self.numel = 0

    def on_setup_end(self, session: SessionHandle, ctx: TrainContext) -> None:
        self.numel = sum(p.numel() for p in ctx.model.parameters())


def config(out: Path, name: str, tp: int, **fields: Any) -> PretrainConfig:
    """A run of ``ITERATIONS`` steps with tensor-parallel size ``tp``, global batch 4, checkpoints under out/name."""
    base: dict[str, Any] = {
        "distributed": DistributedConfig(timeout_s=10),
        "parallel": ParallelConfig(
            tensor_model_parallel_size=tp, micro_batch_size=4 * tp // WORLD, global_batch_size=4
        ),
        "model": TINY,
        "training": TrainingConfig(iterations=ITERATIONS, log_interval=0, eval_interval=3, eval_iterations=1),
        "checkpoint": CheckpointConfig(dir=str(out / name / "ckpt"), interval=3),
        "journal_dir": str(out / name / "journal"),
    }
    base.update(fields)
    return PretrainConfig(**base)


def main(out: Path, tp: int, slow: bool, keep_errors: bool) -> int:
    recorder = Recorder()
    report: dict[str, Any] = {"rank": RANK, "faults": {}, "fault_s": {}}
    with recorder.installed():
        size = ShardSize()
        recorder.on = True
        whole = pretrain(config(out, "whole", tp), callbacks=[size])
        recorder.on = False
        report["whole"] = [loss for _, loss in whole.losses]
        report["numel"] = size.numel
        kept: list[BaseException] = []  # as a caller (pytest.raises, a retry loop's log) may keep them
        for i, phase in enumerate(Phase):
            fault = FaultInjection(phase, rank=i % WORLD, step=5 if phase is Phase.STEP else 2)
            started = time.monotonic()
            try:
                pretrain(config(out, f"fault-{phase.value}", tp, fault=fault))
            except Exception as exc:  # noqa: BLE001 - what each rank saw is the report
                if keep_errors:
                    kept.append(exc)
                report["faults"][phase.value] = type(exc).__name__
            else:
                report["faults"][phase.value] = None
            report["fault_s"][phase.value] = time.monotonic() - started
        recorder.on = True
        resumed_config = config(
            out,
            "fault-step",
            tp,
            checkpoint=CheckpointConfig(dir=str(out / "fault-step" / "ckpt"), interval=3, resume=True),
        )
        resumed = pretrain(resumed_config)
        report["resumed"] = [[step, loss] for step, loss in resumed.losses]
        if not slow:
            dp = pretrain(config(out, "dp", 1))
            report["dp"] = [loss for _, loss in dp.losses]
            part = pretrain(config(out, "dp-part", 1, training=TrainingConfig(iterations=4, log_interval=0)))
            report["dp_part_checkpoint"] = part.checkpoint_step
        recorder.on = False
    report["collectives"] = sorted(recorder.seen)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]), "--slow" in sys.argv[3:], "--keep-errors" in sys.argv[3:]))
