"""The seams: what the core asks of the world, as protocols with no torch behind them.

``lifecycle._torch.actions.TorchActions`` implements ``DistributedActions`` on torch.distributed
and megatron-core, ``lifecycle.checkpoint.AsyncCheckpointer`` implements
``CheckpointWriter``; ``lifecycle.testing`` ships recording doubles of both.
"""

from __future__ import annotations

from typing import Protocol

from lifecycle._core.states import Owner


class DistributedActions(Protocol):
    """What a session does to torch.distributed and Megatron-core.

    Each ``init_*`` method acquires one resource and returns ``Owner.SESSION`` if it
    created it or ``Owner.CALLER`` if it found it already there; if it raises, it has
    acquired nothing. Each release method releases exactly one resource.
    ``lifecycle.testing.RecordingActions`` is a recording double.
    """

    def init_store(self) -> Owner:
        """Open the rendezvous store (or take the caller's)."""

    def init_process_group(self) -> Owner:
        """Create (or find) the default process group, on the store."""

    def init_model_parallel(self) -> Owner:
        """Create (or find) the model-parallel groups and global memory buffer."""

    def init_microbatch_calculator(self) -> Owner:
        """Create (or find) the microbatch calculator."""

    def init_rerun_state_machine(self) -> Owner:
        """Create (or find) the rerun state machine."""

    def destroy_rerun_state_machine(self) -> None:
        """Destroy the rerun state machine."""

    def destroy_microbatch_calculator(self) -> None:
        """Destroy the microbatch calculator."""

    def destroy_model_parallel(self) -> None:
        """Destroy the model-parallel groups and the global memory buffer."""

    def barrier(self) -> None:
        """Wait for every rank of the default group (success teardown only)."""

    def destroy_process_group(self) -> None:
        """Destroy the default process group after a barrier (success)."""

    def abort_process_group(self) -> None:
        """Abort every process group without waiting on outstanding collectives (failure)."""

    def close_store(self) -> None:
        """Drop the rendezvous store it opened (rank-local, after the group)."""


class CheckpointWriter(Protocol):
    """In-flight checkpoint saves, as the session needs them at teardown."""

    def finalize(self) -> object:
        """Collective: wait for in-flight saves on every rank and commit them."""

    def abort(self) -> None:
        """Rank-local: abandon in-flight saves; never a collective, never commits."""
