"""Megatron-core's module globals: what exists now, and the group references it leaves behind."""

from __future__ import annotations

from megatron.core import parallel_state as _ps
from torch.distributed import ProcessGroup

from lifecycle._core.resources import live_resources

__all__ = ["MP_GLOBALS", "drop_leftover_groups", "live_resources"]

# Megatron's module globals that ``initialize_model_parallel`` asserts are unset; any of
# them set without ``model_parallel_is_initialized()`` means a half-made state.
MP_GLOBALS = (
    "_MODEL_PARALLEL_GROUP",
    "_TENSOR_MODEL_PARALLEL_GROUP",
    "_PIPELINE_MODEL_PARALLEL_GROUP",
    "_DATA_PARALLEL_GROUP",
    "_CONTEXT_PARALLEL_GROUP",
    "_EMBEDDING_GROUP",
    "_GLOBAL_MEMORY_BUFFER",
)


def _holds_group(value: object) -> bool:
    if isinstance(value, ProcessGroup):
        return True
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, list | tuple) and any(isinstance(item, ProcessGroup) for item in value)


def drop_leftover_groups() -> None:
    """Drop the group references megatron's ``destroy_model_parallel`` leaves in ``parallel_state``.

    megatron-core 0.16.1 does not reset ``_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP``
    (and its gloo twin), which alias the data-parallel groups. A gloo group's
    connections close only when its last reference goes (its ``abort`` does not close
    them; measured on torch 2.13), so a leftover reference would keep a peer blocked in
    a collective on it waiting for the group timeout.
    """
    for name, value in list(vars(_ps).items()):
        if name.startswith("_") and _holds_group(value):
            if isinstance(value, dict):
                value.clear()  # megatron starts these as empty dicts
            else:
                setattr(_ps, name, None)
