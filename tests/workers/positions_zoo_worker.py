"""One rank of ``tests/liveness/test_positions_zoo.py``: 1,000 healthy steps at TP2 x DP2 with positions on.

Usage: ``positions_zoo_worker.py OUT_DIR [STEPS]`` (1,000 by default) with ``RANK``, ``WORLD_SIZE`` (4), ``MASTER_ADDR``
and ``MASTER_PORT`` set. ``pretrain`` at the demo's liveness defaults (kill mode, 1 s
interval, a 30 s group timeout: a 10 s conviction floor), tensor-parallel 2, data-parallel
2. Each forward first sleeps a seeded jitter (0-20 ms), then runs an uneven
``all_to_all_single`` over the data-parallel group (split sizes differ by rank and step:
legitimate, never a desync); every 100th forward one seeded rank sleeps 2.5-6 s there (the
100th: 6 s), outside the collectives its peers wait in: slow, not stuck (past the 2 s suspicion
deadline, short of the 10 s conviction floor). Prints one JSON line: this rank, its
error, how it ended.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from support.configs import TINY  # noqa: E402
from support.internals import describe  # noqa: E402
from support.torch_internals import default_forward_step  # noqa: E402

from lifecycle import (  # noqa: E402
    DistributedConfig,
    LivenessConfig,
    ParallelConfig,
    PretrainConfig,
    TrainingConfig,
    pretrain,
)

RANK = int(os.environ["RANK"])
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
SLOW_EVERY = 100
JITTER = random.Random(1000 + RANK)
SLOW = random.Random(40)  # the same on every rank: which rank is slow, and for how long
CALLS = [0]


def forward_step(batch: dict[str, torch.Tensor], model: torch.nn.Module) -> torch.Tensor:
    """Jitter, an uneven all_to_all over the data-parallel group, now and then a slow rank; then the default loss."""
    call = CALLS[0] = CALLS[0] + 1
    slow_rank, slow_s = SLOW.randrange(4), 6.0 if call == 100 else SLOW.uniform(2.5, 6.0)
    if call % SLOW_EVERY == 0 and slow_rank == RANK:
        time.sleep(slow_s)
    time.sleep(JITTER.uniform(0.0, 0.02))
    group = parallel_state.get_data_parallel_group()
    me, size = dist.get_rank(group), dist.get_world_size(group)
    sends = [1 + (me + peer + call) % 3 for peer in range(size)]  # what this rank sends each peer
    receives = [1 + (peer + me + call) % 3 for peer in range(size)]  # what each peer sends it (the same rule)
    out = torch.empty(sum(receives))
    dist.all_to_all_single(out, torch.ones(sum(sends)), receives, sends, group=group)
    return default_forward_step(batch, model)


def main(out: Path) -> int:
    """Train; print this rank's report."""
    config = PretrainConfig(
        distributed=DistributedConfig(timeout_s=30.0),
        parallel=ParallelConfig(tensor_model_parallel_size=2, micro_batch_size=4),
        model=TINY,
        training=TrainingConfig(iterations=STEPS, log_interval=0, eval_interval=0),
        journal_dir=str(out),
        liveness=LivenessConfig(mode="kill"),  # type: ignore[arg-type]
    )
    error: BaseException | None = None
    ended: dict[str, Any] = {}
    try:
        result = pretrain(config, forward_step)
        ended = {"exit_reason": str(result.exit_reason), "final_step": result.final_step}
    except Exception as exc:  # noqa: BLE001 - what the test inspects
        error = exc
    print(json.dumps({"rank": RANK, "error": error and describe(error), **ended}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
