"""The Megatron-core half of ``TorchActions``: its model-parallel state, microbatch calculator, rerun state machine.

A base class of ``TorchActions`` (which holds the configuration and the default group);
each ``init_*`` acquires its one global or finds it, each release tolerates partial state.
"""

from __future__ import annotations

import torch.distributed as dist
from megatron.core import num_microbatches_calculator as _microbatches
from megatron.core import parallel_state as _ps
from megatron.core import rerun_state_machine as _rerun

from lifecycle._core.errors import ConfigError, LifecycleError, MissingResource, ResourceMismatch, StaleResource
from lifecycle._core.ownership import Owner, Resource
from lifecycle._torch.config import DistributedConfig, ParallelConfig
from lifecycle._torch.groups import FREE_WAIT_S, abort_groups, free_in_parallel, is_registered
from lifecycle._torch.megatron import MP_GLOBALS, drop_leftover_groups, reset_leftovers, seed_model_parallel_rng

__all__ = ["MegatronActions"]


class MegatronActions:
    """Acquiring and releasing Megatron-core's globals; ``TorchActions`` is the class to use."""

    distributed: DistributedConfig
    parallel: ParallelConfig
    _created_group: bool

    def _require_group(self, what: str) -> None:
        if not dist.is_initialized():
            raise MissingResource(
                Resource.PROCESS_GROUP.value,
                f"{what} needs the default process group, and there is none; create it first "
                "(init_process_group, or Session.init_distributed)",
            )

    def init_model_parallel(self) -> Owner:
        """Create Megatron's model-parallel groups and global memory buffer, or find them.

        Needs the default group. Found while the group is the caller's: the groups must
        be alive in the current world and their sizes must match the configuration,
        then ``Owner.CALLER``. Found while this object created the group: that state
        belongs to an earlier world and ``StaleResource`` is raised instead of reusing
        it; so is it for a half-made state, and for found groups that are not in the
        current world. Found sizes that disagree: ``ResourceMismatch``. Otherwise
        ``initialize_model_parallel`` with the configured sizes, ``timeout_s`` for every
        subgroup and gloo twins only if ``ParallelConfig.gloo_process_groups`` says so
        for the default group's backend, then, with CUDA, the tensor-parallel RNG tracker
        seeded with ``ParallelConfig.seed`` (``seed_model_parallel_rng``); if either
        raises, whatever it had set is cleared.
        """
        self._require_group("init_model_parallel")
        self.parallel.check_world(dist.get_world_size())
        if _ps.model_parallel_is_initialized():
            if self._created_group:
                raise StaleResource(
                    Resource.MODEL_PARALLEL.value,
                    "megatron-core model-parallel state already exists, but this session has just created the "
                    "default process group: that state is stale (left by an earlier run that did not release "
                    "it); call megatron.core.parallel_state.destroy_model_parallel() before starting a session",
                )
            self._check_found_model_parallel()
            return Owner.CALLER
        half_made = [name for name in MP_GLOBALS if getattr(_ps, name, None) is not None]
        if half_made:
            raise StaleResource(
                Resource.MODEL_PARALLEL.value,
                f"megatron-core model-parallel state is half-made ({', '.join(half_made)} set); call "
                "megatron.core.parallel_state.destroy_model_parallel() before starting a session",
            )
        try:
            _ps.initialize_model_parallel(
                tensor_model_parallel_size=self.parallel.tensor_model_parallel_size,
                pipeline_model_parallel_size=self.parallel.pipeline_model_parallel_size,
                context_parallel_size=self.parallel.context_parallel_size,
                # Megatron takes minutes but only feeds them to timedelta: a fraction works,
                # and keeps subgroups as short-fused as the default group.
                distributed_timeout_minutes=self.distributed.timeout_s / 60.0,
                create_gloo_process_groups=self.parallel.gloo_process_groups(dist.get_backend()),
            )
            seed_model_parallel_rng(self.parallel.seed)  # with CUDA only; released with the state
        except BaseException:
            self.abort_model_parallel()
            raise
        return Owner.SESSION

    def destroy_model_parallel(self) -> None:
        """Success path: drop Megatron's model-parallel groups and its global memory buffers; tolerates partial state.

        Rank-local. When the default group is the caller's, the subgroups Megatron
        created in it are aborted here too (the caller's group outlives the session, so
        nothing else would release them); when this object owns the default group,
        Megatron destroys its gloo copies (gracefully: nothing is pending after a success;
        held here meanwhile, so that they are freed in parallel, ``free_in_parallel``, not
        a tick of gloo's socket loop per copy and peer one after the other) and the rest
        go with the default group. Then what megatron-core's own destroy
        leaves set (rank lists, group aliases, the tensor-parallel RNG tracker, the MoE
        metrics tracker; see ``lifecycle._torch.megatron``) goes back to rest: every
        ``megatron.core`` module global is as before the session.
        """
        caller_group = dist.is_initialized() and not self._created_group
        held = _gloo_copies() if dist.is_initialized() and self._created_group else []
        self._release_model_parallel(_subgroups() if caller_group else [], FREE_WAIT_S, held)

    def abort_model_parallel(self) -> None:
        """Failure path: abort Megatron's groups before Megatron's own destroy runs; then as on success.

        Rank-local, no collective, no graceful destroy: the failed step's asynchronous
        work may still be pending on a group, and Megatron's destroy would wait on it for
        the ones it destroys itself (its gloo copies of the data-parallel groups: the
        whole group timeout). Aborted first, they are unregistered, so Megatron skips
        them. With the caller's default group every subgroup is aborted here (and freed
        within ``FREE_WAIT_S``); with this object's, only the gloo copies (freed in the
        background: the default group's abort, next, frees the rest at once and releases
        the peers, whose side closing is what frees a copy with pending work).
        """
        if not dist.is_initialized():
            self._release_model_parallel([], 0.0)
        elif self._created_group:
            self._release_model_parallel(_gloo_copies(), 0.0)
        else:
            self._release_model_parallel(_subgroups(), FREE_WAIT_S)

    def _release_model_parallel(self, aborted: list[object], wait_s: float, held: list[object] | None = None) -> None:
        """Abort ``aborted``, let Megatron reset its globals (and destroy ``held``, its gloo copies), then free
        ``aborted`` and ``held`` (emptied) within ``wait_s``."""
        errors = abort_groups(aborted)
        try:
            _ps.destroy_model_parallel()
            _ps.destroy_global_memory_buffer()
            drop_leftover_groups()
            reset_leftovers()
        finally:
            if held:
                aborted += held
                held.clear()
            free_in_parallel(aborted, wait_s)  # Megatron's references are gone: ours are the last
        if errors:
            raise LifecycleError(
                f"{Resource.MODEL_PARALLEL.value}: {len(errors)} model-parallel subgroup(s) failed to abort "
                f"(megatron-core's references to them were dropped anyway): {errors!r}"
            ) from errors[0]

    # -- microbatch calculator and rerun state machine -------------------------------

    def init_microbatch_calculator(self) -> Owner:
        """Create megatron-core's microbatch calculator (constant global batch), or find one.

        Needs the default group. Found: its micro and global batch sizes must match
        the configuration (else ``ResourceMismatch``), then ``Owner.CALLER``. Created with
        the data-parallel size of Megatron's state if it exists, else of the world.
        """
        self._require_group("init_microbatch_calculator")
        world = dist.get_world_size()
        if _ps.model_parallel_is_initialized():
            data_parallel = _ps.get_data_parallel_world_size()
            global_batch = self.parallel.global_batch_size or self.parallel.micro_batch_size * data_parallel
        else:
            data_parallel = self.parallel.data_parallel_size(world)
            global_batch = self.parallel.resolved_global_batch_size(world)
        if global_batch % (self.parallel.micro_batch_size * data_parallel):
            raise ConfigError(
                "parallel.global_batch_size",
                f"{global_batch} is not a multiple of micro_batch_size * data_parallel_size "
                f"= {self.parallel.micro_batch_size * data_parallel}",
            )
        found = _microbatches._GLOBAL_NUM_MICROBATCHES_CALCULATOR
        if found is not None:
            have = (found.get_micro_batch_size(), found.get_current_global_batch_size())
            want = (self.parallel.micro_batch_size, global_batch)
            if have != want:
                raise ResourceMismatch(
                    Resource.MICROBATCH_CALCULATOR.value,
                    have,
                    want,
                    "(micro, global) batch size",
                    "destroy it (megatron.core.num_microbatches_calculator.destroy_num_microbatches_calculator()) "
                    "or set ParallelConfig.micro_batch_size and global_batch_size to the sizes it has",
                )
            return Owner.CALLER
        try:
            _microbatches.init_num_microbatches_calculator(
                dist.get_rank(), None, global_batch, self.parallel.micro_batch_size, data_parallel
            )
        except BaseException:
            _microbatches.destroy_num_microbatches_calculator()
            raise
        return Owner.SESSION

    def destroy_microbatch_calculator(self) -> None:
        """Drop the microbatch calculator; a no-op if there is none."""
        _microbatches.destroy_num_microbatches_calculator()

    def init_rerun_state_machine(self) -> Owner:
        """Create megatron-core's rerun state machine in ``rerun_mode``, or find one.

        Found: its mode must match the configuration (else ``ResourceMismatch``), then
        ``Owner.CALLER``. Reads the module global directly: megatron's getter would
        silently create one.
        """
        mode = _rerun.RerunMode(self.parallel.rerun_mode)
        found = _rerun._GLOBAL_RERUN_STATE_MACHINE
        if found is not None:
            if found.mode != mode:
                raise ResourceMismatch(
                    Resource.RERUN_STATE_MACHINE.value,
                    found.mode.value,
                    mode.value,
                    "mode",
                    "destroy it (megatron.core.rerun_state_machine.destroy_rerun_state_machine()) "
                    "or set ParallelConfig.rerun_mode to the mode it has",
                )
            return Owner.CALLER
        try:
            _rerun.initialize_rerun_state_machine(mode=mode)
        except BaseException:
            _rerun.destroy_rerun_state_machine()
            raise
        return Owner.SESSION

    def destroy_rerun_state_machine(self) -> None:
        """Drop the rerun state machine; a no-op if there is none."""
        _rerun.destroy_rerun_state_machine()

    def _check_found_model_parallel(self) -> None:
        groups = (
            _ps.get_tensor_model_parallel_group(),
            _ps.get_pipeline_model_parallel_group(),
            _ps.get_data_parallel_group(),
        )
        if not all(is_registered(group) for group in groups):
            raise StaleResource(
                Resource.MODEL_PARALLEL.value,
                "megatron-core model-parallel state exists, but its groups are not in the current world: "
                "it is stale (the default group was re-created without destroy_model_parallel()); call "
                "megatron.core.parallel_state.destroy_model_parallel() before starting a session",
            )
        have = (
            _ps.get_tensor_model_parallel_world_size(),
            _ps.get_pipeline_model_parallel_world_size(),
            _ps.get_context_parallel_world_size(),
        )
        want = (
            self.parallel.tensor_model_parallel_size,
            self.parallel.pipeline_model_parallel_size,
            self.parallel.context_parallel_size,
        )
        if have != want:
            raise ResourceMismatch(
                Resource.MODEL_PARALLEL.value,
                have,
                want,
                "(tensor, pipeline, context) sizes",
                "megatron-core's model-parallel state is the caller's: destroy it "
                "(megatron.core.parallel_state.destroy_model_parallel()) or set ParallelConfig's "
                "tensor_model_parallel_size, pipeline_model_parallel_size and context_parallel_size "
                "to the sizes it has",
            )


def _subgroups() -> list[object]:
    """Every group megatron-core created on this rank (its registry of them), the default group aside."""
    return [g for g in getattr(_ps, "_global_process_group_list", None) or () if g is not None]


def _gloo_copies() -> list[object]:
    """The live groups megatron-core's own destroy destroys itself (gracefully): its ``*_GLOO`` globals."""
    found: dict[int, object] = {}
    for name, value in vars(_ps).items():
        if name.endswith("_GLOO") and is_registered(value):
            found.setdefault(id(value), value)
    return list(found.values())
