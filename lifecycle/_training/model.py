"""The default model and data: a tiny causal language model on synthetic token sequences.

Plain torch, so it trains on CPU (megatron-core's GPT attention needs CUDA); Megatron-core
still provides the parallel state around it. The data is a deterministic function of
(seed, split, index): nothing random is carried between steps, so a resumed run sees
exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lifecycle._training.config import ModelConfig, PretrainConfig

MAX_STRIDE = 4
"""Sequences step through the vocabulary by a stride in 1..MAX_STRIDE."""

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


class _Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Causal self-attention then MLP, each pre-normed and residual: ``(batch, seq, hidden)`` in and out."""
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).unbind(dim=2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class TinyCausalLM(nn.Module):
    """Token + position embeddings, ``num_layers`` transformer blocks, a linear head: logits [b, s, vocab]."""

    def __init__(self, config: ModelConfig) -> None:
        """Build the model with torch's default initialization (seed the RNG first for identical replicas)."""
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = nn.Embedding(config.seq_length, config.hidden_size)
        self.blocks = nn.ModuleList(_Block(config.hidden_size, config.num_heads) for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.hidden_size)
        self.head = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Return next-token logits for ``tokens`` [batch, seq]."""
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def default_model_provider(config: PretrainConfig) -> nn.Module:
    """Build the default ``TinyCausalLM`` from ``config.model`` (a ``PretrainConfig``)."""
    return TinyCausalLM(config.model)


def default_forward_step(batch: Batch, model: nn.Module) -> torch.Tensor:
    """Mean next-token cross-entropy of ``model`` on ``batch`` (``tokens``, ``labels``): a scalar tensor."""
    logits = model(batch["tokens"])
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
