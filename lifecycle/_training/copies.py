"""``pretrain``'s copy of the training state in node memory (``CheckpointConfig.memory_copy``).

Every ``interval`` steps the loop calls ``after_step``: the state (model, optimizer, step,
data position, RNG) is cloned on the training thread, then serialized and written to the
rank's older slot (``lifecycle._training.memory``) by a background thread while the next
step runs; the next copy waits for it. ``resume`` (collective) picks the step to resume
from: the newest step every rank holds a whole copy of, if no older than the newest
committed checkpoint (rank 0's view), else the checkpoint (``load_checkpoint``).

The interval, unless configured: the first ``MEASURED`` steps of a call are each copied,
and their cost is measured: the time the training thread spends (the clone, a wait for the
previous write) plus, when the model is on the CPU, the background write (it competes for
the same cores). ``interval = ceil(median cost / (memory_budget × median step time))``;
every rank takes the largest (one ``all_reduce``, once), so all copy the same steps.
"""

from __future__ import annotations

import io
import logging
import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from lifecycle._training.memory import NoRoom, RankCopies, sweep
from lifecycle.checkpoint import latest_checkpoint
from lifecycle.checkpoint.loader import collective_device
from lifecycle.journal import run_id

__all__ = ["MEASURED", "NodeCopies"]

logger = logging.getLogger("lifecycle.pretrain")

MEASURED = 4
"""Steps copied at the start of each call to measure the copy's cost, before the interval is derived."""

_WARNED: set[str] = set()
"""Runs this process already warned about a copy that does not fit: one warning a run."""


