"""The default model and data: a tiny causal language model, tensor-parallel, on synthetic token sequences.

The model is built from megatron-core's tensor-parallel layers (vocabulary-parallel
embedding and loss, column- and row-parallel projections), so with
``tensor_model_parallel_size`` T each rank of a tensor-parallel group holds 1/T of every
projection and of the embedding and output head, and a block's heads are split across
the group. They run on CPU with gloo (megatron-core's ``GPTModel`` attention needs CUDA,
so the attention here is torch's). Weights are drawn on CPU from the full-size master
weight (``use_cpu_initialization``), so a model of any tensor-parallel size starts from
the same weights as the one of size 1 with the same seed. The data is a deterministic
function of (seed, split, index): nothing random is carried between steps, so a resumed
run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core import ModelParallelConfig
from megatron.core.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)
from torch import nn

from lifecycle._training.config import ModelConfig, PretrainConfig

MAX_STRIDE = 4
"""Sequences step through the vocabulary by a stride in 1..MAX_STRIDE."""

INIT_STD = 0.02
"""Standard deviation of the normal initialization of every projection and embedding."""

Batch = dict[str, torch.Tensor]


class SyntheticTokens:
    """Arithmetic progressions modulo the vocabulary: ``x[t] = (a + b * t) % vocab_size``.

    The start ``a`` is random and the stride ``b`` random in 1..``MAX_STRIDE``, so the
    first token is unpredictable, the second narrows to ``MAX_STRIDE`` choices, and the
    rest follow from the two before: a small model's loss falls fast and clearly.
    The held-out ``"eval"`` split holds the sequences starting at a multiple of 8, which
    the ``"train"`` split never produces. ``batch(split, index)`` is a pure function.
    """

    def __init__(self, model: ModelConfig, micro_batch_size: int, seed: int) -> None:
        """Draw batches of ``micro_batch_size`` sequences of ``model.seq_length`` tokens."""
        self.vocab_size = model.vocab_size
        self.seq_length = model.seq_length
        self.micro_batch_size = micro_batch_size
        self.seed = seed

    def batch(self, split: str, index: int) -> Batch:
        """Return micro-batch ``index`` of ``split`` (``"train"`` or ``"eval"``): tokens and next-token labels."""
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        # Distinct generator seeds for every (seed, split, index) below 2**40 batches.
        generator = torch.Generator().manual_seed(((self.seed * 2 + (split == "eval")) << 40) + index)
        n, v = self.micro_batch_size, self.vocab_size
        if split == "eval":
            start = 8 * torch.randint(0, v // 8, (n, 1), generator=generator)
        else:
            # Maps 0 .. v*7/8-1 onto the non-multiples of 8: 1..7, 9..15, ...
            k = torch.randint(0, v - v // 8, (n, 1), generator=generator)
            start = k + k // 7 + 1
        stride = torch.randint(1, MAX_STRIDE + 1, (n, 1), generator=generator)
        seq = (start + stride * torch.arange(self.seq_length + 1)) % v
        return {"tokens": seq[:, :-1], "labels": seq[:, 1:]}


def _init(weight: torch.Tensor) -> None:
    nn.init.normal_(weight, mean=0.0, std=INIT_STD)


def _parallel_config(tensor_parallel: int) -> ModelParallelConfig:
    # CPU initialization: the full master weight is drawn from torch's default generator on
    # every rank and each keeps its slice, so any tensor-parallel size starts from the same
    # weights. No gradient-accumulation fusion: it needs a CUDA extension.
    return ModelParallelConfig(
        tensor_model_parallel_size=tensor_parallel,
        use_cpu_initialization=True,
        gradient_accumulation_fusion=False,
        perform_initialization=True,
        params_dtype=torch.float32,
    )


class _Block(nn.Module):
    """Pre-norm transformer block: causal self-attention over this rank's heads, then an MLP over its slice."""

    def __init__(self, hidden: int, heads: int, parallel: ModelParallelConfig) -> None:
        super().__init__()
        tp = parallel.tensor_model_parallel_size
        self.local_heads, self.head_dim = heads // tp, hidden // heads
        self.norm1 = nn.LayerNorm(hidden)
        # Output features ordered (head, q/k/v, head_dim): a contiguous slice holds whole heads.
        self.qkv = ColumnParallelLinear(hidden, 3 * hidden, config=parallel, init_method=_init, gather_output=False)
        self.proj = RowParallelLinear(
            hidden, hidden, config=parallel, init_method=_init, bias=True, input_is_parallel=True, skip_bias_add=False
        )
        self.norm2 = nn.LayerNorm(hidden)
        self.fc1 = ColumnParallelLinear(hidden, 4 * hidden, config=parallel, init_method=_init, gather_output=False)
        self.fc2 = RowParallelLinear(
            4 * hidden,
            hidden,
            config=parallel,
            init_method=_init,
            bias=True,
            input_is_parallel=True,
            skip_bias_add=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Causal self-attention then MLP, each pre-normed and residual: ``(batch, seq, hidden)`` in and out."""
        b, s, _ = x.shape
        qkv, _ = self.qkv(self.norm1(x))
        q, k, v = qkv.view(b, s, self.local_heads, 3, self.head_dim).unbind(dim=3)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        out, _ = self.proj(attn.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim))
        x = x + out
        hidden, _ = self.fc1(self.norm2(x))
        out, _ = self.fc2(F.gelu(hidden))
        result: torch.Tensor = x + out
        return result


class TinyCausalLM(nn.Module):
    """Vocabulary-parallel embedding, position embedding, ``num_layers`` blocks, a vocabulary-parallel head.

    Returns this rank's slice of the logits, ``[batch, seq, vocab_size / T]``; pair it
    with ``vocab_parallel_cross_entropy`` (as ``default_forward_step`` does). Needs
    megatron-core's model-parallel state (``pretrain`` creates it before the model).
    Layer norms, the position embedding and the row-parallel biases are replicated on
    every rank of the tensor-parallel group, and their gradients agree there.
    """

    def __init__(self, config: ModelConfig, tensor_parallel: int = 1) -> None:
        """Build the model for a tensor-parallel group of ``tensor_parallel`` ranks (seed the RNG first)."""
        super().__init__()
        config.check_tensor_parallel(tensor_parallel)
        parallel = _parallel_config(tensor_parallel)
        self.embed = VocabParallelEmbedding(config.vocab_size, config.hidden_size, init_method=_init, config=parallel)
        self.position = nn.Embedding(config.seq_length, config.hidden_size)
        _init(self.position.weight)
        self.blocks = nn.ModuleList(
            _Block(config.hidden_size, config.num_heads, parallel) for _ in range(config.num_layers)
        )
        self.norm = nn.LayerNorm(config.hidden_size)
        self.head = ColumnParallelLinear(
            config.hidden_size, config.vocab_size, config=parallel, init_method=_init, gather_output=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Return this rank's vocabulary slice of the next-token logits for ``tokens`` [batch, seq]."""
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits, _ = self.head(self.norm(x))
        result: torch.Tensor = logits
        return result


def default_model_provider(config: PretrainConfig) -> nn.Module:
    """Build the default ``TinyCausalLM`` from ``config.model``, split over the tensor-parallel size."""
    return TinyCausalLM(config.model, config.parallel.tensor_model_parallel_size)


def default_forward_step(batch: Batch, model: nn.Module) -> torch.Tensor:
    """Mean next-token cross-entropy of ``model`` on ``batch`` (``tokens``, ``labels``): a scalar tensor.

    ``model`` returns vocabulary-parallel logits (``TinyCausalLM``); the loss is reduced
    over the tensor-parallel group, so every rank of it gets the full loss.
    """
    logits = model(batch["tokens"])
    losses = vocab_parallel_cross_entropy(logits.float(), batch["labels"])
    loss: torch.Tensor = losses.mean()
    return loss
