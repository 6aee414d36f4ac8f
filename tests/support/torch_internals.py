"""The suite's one door to lifecycle's private modules that import torch (see ``support.internals``).

What the distributed tests reach behind the public names: the store lifecycle hosts
(``HOSTED``, ``open_store``), the module whose ``open_store`` a test replaces to count
calls, and pretrain's own default model and batches.
"""

from __future__ import annotations

from lifecycle._torch import actions, store
from lifecycle._training import model

__all__ = [
    "HOSTED",
    "SyntheticTokens",
    "actions",
    "default_forward_step",
    "default_model_provider",
    "job_store",
    "open_store",
]

HOSTED = store.HOSTED
job_store = store.job_store
"""The store servers lifecycle hosts in this process (``lifecycle._torch.store``)."""
open_store = store.open_store
SyntheticTokens = model.SyntheticTokens
"""pretrain's default batches."""
default_model_provider = model.default_model_provider
"""pretrain's default model."""
default_forward_step = model.default_forward_step
"""pretrain's default forward step."""
