"""One rank of the failure-notice tests in ``tests/distributed/test_failure_notice.py``: several runs, one process.

Usage: ``failure_notice_worker.py OUT_DIR`` with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` set (``lifecycle.testing.launch_ranks`` sets them; rank 0 hosts the store).
Runs, in this order, each with its journal in ``OUT_DIR/<scenario>``:

- ``clean``: ``pretrain`` to the end; nothing fails.
- ``peer``: ``pretrain`` with the demo's fault (``--fail-at step --fail-rank 1``) at step ``FAIL_STEP``.
- ``together``: both ranks raise in ``on_step_end`` of step ``FAIL_STEP``.
- ``host_first``: a session of its own: rank 0, which hosts the store, fails and exits;
  rank 1 raises only once the store's port refuses connections.

Prints one JSON line per run: the scenario, this rank, its error and the error's notes.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")

import torch  # noqa: E402 - after the warning filter
import torch.distributed as dist  # noqa: E402
from support.configs import TINY  # noqa: E402
from support.internals import RunJournal, describe  # noqa: E402

from lifecycle import (  # noqa: E402
    Callback,
    DistributedConfig,
    FaultInjection,
    ParallelConfig,
    PretrainConfig,
    Session,
    SessionHandle,
    TorchActions,
    TrainingConfig,
    pretrain,
)

RANK = int(os.environ["RANK"])
FAIL_STEP = 3
TIMEOUT_S = 20.0


class BothFail(Callback):
    """Raises on every rank at the end of ``FAIL_STEP``: two ranks failing independently, at once."""

    def on_step_end(self, session: SessionHandle, step: int, loss: float) -> None:
        if step == FAIL_STEP:
            raise RuntimeError(f"rank {RANK} fails on its own at step {step}")


def config(out: Path, scenario: str, **fields: Any) -> PretrainConfig:
    """A tiny two-rank run on the launcher's rendezvous, journaled in ``out/scenario``."""
    return PretrainConfig(
        distributed=DistributedConfig(timeout_s=TIMEOUT_S),
        parallel=ParallelConfig(micro_batch_size=4),
        model=TINY,
        training=TrainingConfig(iterations=FAIL_STEP + 2, log_interval=0, eval_interval=0),
        journal_dir=str(out / scenario),
        **fields,
    )


def report(scenario: str, error: BaseException | None) -> None:
    """One JSON line: how this rank's run of ``scenario`` ended."""
    notes = list(getattr(error, "__notes__", ()))
    print(json.dumps({"scenario": scenario, "rank": RANK, "error": error and describe(error), "notes": notes}))
    sys.stdout.flush()


def run(scenario: str, call: Any) -> None:
    """Run ``call()``, report how it ended."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - what the test inspects
        report(scenario, exc)
    else:
        report(scenario, None)


def store_refuses(addr: str, port: int) -> bool:
    """True once nothing listens at ``addr:port`` any more."""
    try:
        with socket.create_connection((addr, port), timeout=0.5):
            return False
    except OSError:
        return True


def host_first(out: Path) -> None:
    """Rank 0 (the store's host) fails and its process ends; rank 1 fails after, the store gone."""
    from lifecycle.journal import Origin, run_id

    session = Session(TorchActions(DistributedConfig(timeout_s=TIMEOUT_S), ParallelConfig()))
    session.label = f"rank {RANK}"
    origin = Origin(run_id=run_id(), rank=RANK, attempt=0, restart_mode="ordinary", iteration=0)
    journal = RunJournal(str(out / "host_first"), origin, 2, session)
    session.add_observer(journal.observe)
    try:
        with session:
            session.init_distributed()
            session.init_globals()
            session.start_training()
            dist.all_reduce(torch.ones(1))  # both ranks are training now
            session.progress("step", 1)
            if RANK == 0:
                raise RuntimeError("the store's host fails")
            deadline = time.monotonic() + TIMEOUT_S
            addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
            while not store_refuses(addr, port) and time.monotonic() < deadline:
                time.sleep(0.05)
            raise RuntimeError("rank 1 fails after the store is gone")
    except Exception as exc:  # noqa: BLE001 - what the test inspects
        report("host_first", exc)
    finally:
        journal.close()


def main(out: Path) -> int:
    run("clean", lambda: pretrain(config(out, "clean")))
    fault = FaultInjection(phase="step", rank=1, step=FAIL_STEP)  # type: ignore[arg-type]  # a phase name
    run("peer", lambda: pretrain(config(out, "peer", fault=fault)))
    run("together", lambda: pretrain(config(out, "together"), callbacks=[BothFail()]))
    host_first(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
