"""What the tests observe in a process: which distributed resources are alive."""

from __future__ import annotations

import torch.distributed as dist
from megatron.core import num_microbatches_calculator, parallel_state, rerun_state_machine


def alive() -> dict[str, bool]:
    """Which process-wide resources exist now, whoever made them (all False after a clean teardown)."""
    return {
        "process_group": dist.is_initialized(),
        "model_parallel": parallel_state.model_parallel_is_initialized(),
        "microbatch_calculator": num_microbatches_calculator._GLOBAL_NUM_MICROBATCHES_CALCULATOR is not None,
        "rerun_state_machine": rerun_state_machine._GLOBAL_RERUN_STATE_MACHINE is not None,
    }
