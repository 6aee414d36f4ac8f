"""One rank of the checkpoint abort fuzz (``tests/checkpoint/test_abort_fuzz.py``).

Usage: ``ckpt_abort_fuzz_worker.py DIRECTORY SEED CASES`` on 2 ranks (``RANK`` etc. set by
``lifecycle.testing.launch_ranks``); CASES: comma-separated case numbers. Case ``i``
saves step ``i + 1`` in the one shared DIRECTORY (32 tensors per rank, each holding
``10 * step + rank``) and finalizes it, while a thread on one rank (chosen by
``random.Random(SEED * 100003 + i)``, as is everything else of the case) calls
``abort()`` after a random delay that lands anywhere from before the write to the end of
the commit (as NVRx's monitor thread does). A rank whose finalize() found its save
already aborted (it returns None without a collective) joins the peer's all_gather with
a row that says "failed", as a failing rank's destroyed group would release it.

After each case both ranks wait for their writer threads, then check: both saw the
same outcome; every step folder with a manifest is complete, its files' checksums
intact; after a committed case nothing but committed steps is left (no partial folder,
no ``.tmp`` file, no file a manifest does not list); ``load_checkpoint`` (collective)
returns on both ranks the newest committed step, with each rank's own values. Prints
one JSON line: the outcome counts and every problem found.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lifecycle.checkpoint import AsyncCheckpointer, CheckpointError, load_checkpoint
from lifecycle.checkpoint.dcp_format import verify_step
from lifecycle.checkpoint.layout import listed_files, read_manifest, step_folders
from lifecycle.checkpoint.writer import ROW

RANK = int(os.environ["RANK"])
TENSORS = 32
_gathers: dict[str, float] = {"count": 0, "at": 0.0}
_real_all_gather = dist.all_gather


def _counting_all_gather(*args: Any, **kwargs: Any) -> Any:
    _gathers["count"] += 1
    _gathers["at"] = time.monotonic()  # when this rank sent its commit report
    return _real_all_gather(*args, **kwargs)


def _abort_after(writer: AsyncCheckpointer, delay: float, aborted_at: list[float]) -> None:
    time.sleep(delay)
    writer.abort()
    aborted_at.append(time.monotonic())


def _state(step: int) -> dict[str, Any]:
    return {f"t{k:02d}": torch.full((256,), 10.0 * step + RANK) for k in range(TENSORS)} | {"step": step}


_verified: dict[Path, bytes] = {}
"""Each committed folder whose files' content was checked, with the manifest it was checked against."""


def _problems_on_disk(directory: Path, committed: int | None, just_committed: bool) -> list[str]:
    """What is wrong in ``directory`` now (rank 0's view); ``committed``: the newest step both ranks committed."""
    problems = []
    for step in step_folders(directory):
        folder = directory / f"step_{step:010d}"
        if not (folder / "manifest.json").exists():
            if just_committed and step != committed:
                problems.append(f"partial folder {folder} left after the commit of step {committed}")
            continue
        try:
            manifest, raw = read_manifest(folder, step)
        except CheckpointError as exc:
            problems.append(f"a manifest that is not complete: {exc}")
            continue
        if len(manifest["shards"]) != 2:
            problems.append(f"{folder}: {len(manifest['shards'])} shards")
        if _verified.get(folder) != raw:  # its files have unique names: once checked, only a new manifest changes it
            try:
                verify_step(folder, manifest)
                _verified[folder] = raw
            except CheckpointError as exc:
                problems.append(f"content differs from what was written: {exc}")
        if committed is None or step > committed:
            problems.append(f"{folder} has a manifest, but no case committed step {step}")
        if just_committed:
            listed = {e["file"] for e in listed_files(manifest)} | {"manifest.json"}
            extra = sorted(p.name for p in folder.iterdir() if p.name not in listed)
            if extra:
                problems.append(f"{folder}: files no manifest lists after the commit of step {committed}: {extra}")
    if just_committed:
        problems += [f"left after the commit of step {committed}: {p}" for p in directory.rglob("*.tmp")]
    return problems


def main(directory: str, seed: str, cases: str) -> None:
    """Run each case; print the JSON report."""
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=20))
    torch.distributed.all_gather = _counting_all_gather  # type: ignore[assignment]
    root = Path(directory)
    outcomes = {"aborted-before": 0, "failed": 0, "committed": 0}
    problems: list[str] = []
    committed: int | None = None
    for case in (int(c) for c in cases.split(",")):
        rng = random.Random(int(seed) * 100003 + case)
        step, aborter = case + 1, rng.randrange(2)
        delay, lag = rng.uniform(0.0, 0.04), rng.uniform(0.0, 0.01)
        writer = AsyncCheckpointer(root)
        writer.save(step, _state(step))
        pending = writer._pending
        racer, aborted_at = None, []
        if aborter == RANK:
            racer = threading.Thread(target=_abort_after, args=(writer, delay, aborted_at))
            racer.start()
        time.sleep(lag)  # so that the abort also lands before finalize, or during the write
        gathered = _gathers["count"]
        try:
            outcome = "aborted-before" if writer.finalize() is None else "committed"
        except CheckpointError:
            outcome = "failed"
        if _gathers["count"] == gathered and outcome == "aborted-before":
            zeros = torch.zeros(ROW, dtype=torch.int64)  # "this rank's write failed"
            _real_all_gather([torch.zeros_like(zeros) for _ in range(2)], zeros)
        if racer is not None:
            racer.join(timeout=10)
            reported = _gathers["at"] if _gathers["count"] > gathered else float("inf")
            if outcome == "committed" and aborted_at and aborted_at[0] < reported:
                problems.append(f"case {case}: rank {RANK} aborted before its commit report, yet step {step} committed")
        if pending is not None:
            pending.future.exception(timeout=30)  # this case's writer thread is over
        both: list[Any] = [None, None]
        dist.all_gather_object(both, outcome)
        if "committed" in both and set(both) != {"committed"}:
            problems.append(f"case {case}: the ranks disagree: {both}")
        if both == ["committed", "committed"]:
            committed = step
        outcomes[outcome] += 1
        dist.barrier()
        if RANK == 0:
            problems += [f"case {case}: {p}" for p in _problems_on_disk(root, committed, committed == step)]
        target: dict[str, Any] = {f"t{k:02d}": torch.zeros(256) for k in range(TENSORS)} | {"step": 0}
        loaded = load_checkpoint(root, target)  # collective: every rank resumes from the same step
        if loaded != committed:
            problems.append(f"case {case}: rank {RANK} resumed from {loaded}, the last committed step is {committed}")
        elif loaded is not None and not all(
            torch.equal(t, torch.full((256,), 10.0 * loaded + RANK)) for k, t in target.items() if k != "step"
        ):
            problems.append(f"case {case}: rank {RANK} loaded other values than step {loaded}'s")
        dist.barrier()
    print(json.dumps({"outcomes": outcomes, "problems": problems}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
