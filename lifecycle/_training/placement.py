"""Where ``pretrain``'s tensors live and which groups they cross: its device, shard layout, data-parallel group.

Module-level functions, looked up at each use: nothing here keeps a process group on an object.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from lifecycle.checkpoint.layout import ShardLayout

__all__ = ["dp_group", "flat_apply", "model_device", "shard_layout", "to_device"]


def model_device() -> torch.device:
    """The rank's device: its current CUDA device when the default group is nccl and CUDA is there, else the CPU.

    The session selected that device (``LOCAL_RANK``) before it created the group.
    """
    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor in it (a tensor, or one in a dict, list or tuple) on ``device``; as is on CPU."""
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def shard_layout(world_size: int) -> ShardLayout:
    """This rank's place in megatron-core's model-parallel state, as the checkpoints record it.

    Context-parallel ranks hold the same weights as data-parallel ones: both are replicas.
    """
    tensor = parallel_state.get_tensor_model_parallel_world_size()
    pipeline = parallel_state.get_pipeline_model_parallel_world_size()
    return ShardLayout(
        tensor=tensor,
        pipeline=pipeline,
        data=world_size // (tensor * pipeline),
        tensor_rank=parallel_state.get_tensor_model_parallel_rank(),
        pipeline_rank=parallel_state.get_pipeline_model_parallel_rank(),
        data_rank=parallel_state.get_data_parallel_rank(with_context_parallel=True),
    )


def dp_group() -> dist.ProcessGroup:
    """Megatron-core's data-parallel group, looked up at each use.

    Never kept on an object: gloo closes a group's sockets only once the group object
    is freed, so a reference that outlives a failure keeps peers waiting in a
    collective until the timeout instead of failing at once.
    """
    group: dist.ProcessGroup = parallel_state.get_data_parallel_group()
    return group


def flat_apply(tensors: Sequence[torch.Tensor], collective: Callable[[torch.Tensor], object]) -> None:
    """Run ``collective`` once on all of ``tensors`` flattened together, then copy the result back."""
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    collective(flat)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
