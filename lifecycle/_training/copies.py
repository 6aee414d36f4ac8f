"""``pretrain``'s copy of the training state in node memory (``CheckpointConfig.memory_copy``).

Every ``interval`` steps the loop calls ``after_step``: the state (model, optimizer, step,
data position, RNG) is copied on the training thread into one reused byte buffer (one
``_foreach_copy_`` for every tensor, no pickle: ``_Packer``), then checksummed and written
to the rank's older slot (``lifecycle._training.memory``) by a background thread while the
next step runs (``zlib.crc32`` and ``os.write`` release the GIL); the next copy waits for it.
The loop marks when an update starts and ends (``unsettled``, ``settled``); a call that
fails outside an update copies the step the last one left (``after_failure``), into a slot
of its own.
``resume`` (collective) picks the step to resume from: the newest step every rank can load a
whole copy of (its own, or one a rank of its replica set holds on its node, with its own RNG
state of that step: a crashed rank resumes from its replica's failure copy), if no older than
the newest committed checkpoint (rank 0's view), else the checkpoint (``load_checkpoint``).

The interval, unless configured: the first ``WARMUP + MEASURED`` steps of a call are each
copied, and the cost of the last ``MEASURED`` is measured (the first lay the buffer out and
make the slot files, which later copies write over): the packing on the training thread
plus, when the model is on the CPU, the background write's CPU time (it competes for the
same cores; its waits for the GIL cost the training nothing).
``interval = ceil(median cost / (memory_budget × median step time))``; every rank takes the
largest (one ``all_reduce``, once), so all copy the same steps. A later call of the run in
the same process (a retry here) with the same model, batches and budget starts with that
interval when every rank carries it (said in ``resume``'s ``all_gather``), instead of
copying each of its first steps to measure it again.
"""

from __future__ import annotations

import json
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

__all__ = ["MEASURED", "WARMUP", "NodeCopies"]

logger = logging.getLogger("lifecycle.pretrain")

WARMUP = 3
"""Steps copied at the start of each call before any is measured: the buffer laid out, both slots and the spare
made."""
MEASURED = 4
"""Steps copied after ``WARMUP`` to measure the copy's cost, before the interval is derived."""

_INTERVALS: dict[tuple[str, str], int] = {}
"""The interval each run's calls derived in this process, by run id and ``NodeCopies.key``: a retry here starts with
it (``resume``, when every rank carries the same one) rather than copying each of its first steps to measure again."""
_WARNED: set[str] = set()
"""Runs this process already warned about a copy that does not fit: one warning a run."""


_HELD = 3
"""How many copies a rank can hold (``lifecycle._training.memory``: two every few steps, one at a failure)."""

_LOADABLE = 2 * _HELD
"""How many steps a rank says it can resume from: its own copies' and the newest of the copies that ranks of its
replica set hold on its node (``RankCopies.stand_ins``)."""

_ALIGN = 64
"""Each tensor's bytes start at a multiple of this in the payload: any dtype can be viewed in place."""


