"""Collective positions: which collective of each process group this rank entered and left, for its monitor.

``Positions.install`` wraps ``torch.distributed``'s collectives (the names in
``page.OPS``, in ``torch.distributed`` and ``torch.distributed.distributed_c10d``, and
the aliases Megatron-core binds at import time) and ``Work.wait``. Around the outermost
collective call of a thread (``all_gather_object`` calls ``all_gather``: one position) a
wrapper writes the group's slot in the marks page (``Marks.collective``):

- *entered*: the group's own sequence number (``_get_sequence_number_for_group``, the
  count of operations the group issued, whatever path issued them) after the call
  issued its work; before the call, the number the work will take;
- *left*: the sequence number once the call returned (synchronous) or its ``Work.wait``
  returned (``async_op=True``);
- the op and a fingerprint of its tensor (``numel << 8 | dtype code``);
- its call site: the caller's code object and instruction, looked up in a table; a site seen
  for the first time is written once into the page as ``path:line in function``, and
  each slot names its site by number (a monitor reads it only to name a culprit).

No store call, no extra collective, no thread: a few struct writes into the page.

``_coalescing_manager`` (Megatron-core's ``DistributedDataParallel`` coalesces each bucket
group's gradient reduce and parameter gather with it) is wrapped too: the collectives inside
it are only queued, and its exit issues them as one operation, which takes one position.

*Cross-check*: where the group's counter is found ahead of what the wrappers saw (at the
next wrapped call or at the next progress mark), something issued work on it without
them (C++ callers, a user's ``pg.allreduce``): the
group is marked *blind* for the rest of the attempt, and the monitor never convicts a
rank on a blind group's positions (``summary``). What it cannot see is in
docs/collectives.md.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from lifecycle._liveness import page as _page
from lifecycle._liveness.rank import Marks
from lifecycle.journal import GroupPosition

_MODULES = ("torch.distributed", "torch.distributed.distributed_c10d")
_ALIASES = {
    "megatron.core.distributed.param_and_grad_buffer": (
        "dist_all_gather_func",
        "dist_reduce_scatter_func",
        "_coalescing_manager",
    ),
    "megatron.core.transformer.multi_token_prediction": ("dist_all_gather_func",),
}
"""Megatron-core modules that bind a collective to a name of their own at import: patched there too."""
_COALESCING = "_coalescing_manager"
_PENDING_LIMIT = 1024
"""The most asynchronous works kept waiting for their ``wait`` (the oldest are forgotten)."""
_DTYPES = {getattr(torch, name): code for code, name in enumerate(_page.DTYPES) if name}
_CODES = {name: code for code, name in enumerate(_page.OPS) if name}


class _Group:
    """What the wrappers know of one process group: its slot, its counter's last value seen, whether blind."""

    __slots__ = ("code", "entered", "fingerprint", "label", "left", "ref", "slot")

    def __init__(self, pg: Any, slot: int, entered: int, label: str) -> None:
        self.ref = weakref.ref(pg)  # never keeps the group alive: gloo closes its sockets when it is freed
        self.slot, self.entered, self.left, self.fingerprint, self.code = slot, entered, entered, 0, 0
        self.label = label

    def number(self) -> int | None:
        """The group's sequence number now; None once the group is gone or destroyed."""
        pg = self.ref()
        try:
            return None if pg is None else int(pg._get_sequence_number_for_group())
        except RuntimeError:
            return None


