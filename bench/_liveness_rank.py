"""One rank of bench_liveness's third table: ``pretrain`` with a silent fault on rank 1, the monitor on or off.

Usage: ``_liveness_rank.py FOLDER KIND PHASE MODE FAIL_STEP GROUP_TIMEOUT_S`` with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set (``lifecycle.testing.launch_ranks``).
MODE is ``kill`` (the monitor at its defaults) or ``off`` (torch alone). Every step sleeps
20 ms. Prints one JSON line: the rank, its error and notes, when it failed, and the end
of its last step (wall clock).
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")

from lifecycle import (  # noqa: E402
    Callback,
    DistributedConfig,
    FaultInjection,
    LivenessConfig,
    ModelConfig,
    PretrainConfig,
    SessionHandle,
    TrainingConfig,
    pretrain,
)

STEP_SLEEP_S = 0.02


def main(folder: str, kind: str, phase: str, mode: str, fail_step: int, timeout_s: float) -> int:
    """Run the rank; print its report."""
    last = [0.0]

    class Paced(Callback):
        def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
            time.sleep(STEP_SLEEP_S)
            last[0] = time.time()

    config = PretrainConfig(
        distributed=DistributedConfig(timeout_s=timeout_s),
        model=ModelConfig(vocab_size=32, seq_length=16, hidden_size=32, num_layers=1, num_heads=2),
        training=TrainingConfig(iterations=fail_step * 3, log_interval=0, eval_interval=0),
        journal_dir=folder,
        fault=FaultInjection(phase=phase, rank=1, step=fail_step, kind=kind),  # type: ignore[arg-type]
        liveness=LivenessConfig(mode=mode),  # type: ignore[arg-type]
    )
    error: BaseException | None = None
    try:
        pretrain(config, callbacks=[Paced()])
    except Exception as exc:  # noqa: BLE001 - what the benchmark reports
        error = exc
    report = {
        "rank": int(os.environ["RANK"]),
        "error": None if error is None else f"{type(error).__name__}: {error}",
        "notes": list(getattr(error, "__notes__", ())),
        "failed_at": time.time(),
        "last_step_end": last[0],
    }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    folder, kind, phase, mode, step, timeout = sys.argv[1:7]
    sys.exit(main(folder, kind, phase, mode, int(step), float(timeout)))
