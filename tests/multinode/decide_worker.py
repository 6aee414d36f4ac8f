"""One rank of the two-node decision tests: one ``pretrain`` call, then the job's decision; torchrun restarts it.

Knobs, from the environment: ``DW_JOURNAL_DIR`` (this node's journal folder), ``DW_CHECKPOINT_DIR`` (shared),
``DW_FAULT`` (``raise`` or ``crash``), ``DW_FAIL_STEP``, ``DW_FAIL`` (when this node's rank faults: ``always``,
``first``: the job's first attempt only, ``even`` / ``odd``: on the job's attempts of that parity, counted by the
decisions already made). Prints ``[rank R] decision after attempt N: ...`` and exits with the decision's code (1 or
93); a worker that finds a stop decision already made prints ``[rank R] not starting: ...`` and exits 93; one that
closes prints ``[rank R] closed`` and exits 0.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path


def main() -> int:
    """Train once; decide after a failure; the exit code."""
    warnings.filterwarnings("ignore")
    logging.getLogger("megatron").setLevel(logging.ERROR)
    from support.internals import DECISIONS, join_round
    from support.torch_internals import job_store

    from lifecycle import (
        CheckpointConfig,
        DistributedConfig,
        FaultInjection,
        FaultKind,
        LivenessConfig,
        LivenessMode,
        ParallelConfig,
        PretrainConfig,
        TrainingConfig,
        pretrain,
    )
    from lifecycle.lowlevel import RestartPolicy, decide_after, last_decision, note_host

    env = os.environ
    rank, journal_dir = int(env["RANK"]), env["DW_JOURNAL_DIR"]
    store = job_store()
    if store is not None:
        join_round(store, rank)  # the agents' restart counts differ after a crash on one node
        note_host(store, rank)
    decided = last_decision(journal_dir, store=store)
    if decided is not None and decided.stop:
        print(f"[rank {rank}] not starting: {decided.line()}", flush=True)
        return decided.exit_code
    folder = Path(journal_dir) / DECISIONS
    attempts = len(list(folder.glob("*.json"))) if folder.is_dir() else 0  # the job's failed attempts so far
    when = env.get("DW_FAIL", "")
    fails = when == "always" or (when == "first" and attempts == 0) or (when == ("even", "odd")[attempts % 2])
    kind = FaultKind(env.get("DW_FAULT", "raise"))
    fault = FaultInjection("step", rank=rank, step=int(env.get("DW_FAIL_STEP", "5")), kind=kind) if fails else None
    config = PretrainConfig(
        distributed=DistributedConfig(backend="gloo", timeout_s=15.0),
        parallel=ParallelConfig(micro_batch_size=4),
        training=TrainingConfig(iterations=8, log_interval=0),
        checkpoint=CheckpointConfig(dir=env["DW_CHECKPOINT_DIR"], interval=2, resume=True),
        journal_dir=journal_dir,
        fault=fault,
        liveness=LivenessConfig(mode=LivenessMode.KILL, interval_s=0.5),  # names a dead rank: the culprit
    )
    try:
        pretrain(config)
    except Exception as exc:  # noqa: BLE001 - the job decides what comes next
        decision = decide_after(exc, journal_dir, store=store, policy=RestartPolicy(max_restarts=3))
        print(f"[rank {rank}] decision after attempt {decision.attempt}: {decision.line()}", flush=True)
        return decision.exit_code
    print(f"[rank {rank}] closed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
