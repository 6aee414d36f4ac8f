"""Process groups: telling a live one from a destroyed one, and aborting without waiting."""

from __future__ import annotations

import logging
from typing import Any

import torch.distributed as dist

_log = logging.getLogger("lifecycle._torch")


def pg_map() -> dict[Any, Any]:
    """torch's registry of live process groups."""
    # Megatron reads the same private registry to tell a live group from a destroyed one.
    pg_map: dict[Any, Any] = dist.distributed_c10d._world.pg_map
    return pg_map


def is_registered(group: Any) -> bool:
    """True if ``group`` is a process group torch still has registered (not destroyed or aborted)."""
    return group is not None and group in pg_map()


def abort_group(group: Any) -> None:
    """Abort ``group`` (None: every group) without waiting on its outstanding collectives.

    Uses torch's ``_abort_process_group`` (torch >= 2.5): for nccl it aborts the
    communicators; for gloo (measured, torch 2.13: 15-80 ms) it unregisters the groups,
    and their connections close when the last reference to them goes, which releases a
    peer blocked in a collective within milliseconds ("Connection closed by peer").
    Where it is missing, or raises while the group is still registered, falls back to
    ``destroy_process_group``, which for gloo does not wait on a peer either.
    """
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is not None:
        try:
            abort(group)
            return
        except Exception:
            still_there = dist.is_initialized() if group is None else is_registered(group)
            if not still_there:
                raise  # it is gone, but the abort itself failed: report it
            _log.warning("aborting process group %r failed; destroying it instead", group, exc_info=True)
    dist.destroy_process_group(group)
