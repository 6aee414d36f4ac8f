"""Megatron-core's module globals: what exists now, and putting back to rest what its own destroy leaves."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import MappingProxyType

import torch
from megatron.core import parallel_state as _ps
from torch.distributed import ProcessGroup

from lifecycle._core.resources import live_resources

__all__ = [
    "LEFTOVERS",
    "MP_GLOBALS",
    "drop_leftover_groups",
    "live_resources",
    "reset_leftovers",
    "seed_model_parallel_rng",
]

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

_PARALLEL_STATE = "megatron.core.parallel_state"
_RNG = "megatron.core.tensor_parallel.random"
_MOE = "megatron.core.transformer.moe.moe_utils"

LEFTOVERS: Mapping[tuple[str, str], bool | dict[object, object] | None] = MappingProxyType(
    {
        # Set by initialize_model_parallel, kept by destroy_model_parallel.
        **{
            (_PARALLEL_STATE, name): None
            for name in (
                "_EMBEDDING_GLOBAL_RANKS",
                "_PIPELINE_GLOBAL_RANKS",
                "_DATA_PARALLEL_GLOBAL_RANKS",
                "_DATA_PARALLEL_GLOBAL_RANKS_WITH_CP",
                "_TENSOR_MODEL_PARALLEL_GLOBAL_RANKS",
                "_MODEL_PARALLEL_GLOBAL_RANKS",
                "_EXPERT_MODEL_PARALLEL_RANKS",
                "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP",
                "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO",
                "_HIERARCHICAL_CONTEXT_PARALLEL_GROUPS",
                # Overrides (set_data_parallel_rank); destroy resets every other _MPU_ one.
                "_MPU_DATA_PARALLEL_WORLD_SIZE",
                "_MPU_DATA_PARALLEL_RANK",
            )
        },
        (_PARALLEL_STATE, "_HYBRID_DP_CP_GROUPS"): {},
        # The tensor-parallel RNG tracker, as initialize_rng_tracker(force_reset=True) clears it.
        (_RNG, "_CUDA_RNG_STATE_TRACKER"): None,
        (_RNG, "_CUDA_RNG_STATE_TRACKER_INITIALIZED"): False,
        # The MoE aux-loss tracker: loss tensors and the groups to reduce them over.
        (_MOE, "_MOE_LAYER_WISE_LOGGING_TRACKER"): {},
    }
)
"""Module globals megatron-core leaves set after its own destroy, and the value each rests at.

Measured on megatron-core 0.16.1 (a 1-rank gloo session, and the module sources): the
resting value is the one each module starts with. A dict rests empty and is emptied
in place (megatron fills these in place, and callers may hold the dict itself).
"""


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
    a collective on it waiting for the group timeout. This sweeps every private global
    holding a group, so one a later version adds is dropped too.
    """
    for name, value in list(vars(_ps).items()):
        if name.startswith("_") and _holds_group(value):
            if isinstance(value, dict):
                value.clear()  # megatron starts these as empty dicts
            else:
                setattr(_ps, name, None)


def reset_leftovers() -> None:
    """Put every global in ``LEFTOVERS`` back to rest: after it, megatron-core is as a fresh import left it.

    Only for globals the session created (the model-parallel state is session-owned):
    these globals belong to that state and nothing of the caller's is among them.
    On megatron-core 0.16.1 (seen set after a 1-rank gloo session and megatron's own
    destroy, or, where marked, read in its source to be set by init and kept by destroy):

    - ``parallel_state``'s rank lists (``_PIPELINE_GLOBAL_RANKS``, ``_DATA_PARALLEL_GLOBAL_RANKS``,
      ``_DATA_PARALLEL_GLOBAL_RANKS_WITH_CP``, ``_TENSOR_MODEL_PARALLEL_GLOBAL_RANKS``,
      ``_MODEL_PARALLEL_GLOBAL_RANKS``, ``_EMBEDDING_GLOBAL_RANKS``,
      ``_EXPERT_MODEL_PARALLEL_RANKS``: ``[0]`` after, None in a fresh import) go to None;
      so do the group aliases ``_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP`` and its gloo
      twin, ``_HIERARCHICAL_CONTEXT_PARALLEL_GROUPS`` (source) and the
      ``_MPU_DATA_PARALLEL_WORLD_SIZE`` / ``_RANK`` overrides (source: destroy resets every
      other ``_MPU_`` override); ``_HYBRID_DP_CP_GROUPS`` (source) is emptied.
    - The tensor-parallel RNG tracker (``tensor_parallel.random``): ``_CUDA_RNG_STATE_TRACKER``
      goes to None and ``_CUDA_RNG_STATE_TRACKER_INITIALIZED`` to False (the first thing
      ``initialize_rng_tracker(force_reset=True)`` does), so the next
      ``get_cuda_rng_tracker()`` builds a new, empty tracker instead of returning this
      session's with its states; the dropped tracker is then ``reset()`` (what
      ``model_parallel_cuda_manual_seed`` does before seeding: no states, no seeds), so
      whoever still holds it cannot fork this session's states either. Its seeds derive
      from the model-parallel ranks: a tracker seeded before the session's model-parallel
      state existed is dropped too.
    - The MoE aux-loss tracker (``moe_utils._MOE_LAYER_WISE_LOGGING_TRACKER``, ``{}`` in a
      fresh import; after a session it holds each loss's tensor and its reduce / avg
      groups, which megatron's ``clear_aux_losses_tracker`` keeps, zeroing only the
      tensors): emptied in place.

    A module never imported is skipped (its globals are still at rest); a name a
    megatron-core version lacks is not created. Rank-local, no collective.
    """
    tracker = getattr(sys.modules.get(_RNG), "_CUDA_RNG_STATE_TRACKER", None)
    for (module_name, name), rest in LEFTOVERS.items():
        module = sys.modules.get(module_name)
        if module is None or not hasattr(module, name):
            continue
        value = getattr(module, name)
        if isinstance(rest, dict) and isinstance(value, dict):
            value.clear()
        else:
            setattr(module, name, {} if isinstance(rest, dict) else rest)
    if tracker is not None:
        tracker.reset()  # after the globals: if it raises, they are at rest already


def seed_model_parallel_rng(seed: int) -> bool:
    """Seed megatron-core's tensor-parallel RNG tracker for this rank if CUDA is available; return whether it did.

    Needs the model-parallel state (the tracker's seeds derive from this rank's tensor-
    and expert-parallel ranks). ``model_parallel_cuda_manual_seed(seed, force_reset_rng=True)``:
    a new tracker (an earlier one is dropped, not reused) holding the data-parallel
    (``seed``), tensor-parallel (``seed + 2718 + tp_rank``) and expert-parallel states,
    and ``torch.cuda.manual_seed(seed)`` for the current device. The tracker holds
    CUDA generator states, so without CUDA nothing is done (False): megatron-core's
    layers built with ``use_cpu_initialization=True`` never fork it. Released with the
    model-parallel state (``reset_leftovers``). Rank-local, no collective.
    """
    if not torch.cuda.is_available():
        return False
    # Imported only when it is used: on CPU this module never loads the tensor-parallel package.
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(seed, force_reset_rng=True)
    return True