class _Packer:
    """The state as a payload of two parts: its structure (JSON, 8-byte length first), every tensor's bytes.

    The tensors are copied, on the calling thread, into one byte buffer reused from copy to
    copy (the caller waits for the previous write first): one ``copy_`` per tensor, no pickle.
    Read back by ``_unpack``, which runs no code of the file's (as ``weights_only`` loading).
    """

    def __init__(self) -> None:
        self.buffer = bytearray()
        self._layout: list[tuple[str, list[int], int, int]] = []
        self._targets: list[torch.Tensor] = []  # each tensor's place in the buffer, typed and shaped: one copy_ each

    def pack(self, state: dict[str, Any]) -> list[bytes | memoryview]:
        """The payload's parts: the structure's bytes and a view of the buffer (valid until the next ``pack``)."""
        tensors: list[torch.Tensor] = []
        tree = _walk(state, tensors)
        metas: list[tuple[str, list[int], int, int]] = []
        offset = 0
        for tensor in tensors:
            size = tensor.numel() * tensor.element_size()
            metas.append((str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset, size))
            offset += -(-size // _ALIGN) * _ALIGN
        if metas != self._layout:  # the first copy, or the state changed shape: lay the buffer out again
            self.buffer = bytearray(offset)
            flat = torch.frombuffer(self.buffer, dtype=torch.uint8) if offset else torch.empty(0, dtype=torch.uint8)
            self._targets = [
                flat[start : start + size].view(tensor.dtype).view(tensor.shape)
                for tensor, (_, _, start, size) in zip(tensors, metas, strict=True)
            ]
            self._layout = metas
        with torch.no_grad():
            torch._foreach_copy_(self._targets, tensors)  # one call for every tensor (121 on the demo model)
        structure = json.dumps({"tree": tree, "tensors": metas}).encode()
        return [len(structure).to_bytes(8, "little") + structure, memoryview(self.buffer)]


def _walk(value: Any, tensors: list[torch.Tensor]) -> dict[str, Any]:
    """``value``'s structure for ``_Packer.pack``, each tensor appended to ``tensors`` and named by its index.

    A function of the module, not a closure that calls itself: such a closure is a reference cycle, and its
    cycle kept every tensor of the state alive until a full garbage collection (after a failed call, the
    failed model's and optimizer's tensors)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return {"t": len(tensors) - 1}
    if isinstance(value, dict):
        return {"m": [[k, _walk(v, tensors)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"l" if isinstance(value, list) else "u": [_walk(v, tensors) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"s": value}
    raise TypeError(f"a {type(value).__name__} in the training state cannot be copied")


def _unpack(payload: bytes) -> Any:
    """The state ``_Packer.pack`` made ``payload`` of (its tensors on the CPU); ``ValueError`` if it is not one."""
    size = int.from_bytes(payload[:8], "little")
    data = json.loads(payload[8 : 8 + size])
    raw = bytearray(payload[8 + size :])
    flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    tensors = []
    for name, shape, start, length in data["tensors"]:
        dtype = getattr(torch, str(name), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {name!r}")
        tensors.append(flat[start : start + length].view(dtype).reshape(shape).clone())  # owns its memory

    def build(node: dict[str, Any]) -> Any:
        ((tag, value),) = node.items()
        if tag == "t":
            return tensors[value]
        if tag == "m":
            return {k: build(v) for k, v in value}
        if tag in ("l", "u"):
            items = [build(v) for v in value]
            return items if tag == "l" else tuple(items)
        if tag == "s":
            return value
        raise ValueError(f"unknown node {tag!r}")

    return build(data["tree"])


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

    def __init__(
        self, enabled: bool, interval: int, budget: float, cap_mb: float | None, attempt: str, key: str = ""
    ) -> None:
        """``key``: what the derived interval depends on besides the run (the model, the batches, the budget):
        a later call of the run in this process with the same key starts with it (``_INTERVALS``)."""
        self.enabled, self.key = enabled, key
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
        self._packer = _Packer()
        self.clean: tuple[int, torch.Tensor] | None = None  # ``settled``: the step the model holds, its RNG state
        self.copied: int | None = None  # the step of the newest copy written

    def open(self, rank: int, world_size: int, on_cpu: bool, replica: str = "") -> None:
        """Sweep other runs' unowned folders, open this rank's slots and set the cap (``CheckpointConfig``).

        ``replica``: the replica set whose ranks hold this rank's model and optimizer state
        (``CopyHeader.replica``; "" for none): their copies on this node may stand in for its own.
        """
        if not self.enabled:
            return
        self.on_cpu = on_cpu
        run = run_id()
        sweep(run)
        self.slots = RankCopies(run, rank, world_size, replica=replica)
        if run == run_id({}):  # a run id of this process's own: no later process can resume from these copies
            self.slots.remove_at_exit()
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
        own = set(self.slots.newest()) if self.fits else set()
        held = sorted(own | set(self.slots.stand_ins()))[-_LOADABLE:] if self.fits else []
        rank, world = dist.get_rank(), dist.get_world_size()
        mine = torch.full((_LOADABLE + 2,), -1, dtype=torch.int64)
        mine[: len(held)] = torch.tensor(held, dtype=torch.int64)
        mine[_LOADABLE + 1] = _INTERVALS.get((self.slots.run_id, self.key), 0) if self.interval == 0 else 0
        if rank == 0:
            try:
                found = latest_checkpoint(directory)
            except OSError:  # the peers wait in the all_gather: the checkpoint's own load says what is wrong
                found = None
            mine[_LOADABLE] = -1 if found is None else found[0]
        device = collective_device()
        gathered = [torch.zeros(_LOADABLE + 2, dtype=torch.int64, device=device) for _ in range(world)]
        dist.all_gather(gathered, mine.to(device))
        views = [g.cpu().tolist() for g in gathered]
        carried = {int(v[_LOADABLE + 1]) for v in views}
        if self.interval == 0 and len(carried) == 1 and min(carried) > 0:  # every rank's earlier call derived it
            self.interval = min(carried)
            logger.info("copy in node memory: every %d steps, as derived by this run's previous call", self.interval)
        disk = None if views[0][_LOADABLE] < 0 else int(views[0][_LOADABLE])
        common = set.intersection(*({s for s in v[:_LOADABLE] if s >= 0} for v in views))
        step = max(common, default=None)
        if step is not None and (disk is None or step >= disk):
            loaded = None
            payload, stood_in = self.slots.read(step), None
            if payload is None:
                found_in = self.slots.read_stand_in(step)
                if found_in is not None:
                    stood_in, payload = found_in
            if payload is not None:
                try:
                    loaded = _unpack(payload)
                except Exception:  # noqa: BLE001 - unloadable here: every rank falls back together
                    loaded = None
            if loaded is not None and stood_in is not None:
                loaded = self._own_rng(loaded, step, stood_in)
            ok = torch.tensor([int(loaded is not None and _fits(state, loaded))], device=device)
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            if int(ok.item()) and loaded is not None:
                state.update(loaded)
                return step, "memory", disk
        return load_disk(), "checkpoint", disk

    def _own_rng(self, loaded: Any, step: int, peer: int) -> Any:
        """``loaded``, another rank's copy of ``step``, with this rank's RNG state of that step where it was kept
        (``settled``); else with the peer's, said once in the log."""
        assert self.slots is not None
        kept = self.slots.rng(step)
        if kept is not None and isinstance(loaded, dict):
            loaded["rng"] = torch.frombuffer(bytearray(kept), dtype=torch.uint8).clone()
            logger.info("copy in node memory: step %d from rank %d's copy (a replica), this rank's RNG", step, peer)
        else:
            logger.warning("copy in node memory: step %d from rank %d's copy, with its RNG state", step, peer)
        return loaded

    def after_step(self, step: int, state: Callable[[int], dict[str, Any]]) -> None:
        """Copy the state of ``step`` if due: every ``interval`` steps, each of the first ``WARMUP + MEASURED``."""
        if not self.enabled:
            return
        now = time.perf_counter()
        measuring = self.interval == 0
        if not measuring and step % self.interval:
            return
        if measuring and self._last is not None:
            self.periods.append(now - self._last)
        self._join()  # a wait only while the interval is measured (a copy every step): not counted twice
        began = time.perf_counter()
        if self.fits and self.slots is not None:
            snapshot = self._packer.pack(state(step))
            self._thread = threading.Thread(target=self._write, args=(step, snapshot), daemon=True)
            self._thread.start()
        self.costs.append(time.perf_counter() - began)
        self.taken += 1
        self._last = time.perf_counter()
        if measuring and self.taken >= WARMUP + MEASURED:
            self._derive()

    def settled(self, step: int) -> None:
        """The update of ``step`` is done: until the next one starts (``unsettled``), the model and optimizer hold
        the state of ``step``, and this RNG state goes with it (a failure's copy, ``after_failure``)."""
        if self.enabled:
            self.clean = (step, torch.get_rng_state())
            if self.fits and self.slots is not None and self.slots.replica:
                self.slots.keep_rng(step, self.clean[1].numpy().tobytes())  # a stand-in's copy lacks it

    def unsettled(self) -> None:
        """An update starts: the model and optimizer change in place, and no failure's copy is taken until it ends."""
        self.clean = None

    def after_failure(self, state: Callable[[int], dict[str, Any]]) -> int | None:
        """The call failed: copy the state the update left (``settled``) into the failure slot; its step, or None.

        Nothing is copied when no update is settled (the failure came inside one, or before
        the first step), when the newest copy already is of that step, or when copies do not
        fit. Synchronous, after the failure's teardown: a retry here, or the rank's next
        process, resumes from it when every rank holds that step (``resume``); a rank that
        died without one leaves the others its copies every few steps, never evicted by this.
        """
        if not self.enabled or self.clean is None:
            return None
        self._join()
        step, rng = self.clean
        if not self.fits or self.slots is None or step == self.copied:
            return None
        snapshot = dict(state(step))
        snapshot["rng"] = rng
        self._write(step, self._packer.pack(snapshot), failure=True)
        return step if self.fits else None

    def _derive(self) -> None:
        """Set ``interval`` from the measured costs (module docstring); the largest on any rank."""
        self._join()
        costs, writes, periods = self.costs[WARMUP:], self.writes[WARMUP:], self.periods[WARMUP:]
        packing, writing = statistics.median(costs), statistics.median(writes) if writes else 0.0
        cost = packing + (writing if self.on_cpu else 0.0)
        period = max(statistics.median(periods), 1e-9)
        mine = torch.tensor([max(1, math.ceil(cost / (self.budget * period)))], dtype=torch.int64)
        device = collective_device()
        agreed = mine.to(device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        self.interval = int(agreed.item())
        if self.slots is not None:
            _INTERVALS[(self.slots.run_id, self.key)] = self.interval
        logger.info(
            "copy in node memory: %.2f ms a copy (packing %.2f, writing %.2f of CPU), %.1f ms a step: every %d steps"
            " (budget %.2g)",
            cost * 1e3,
            packing * 1e3,
            writing * 1e3,
            period * 1e3,
            self.interval,
            self.budget,
        )

    def _write(self, step: int, snapshot: list[bytes | memoryview], failure: bool = False) -> None:
        """The background half: checksum ``snapshot`` and publish it; a copy that does not fit stops the copies."""
        assert self.slots is not None
        began = time.thread_time()  # the CPU it takes from the training, not its waits for the GIL
        try:
            self.slots.write(step, self.attempt, snapshot, self.cap, failure=failure)
            self.copied = step
        except NoRoom as exc:
            self._no_room(str(exc))
        except OSError as exc:
            self._no_room(f"writing the copy of step {step} failed: {exc}")
        self.writes.append(time.thread_time() - began)

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