class Positions:
    """This rank's collective positions, written into ``marks``; ``install`` starts them, ``uninstall`` ends them."""

    def __init__(self, marks: Marks, label: Callable[[Any], str] | None = None) -> None:
        """Write into ``marks``; ``label(pg)`` names a group in words (default: ``group <name>``)."""
        self.marks = marks
        self.label = label or (lambda pg: f"group {pg.group_name}")
        self.groups: dict[int, tuple[weakref.ref[Any], _Group | None]] = {}
        """Per group seen (by ``id``): a weak reference to it (``id`` may be reused once it is gone), its record."""
        self._local = threading.local()
        self._pending: dict[int, tuple[Any, _Group, int]] = {}
        self._patched: list[tuple[Any, str, Any]] = []
        self._default: Callable[[], Any] = lambda: None  # the default group while installed (a weak reference)
        self._sites: dict[tuple[Any, int], int] = {}
        """Per call site seen (the caller's code object and instruction), its number in the page (0: none left)."""

    # -- installing ---------------------------------------------------------------------

    def install(self) -> None:
        """Wrap the collectives and ``Work.wait``; register the default group. Idempotent while installed.

        Wrapped where they are looked up: ``torch.distributed``, its ``distributed_c10d``
        and the Megatron-core modules already imported that bound one at import (``_ALIASES``).
        """
        if self._patched:
            return
        world = dist.group.WORLD
        if world is not None:
            self._default = weakref.ref(world)
            self.group(world)
        wrapped: dict[Any, Any] = {}
        for module_name in _MODULES:
            for name in (*_page.OPS[1:], _COALESCING):
                original = getattr(sys.modules[module_name], name, None)
                if original is None:
                    continue
                if original not in wrapped:
                    wrap = self._wrap_coalescing if name == _COALESCING else functools.partial(self._wrap, name)
                    wrapped[original] = wrap(original)
                self._patch(sys.modules[module_name], name, wrapped[original])
        for module_name, names in _ALIASES.items():
            alias = sys.modules.get(module_name)
            for name in names if alias is not None else ():
                original = getattr(alias, name, None)
                if original in wrapped:
                    self._patch(alias, name, wrapped[original])
        work = dist.distributed_c10d.Work
        self._patch(work, "wait", self._wrap_wait(work.wait))
        self.marks.on_mark = self.check

    def uninstall(self) -> None:
        """Put every wrapped name back and let go of the groups and the works not waited for (idempotent).

        ``pretrain`` calls it on the failure edge and when the monitor stops: an unwaited
        work it still held would keep its group, and the group's sockets, alive.
        """
        while self._patched:
            owner, name, original = self._patched.pop()
            setattr(owner, name, original)
        if self.marks.on_mark == self.check:
            self.marks.on_mark = None
        self.groups.clear()
        self._pending.clear()
        self._sites.clear()
        self._default = lambda: None

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        self._patched.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    # -- the positions ------------------------------------------------------------------

    def group(self, pg: Any) -> _Group | None:
        """The wrappers' record of ``pg``, registered in the page on first sight; None for a group of one rank
        (no peer to compare with), one this rank is not in, or once every slot is taken."""
        found = self.groups.get(id(pg))
        if found is not None and found[0]() is pg:
            return found[1]
        record: _Group | None = None
        try:
            if pg.size() > 1:
                entered = pg._get_sequence_number_for_group()
                label = self.label(pg)
                slot = self.marks.slot(str(pg.group_name), label, entered)
                record = _Group(pg, slot, entered, label) if slot >= 0 else None
        except (RuntimeError, AttributeError):
            record = None
        with contextlib.suppress(TypeError):  # no weak reference to it: not kept (looked up again next time)
            self.groups[id(pg)] = (weakref.ref(pg), record)
        return record

    def snapshot(self) -> tuple[GroupPosition, ...]:
        """Each group's position now: what the rank's ``collectives`` record keeps."""
        return tuple(
            GroupPosition(label=known.label, entered=known.entered, left=known.left, op=_page.OPS[known.code & 0xFF])
            for _, known in self.groups.values()
            if known is not None
        )

    def check(self) -> None:
        """The cross-check at a progress mark: a group whose counter ran ahead of the wrappers is marked blind."""
        for _, known in list(self.groups.values()):
            if known is not None and not known.code >> 8 & _page.BLIND:
                now = known.number()
                if now is not None and now > known.entered:
                    self._blind(known)

    def _blind(self, record: _Group) -> None:
        record.code |= _page.BLIND << 8
        self._write(record)

    def _write(self, record: _Group) -> None:
        self.marks.collective(record.slot, record.entered, record.left, record.fingerprint, record.code)

    def _issued(self, record: _Group) -> int:
        """The group's counter once an object collective issued its work (several operations); any other call issues
        one, numbered as entered (a call that issued more is caught by the cross-check: blind)."""
        now = record.number()
        if now is not None and now > record.entered:
            record.entered = now
            self._write(record)
        return record.entered

    def _site(self, frame: Any) -> int:
        """The page's number for the call site of ``frame`` (the caller of a collective), written on first sight."""
        where = (frame.f_code, frame.f_lasti)
        number = self._sites.get(where)
        if number is None:
            path = frame.f_code.co_filename.replace("\\", "/").split("/")
            text = f"{'/'.join(path[-2:])}:{frame.f_lineno} in {frame.f_code.co_name}"
            number = self._sites[where] = self.marks.site(text)
        return number

    def _left(self, record: _Group, number: int) -> None:
        if number > record.left:
            record.left = number
            self._write(record)

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        code = _CODES[name]
        several = name.endswith(("_object", "_object_list"))  # issue more than one operation on the group
        parameters = list(inspect.signature(original).parameters)
        group_at = parameters.index("group") if "group" in parameters else -1
        async_at = parameters.index("async_op") if "async_op" in parameters else -1
        local = self._local
        coalescing = getattr(dist.distributed_c10d._world, "pg_coalesce_state", {})  # torch's coalescing state
        groups, write, pending, patched = self.groups, self.marks.collective, self._pending, self._patched
        sites, getframe = self._sites, sys._getframe

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            # Inlined (no helper calls on the way in or out): it runs on every collective (bench_positions).
            # Not installed any more (a module that bound this wrapper at import keeps it), or nested: as it was.
            if not patched or getattr(local, "depth", False):
                return original(*args, **kwargs)
            pg = kwargs.get("group", args[group_at] if 0 <= group_at < len(args) else None)
            if pg is None:
                pg = self._default()
            if pg is None or pg in coalescing:
                return original(*args, **kwargs)  # queued, issued by the manager: the cross-check sees it
            found = groups.get(id(pg))
            record = found[1] if found is not None and found[0]() is pg else self.group(pg)
            if record is None:
                return original(*args, **kwargs)
            try:
                before = pg._get_sequence_number_for_group()
            except RuntimeError:  # a group torch no longer knows: no position
                return original(*args, **kwargs)
            if before > record.entered:  # work was issued past the wrappers: blind
                record.code |= _page.BLIND << 8
            record.entered = before + 1
            frame = getframe(1)
            site = sites.get((frame.f_code, frame.f_lasti))  # the call's instruction: its line only when new
            if site is None:
                site = self._site(frame)
            record.code = code | (record.code & 0xFF00) | site << 16
            record.fingerprint = _fingerprint(args[0] if args else None)
            write(record.slot, record.entered, record.left, record.fingerprint, record.code)
            local.depth = True
            try:
                result = original(*args, **kwargs)
            finally:
                local.depth = False
            number = self._issued(record) if several else record.entered
            if result is not None and kwargs.get("async_op", args[async_at] if 0 <= async_at < len(args) else False):
                if len(pending) >= _PENDING_LIMIT:
                    pending.pop(next(iter(pending)))
                pending[id(result)] = (result, record, number)
            elif number > record.left:
                record.left = number
                write(record.slot, number, number, record.fingerprint, record.code)
            return result

        return collective

    def _wrap_coalescing(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``_coalescing_manager``: the collectives inside only queue (their wrappers let them pass), and its exit
        issues them as one operation on the group: entered before that, left once it returned or its work was
        waited for (``cm.wait()``)."""
        coalescing = getattr(dist.distributed_c10d._world, "pg_coalesce_state", {})

        @functools.wraps(original)
        @contextlib.contextmanager
        def manager(group: Any = None, device: Any = None, async_ops: bool = False) -> Iterator[Any]:
            pg = group if group is not None else self._default()
            watched = bool(self._patched) and pg is not None and not getattr(self._local, "depth", False)
            record = self.group(pg) if watched else None
            with original(group, device, async_ops) as cm:
                yield cm
                queued = coalescing.get(pg) if record is not None else None
                before = record.number() if record is not None and queued and device is None else None
                if record is not None and queued and before is not None:
                    if before > record.entered:
                        record.code |= _page.BLIND << 8
                    name = getattr(queued[0].op, "__name__", "")
                    record.entered = before + 1
                    site = self._site(sys._getframe(2))  # past contextlib's __exit__: the ``with``
                    record.code = _CODES.get(name, 0) | (record.code & 0xFF00) | site << 16
                    record.fingerprint = _fingerprint(getattr(queued[0], "tensor", None))
                    self._write(record)
                else:
                    record = None  # nothing issued as one operation (or a device-style manager): the cross-check
            if record is not None:
                if not async_ops:
                    self._left(record, record.entered)
                for work in cm.works if async_ops else ():
                    if len(self._pending) >= _PENDING_LIMIT:
                        self._pending.pop(next(iter(self._pending)))
                    self._pending[id(work)] = (work, record, record.entered)

        return manager

    def _wrap_wait(self, original: Callable[..., Any]) -> Callable[..., Any]:
        pending = self._pending

        @functools.wraps(original)
        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(work, *args, **kwargs)
            found = pending.pop(id(work), None)
            if found is not None and found[0] is work:
                self._left(found[1], found[2])
            return result

        return wait


def _fingerprint(tensor: Any) -> int:
    """``numel << 8 | dtype code`` of ``tensor`` (the first of a list); 0 for anything else."""
    try:
        return int(tensor.numel()) << 8 | _DTYPES.get(tensor.dtype, 0xFF)
    except AttributeError:
        pass
    if isinstance(tensor, (list, tuple)) and tensor:
        tensor = tensor[0]
    if not isinstance(tensor, torch.Tensor):
        return 0
    return tensor.numel() << 8 | _DTYPES.get(tensor.dtype, 0xFF)
