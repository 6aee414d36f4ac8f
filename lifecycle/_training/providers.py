"""What a caller hands ``pretrain``: the model, its batches and its loss, as ``typing.Protocol`` s.

Standard library only at run time (``torch`` is imported for the type checker alone), so
``import lifecycle`` stays torch-free. Any plain function, lambda or callable object
with these call signatures satisfies them; nothing needs to inherit from them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from lifecycle._training.config import PretrainConfig

__all__ = ["BatchProvider", "ForwardStepFunc", "ModelProvider"]


class ModelProvider(Protocol):
    """``model_provider(config) -> torch.nn.Module``: builds this rank's model, once per ``pretrain`` call.

    Called on every rank after ``torch.manual_seed(config.training.seed)``, with the
    whole ``PretrainConfig`` (``lambda: MyModel()`` fails with a ``TypeError``: write
    ``lambda config: MyModel()``). With a tensor-parallel size above 1 the model shards
    itself with megatron-core's tensor-parallel layers, or every rank holds a full copy.
    """

    def __call__(self, config: PretrainConfig, /) -> torch.nn.Module:
        """Return the model for this rank (on the CPU: ``pretrain`` moves it to the rank's device)."""
        ...


class BatchProvider(Protocol):
    """``batch_provider(split, index) -> batch``: micro-batch ``index`` of ``split`` (``"train"`` or ``"eval"``).

    A pure function of its arguments: each data-parallel rank asks for different
    indices, and a resumed run asks for exactly the ones an uninterrupted run would.
    The batch is whatever the ``ForwardStepFunc`` takes; a dict with a ``"tokens"``
    tensor gives the progress log its tokens/s.
    """

    def __call__(self, split: str, index: int, /) -> Any:
        """Return micro-batch ``index`` of ``split``."""
        ...


class ForwardStepFunc(Protocol):
    """``forward_step_func(batch, model) -> loss``: the scalar loss of one micro-batch.

    ``pretrain`` does the rest: ``backward()``, the gradient average over the
    data-parallel group, the optimizer step.
    """

    def __call__(self, batch: Any, model: torch.nn.Module, /) -> torch.Tensor:
        """Return a scalar tensor to call ``backward()`` on."""
        ...
