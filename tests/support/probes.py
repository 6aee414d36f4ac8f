"""What the tests observe in a process: which distributed resources are alive."""

from __future__ import annotations

import torch.distributed as dist
from megatron.core import num_microbatches_calculator, parallel_state, rerun_state_machine

TORCH_COLLECTIVES = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "irecv",
    "isend",
    "monitored_barrier",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
)
"""torch.distributed functions that talk to peers: none may run on a failure path."""


def alive() -> dict[str, bool]:
    """Which process-wide resources exist now, whoever made them (all False after a clean teardown)."""
    return {
        "process_group": dist.is_initialized(),
        "model_parallel": parallel_state.model_parallel_is_initialized(),
        "microbatch_calculator": num_microbatches_calculator._GLOBAL_NUM_MICROBATCHES_CALCULATOR is not None,
        "rerun_state_machine": rerun_state_machine._GLOBAL_RERUN_STATE_MACHINE is not None,
    }
