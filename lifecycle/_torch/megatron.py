"""Megatron-core's module globals: what exists now, and putting back to rest what its own destroy leaves."""

from __future__ import annotations

import enum
import importlib
import sys
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import TypeAlias

import torch
from megatron.core import parallel_state as _ps
from torch.distributed import ProcessGroup

from lifecycle._core.resources import live_resources

__all__ = [
    "LEFTOVERS",
    "MP_GLOBALS",
    "Leftover",
    "Rest",
    "drop_leftover_groups",
    "expected_leftovers",
    "live_resources",
    "megatron_version",
    "missing_leftovers",
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
_MOE_UTILS = "megatron.core.transformer.moe.moe_utils"
_MOE_LOGGING = "megatron.core.transformer.moe.moe_logging"
_GTP = "megatron.core.tensor_parallel.generalized_tensor_parallelism"

Version: TypeAlias = tuple[int, int]
"""A megatron-core release as (major, minor)."""


class Rest(enum.Enum):
    """The value a leftover global rests at: what a fresh import of its module holds."""

    NONE = "None"
    FALSE = "False"
    EMPTY = "empty"  # a container megatron fills in place: emptied in place (callers may hold it)


@dataclass(frozen=True, slots=True)
class Leftover:
    """One module global megatron-core's own destroy leaves set, and how it goes back to rest.

    ``since`` / ``until``: the first release that has it, and the first that no longer
    does (None: still there in the newest tested, 0.19). ``contents``: an attribute of
    the value holding a dict that is emptied in place first, so whoever still holds the
    object cannot reach what it referenced (process groups). ``helper``: megatron's own
    function in ``module`` that puts it (and related state) to rest, called before the
    global is set to ``rest`` (which then changes nothing unless a later megatron-core
    changes the helper).
    """

    module: str
    name: str
    rest: Rest
    since: Version = (0, 16)
    until: Version | None = None
    contents: str | None = None
    helper: str | None = None

    def applies_to(self, version: Version) -> bool:
        """Whether megatron-core ``version`` has this global."""
        return self.since <= version and (self.until is None or version < self.until)

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


LEFTOVERS: tuple[Leftover, ...] = (
    # Set by initialize_model_parallel, kept by destroy_model_parallel.
    *(
        Leftover(_PARALLEL_STATE, name, Rest.NONE)
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
    ),
    Leftover(_PARALLEL_STATE, "_HYBRID_DP_CP_GROUPS", Rest.EMPTY),
    # The tensor-parallel RNG tracker, as initialize_rng_tracker(force_reset=True) clears it.
    Leftover(_RNG, "_CUDA_RNG_STATE_TRACKER", Rest.NONE),
    Leftover(_RNG, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", Rest.FALSE),
    # The MoE aux-loss tracker: loss tensors and the groups to reduce them over. Up to 0.17 a dict.
    Leftover(_MOE_UTILS, "_MOE_LAYER_WISE_LOGGING_TRACKER", Rest.EMPTY, until=(0, 18)),
    # From 0.18 an object (None until first use) whose clear() zeroes values but keeps the groups.
    Leftover(
        _MOE_LOGGING,
        "_MOE_METRICS_TRACKER",
        Rest.NONE,
        since=(0, 18),
        contents="_metrics",
        helper="destroy_moe_metrics_tracker",
    ),
    # 0.19's generalized tensor parallelism (GTP): its groups are reset by destroy_model_parallel;
    # reset_gtp_state clears the prefetch-chain state (class-level dicts) and this parity counter.
    Leftover(_GTP, "_GTP_GROUPED_BUF_PARITY_COUNTER", Rest.EMPTY, since=(0, 19), helper="reset_gtp_state"),
    # The sharded parameters (each holds its GTP group), registered as a GTP model is built.
    Leftover(_GTP, "_GTP_PARAMS", Rest.EMPTY, since=(0, 19)),
)
"""Module globals megatron-core leaves set after its own destroy, each with the releases that have it.

Read from the sources of megatron-core 0.16.1, 0.17.1, 0.18.2 and 0.19.2, and measured on
0.16.1 and 0.19.2 (a 1-rank gloo session: tests/distributed/test_megatron_clean.py). The
resting value is the one each module starts with. ``expected_leftovers`` is the list for
one release; ``missing_leftovers`` names what that list expects and the installed
megatron-core lacks (the tests fail on it).
"""


def megatron_version() -> Version:
    """The installed megatron-core's (major, minor), from ``megatron.core.package_info``."""
    from megatron.core import package_info

    return int(package_info.MAJOR), int(package_info.MINOR)


def expected_leftovers(version: Version | None = None) -> tuple[Leftover, ...]:
    """The ``LEFTOVERS`` megatron-core ``version`` (default: the installed one) has, in declaration order."""
    found = megatron_version() if version is None else version
    return tuple(leftover for leftover in LEFTOVERS if leftover.applies_to(found))


def missing_leftovers() -> tuple[str, ...]:
    """Name each global (or helper) the installed megatron-core should have by ``expected_leftovers`` but lacks.

    Imports every module the list names (a module that fails to import is reported
    too). Empty when the list matches the installed release; the tests require that,
    so a megatron-core that moves a global fails them instead of leaking it silently.
    """
    missing: list[str] = []
    for leftover in expected_leftovers():
        try:
            module = importlib.import_module(leftover.module)
        except ImportError as exc:
            missing.append(f"{leftover} (module does not import: {exc})")
            continue
        if not hasattr(module, leftover.name):
            missing.append(str(leftover))
        if leftover.helper is not None and not callable(getattr(module, leftover.helper, None)):
            missing.append(f"{leftover.module}.{leftover.helper}()")
    return tuple(missing)


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


def _put_to_rest(module: ModuleType, leftover: Leftover) -> None:
    value = getattr(module, leftover.name)
    held = getattr(value, leftover.contents, None) if leftover.contents is not None else None
    if isinstance(held, dict):
        held.clear()  # emptied, not zeroed: a holder of the object keeps no group
    if leftover.helper is not None:
        getattr(module, leftover.helper)()
    if leftover.rest is Rest.EMPTY:
        value = getattr(module, leftover.name)
        if isinstance(value, dict | list | set):
            value.clear()
        else:
            setattr(module, leftover.name, {})
    else:
        setattr(module, leftover.name, None if leftover.rest is Rest.NONE else False)


def reset_leftovers() -> None:
    """Put every global of ``expected_leftovers()`` back to rest: megatron-core is then as a fresh import left it.

    Only for globals the session created (the model-parallel state is session-owned):
    these globals belong to that state and nothing of the caller's is among them.
    Seen set after a 1-rank gloo session and megatron's own destroy (0.16.1, 0.19.2), or,
    where marked, read in the sources to be set by init and kept by destroy:

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
    - The MoE aux-loss tracker, which holds each loss's tensor and its reduce / avg groups
      (megatron's own clear only zeroes the tensors): up to 0.17
      ``moe_utils._MOE_LAYER_WISE_LOGGING_TRACKER`` (a dict) is emptied in place; from 0.18
      ``moe_logging._MOE_METRICS_TRACKER`` has its entries emptied (a holder of the
      tracker keeps no group) and goes to None through ``destroy_moe_metrics_tracker()``.
    - 0.19's GTP state (source): ``reset_gtp_state()`` (prefetch-chain state and the
      buffer parity counter) and the registered sharded parameters (``_GTP_PARAMS``,
      emptied). Its buffer cache, which megatron keeps for the process, is left alone.

    A module never imported is skipped (its globals are still at rest). A global the
    list expects for this release that is missing is not created: the others are reset,
    then a ``RuntimeWarning`` names it (the tests fail on it: ``missing_leftovers``).
    Rank-local, no collective.
    """
    tracker = getattr(sys.modules.get(_RNG), "_CUDA_RNG_STATE_TRACKER", None)
    missing: list[str] = []
    for leftover in expected_leftovers():
        module = sys.modules.get(leftover.module)
        if module is None:
            continue
        if not hasattr(module, leftover.name):
            missing.append(str(leftover))
            continue
        _put_to_rest(module, leftover)
    if tracker is not None:
        tracker.reset()  # after the globals: if it raises, they are at rest already
    if missing:
        warnings.warn(
            f"megatron-core {'.'.join(map(str, megatron_version()))} lacks {', '.join(missing)}, which lifecycle "
            "resets after a session; whatever replaced it may keep this session's state (report it)",
            RuntimeWarning,
            stacklevel=2,
        )


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
