"""Llama style decoder block: RMSNorm, rotary GQA attention, SwiGLU MLP.

The rotary cos/sin tables are computed in ``forward`` from positions (as
Hugging Face's rotary embedding does), so a traced graph contains the
iota → outer product → sin/cos path, not constant tables.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import RMSNorm, build_seeded
from .attention import Attention
from .mlp import GatedMLP


class LlamaBlock(nn.Module):
    """``x + attn(norm(x))``, then ``x + mlp(norm(x))``. Input [batch, seq, hidden]."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, intermediate: int,
                 rope_theta: float = 10000.0, eps: float = 1e-6,
                 kv_expand: str = "expand") -> None:
        super().__init__()
        self.hidden = hidden
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(hidden, heads, kv_heads, rope=True, rope_theta=rope_theta,
                                   kv_expand=kv_expand)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = GatedMLP(hidden, intermediate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


def llama_block(hidden: int = 32, heads: int = 4, kv_heads: int = 2, intermediate: int = 64,
                rope_theta: float = 10000.0, eps: float = 1e-6, kv_expand: str = "expand",
                seed: int = 0) -> LlamaBlock:
    return build_seeded(
        lambda: LlamaBlock(hidden, heads, kv_heads, intermediate, rope_theta, eps, kv_expand),
        seed)
