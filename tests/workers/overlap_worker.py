"""One rank of ``tests/distributed/test_overlap.py``'s two-rank test: a session started inside a live one.

Both ranks drive an outer session to ``training``, then start an inner session on the
same world, drive it to ``training`` and close it; then the outer's next all-reduce on
the default group runs, and the outer closes. The rank writes one JSON line to
``$RESULTS/rank<rank>.json``: the owners in the inner's ledger, what it reclaimed, the
all-reduce's sum, both final states and what is left alive (or the error and where).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from support.configs import GROUP_TIMEOUT_S
from support.probes import alive
from support.session import drive
from support.torch_internals import HOSTED

from lifecycle import DistributedConfig, ParallelConfig, Session, State, TorchActions, Trigger
from lifecycle.lowlevel import declared_resources
from lifecycle.testing import release_everything

ACQUIRED = tuple(r for r in declared_resources() if r.acquired_by in (Trigger.INIT_DISTRIBUTED, Trigger.INIT_GLOBALS))
"""The kinds the triggers up to ``training`` acquire, from the declarations."""


def actions() -> TorchActions:
    """Real gloo actions on the launcher's world (RANK, WORLD_SIZE, MASTER_ADDR/PORT), with short timeouts."""
    return TorchActions(DistributedConfig(timeout_s=GROUP_TIMEOUT_S), ParallelConfig())


def owners(session: Session) -> dict[str, str | None]:
    """Each kind in ``ACQUIRED`` → the owner ``session``'s ledger records (None: not recorded)."""
    return {kind.value: getattr(session.ledger.owner(kind), "value", None) for kind in ACQUIRED}


def scenario(rank: int, record: dict[str, Any]) -> None:
    """Outer to ``training``; inner up and closed; the outer's all-reduce; the outer closed. Fills ``record``."""
    outer = Session(actions(), label="outer")
    with outer:
        drive(outer, State.TRAINING)
        inner = Session(actions(), label="inner")
        with inner:
            drive(inner, State.TRAINING)
            record["inner_owners"] = owners(inner)
            record["inner_reclaimed"] = [str(r.step) for r in inner.reclaimed]
        record["inner_state"] = inner.state.value
        record["outer_owners"] = owners(outer)
        value = torch.tensor([rank + 1.0])
        dist.all_reduce(value)  # the default group: the outer's
        record["sum"] = value.item()
    record["outer_state"] = outer.state.value


def main() -> int:
    """Run the scenario on this rank; write what it saw, then what was left alive."""
    rank = int(os.environ["RANK"])
    record: dict[str, Any] = {}
    try:
        scenario(rank, record)
    except BaseException as exc:  # noqa: BLE001 - recorded: what the rank saw is the result
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()
    record["dist_initialized"] = dist.is_initialized()
    record["model_parallel_initialized"] = parallel_state.model_parallel_is_initialized()
    record["hosted_stores"] = len(HOSTED)
    record["alive"] = alive()
    record["left"] = release_everything()
    Path(os.environ["RESULTS"], f"rank{rank}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