def _clone(value: Any) -> Any:
    """``value`` with every tensor copied to the CPU (a snapshot the training thread may then change freely)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def _fits(state: dict[str, Any], loaded: Any) -> bool:
    """Whether ``loaded`` has the model's keys with the same shapes and dtypes, and the optimizer's groups."""
    if not isinstance(loaded, dict) or not {"model", "optimizer", "step", "consumed", "rng"} <= loaded.keys():
        return False
    mine, theirs = state["model"], loaded["model"]
    if not isinstance(theirs, dict) or mine.keys() != theirs.keys():
        return False
    for key, tensor in mine.items():
        other = theirs[key]
        if isinstance(tensor, torch.Tensor) and (
            not isinstance(other, torch.Tensor) or (tensor.shape, tensor.dtype) != (other.shape, other.dtype)
        ):
            return False
    groups = [len(g["params"]) for g in state["optimizer"]["param_groups"]]
    return groups == [len(g["params"]) for g in loaded["optimizer"].get("param_groups", [])]


class NodeCopies:
    """One ``pretrain`` call's copies on this rank; does nothing unless ``memory_copy`` is set.

    ``open`` (at setup, before ``resume``) sweeps other runs' unowned copies and opens this
    run's slots; ``close`` waits for a write in flight and, after a success, removes this
    rank's files (after a failure they stay for the retry; ``decide_after`` removes them when
    the job stops, the next start's ``sweep`` after a whole-job kill).
    """

    def __init__(self, enabled: bool, interval: int, budget: float, cap_mb: float | None, attempt: str) -> None:
        self.enabled = enabled
        self.interval = interval  # 0: not derived yet
        self.budget, self.cap_mb, self.attempt = budget, cap_mb, attempt
        self.slots: RankCopies | None = None
        self.fits = enabled
        self.cap: int | None = None
        self.on_cpu = True
        self.costs: list[float] = []
        self.writes: list[float] = []
        self.periods: list[float] = []
        self.taken = 0
        self._last: float | None = None
        self._thread: threading.Thread | None = None

    def open(self, rank: int, world_size: int, on_cpu: bool) -> None:
        """Sweep other runs' unowned folders, open this rank's slots and set the cap (``CheckpointConfig``)."""
        if not self.enabled:
            return
        self.on_cpu = on_cpu
        run = run_id()
        sweep(run)
        self.slots = RankCopies(run, rank, world_size)
        try:
            self.slots.open()
            stats = os.statvfs(self.slots.folder)
        except OSError as exc:
            self._no_room(f"cannot use {self.slots.folder}: {exc}")
            return
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size) or 1)
        total = stats.f_blocks * stats.f_frsize
        self.cap = int(self.cap_mb * 2**20) if self.cap_mb is not None else total // (2 * max(local, 1))

    def _no_room(self, why: str) -> None:
        """Warn once a run, and take no more copies in this call."""
        self.fits = False
        if self.slots is not None and self.slots.run_id not in _WARNED:
            _WARNED.add(self.slots.run_id)
            logger.warning("lifecycle: no copy of the training state in node memory: %s; training goes on", why)

    def resume(
        self, state: dict[str, Any], directory: str, load_disk: Callable[[], int | None]
    ) -> tuple[int | None, str, int | None]:
        """COLLECTIVE: resume into ``state`` from a copy or ``load_disk()``: (step, source, newest checkpoint step).

        The copy of the newest step that every rank holds (whole, this run's) is used when
        it is no older than rank 0's newest committed checkpoint and loads on every rank;
        ``state``'s entries are then replaced by the copy's. Otherwise ``load_disk()``.
        """
        disk: int | None = None
        if not self.enabled or self.slots is None:
            return load_disk(), "checkpoint", None
        held = sorted(self.slots.newest())[-2:] if self.fits else []
        rank, world = dist.get_rank(), dist.get_world_size()
        mine = torch.full((3,), -1, dtype=torch.int64)
        mine[: len(held)] = torch.tensor(held, dtype=torch.int64)
        if rank == 0:
            found = latest_checkpoint(directory)
            mine[2] = -1 if found is None else found[0]
        device = collective_device()
        gathered = [torch.zeros(3, dtype=torch.int64, device=device) for _ in range(world)]
        dist.all_gather(gathered, mine.to(device))
        views = [g.cpu().tolist() for g in gathered]
        disk = None if views[0][2] < 0 else int(views[0][2])
        common = set.intersection(*({s for s in v[:2] if s >= 0} for v in views))
        step = max(common, default=None)
        if step is not None and (disk is None or step >= disk):
            loaded = None
            payload = self.slots.read(step)
            if payload is not None:
                try:
                    loaded = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
                except Exception:  # noqa: BLE001 - unloadable here: every rank falls back together
                    loaded = None
            ok = torch.tensor([int(loaded is not None and _fits(state, loaded))], device=device)
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            if int(ok.item()) and loaded is not None:
                state.update(loaded)
                return step, "memory", disk
        return load_disk(), "checkpoint", disk

    def after_step(self, step: int, state: Callable[[int], dict[str, Any]]) -> None:
        """Copy the state of ``step`` if it is due (every ``interval`` steps; each of the first ``MEASURED``)."""
        if not self.enabled:
            return
        now = time.perf_counter()
        measuring = self.interval == 0
        if not measuring and step % self.interval:
            return
        if measuring and self._last is not None:
            self.periods.append(now - self._last)
        self._join()
        if self.fits and self.slots is not None:
            snapshot = _clone(state(step))
            self._thread = threading.Thread(target=self._write, args=(step, snapshot), daemon=True)
            self._thread.start()
        self.costs.append(time.perf_counter() - now)
        self.taken += 1
        self._last = time.perf_counter()
        if measuring and self.taken >= MEASURED:
            self._derive()

    def _derive(self) -> None:
        """Set ``interval`` from the measured costs (module docstring); the largest on any rank."""
        self._join()
        cost = statistics.median(self.costs) + (statistics.median(self.writes) if self.on_cpu and self.writes else 0)
        period = max(statistics.median(self.periods), 1e-9)
        mine = torch.tensor([max(1, math.ceil(cost / (self.budget * period)))], dtype=torch.int64)
        device = collective_device()
        agreed = mine.to(device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        self.interval = int(agreed.item())
        logger.info(
            "copy in node memory: %.2f ms a copy, %.1f ms a step: every %d steps (budget %.2g)",
            cost * 1e3,
            period * 1e3,
            self.interval,
            self.budget,
        )

    def _write(self, step: int, snapshot: dict[str, Any]) -> None:
        """The background half: serialize ``snapshot`` and publish it; a copy that does not fit stops the copies."""
        assert self.slots is not None
        began = time.perf_counter()
        buffer = io.BytesIO()
        torch.save(snapshot, buffer)
        try:
            self.slots.write(step, self.attempt, buffer.getvalue(), self.cap)
        except NoRoom as exc:
            self._no_room(str(exc))
        except OSError as exc:
            self._no_room(f"writing the copy of step {step} failed: {exc}")
        self.writes.append(time.perf_counter() - began)

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close(self, success: bool) -> None:
        """Wait for the write in flight; after a success remove this rank's files (the class docstring)."""
        if not self.enabled:
            return
        self._join()
        if success and self.slots is not None:
            self.slots.remove()
