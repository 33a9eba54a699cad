"""GPT-2 style pre-LayerNorm transformer block, and a stack of them.

Mirrors Hugging Face's GPT-2 layout (fused ``c_attn`` QKV projection,
``c_proj``, ``mlp.c_fc``/``mlp.c_proj``, GELU with tanh approximation) but
uses ``nn.Linear`` (HF uses a transposed Conv1D) and
``F.scaled_dot_product_attention(is_causal=True)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._common import build_seeded, input_generator


class GPT2Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"heads must divide hidden, got hidden={hidden} heads={heads}")
        self.hidden, self.heads, self.head_dim = hidden, heads, hidden // heads
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.c_attn(x).split(self.hidden, dim=2)
        q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(o.transpose(1, 2).reshape(b, s, self.hidden))


class GPT2MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(hidden, intermediate)
        self.c_proj = nn.Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    """``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``. Input [batch, seq, hidden]."""

    def __init__(self, hidden: int, heads: int, mlp_ratio: int = 4, eps: float = 1e-5) -> None:
        super().__init__()
        self.hidden = hidden
        self.ln_1 = nn.LayerNorm(hidden, eps=eps)
        self.attn = GPT2Attention(hidden, heads)
        self.ln_2 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = GPT2MLP(hidden, mlp_ratio * hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Stack(nn.Module):
    """``n_layers`` GPT-2 blocks and a final LayerNorm.

    Input: hidden states [batch, seq, hidden], or, with ``vocab`` set, token
    ids [batch, seq] (int64) through token + learned position embeddings.
    """

    def __init__(self, n_layers: int, hidden: int, heads: int, mlp_ratio: int = 4,
                 eps: float = 1e-5, vocab: int | None = None, max_positions: int = 1024) -> None:
        super().__init__()
        self.hidden, self.vocab = hidden, vocab
        if vocab is not None:
            self.wte = nn.Embedding(vocab, hidden)
            self.wpe = nn.Embedding(max_positions, hidden)
        self.h = nn.ModuleList(GPT2Block(hidden, heads, mlp_ratio, eps) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.vocab is not None:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.wte(x) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


def gpt2_block(hidden: int = 32, heads: int = 4, mlp_ratio: int = 4, eps: float = 1e-5,
               seed: int = 0) -> GPT2Block:
    return build_seeded(lambda: GPT2Block(hidden, heads, mlp_ratio, eps), seed)


def gpt2_stack(n_layers: int = 2, hidden: int = 32, heads: int = 4, mlp_ratio: int = 4,
               eps: float = 1e-5, vocab: int | None = None, max_positions: int = 1024,
               seed: int = 0) -> GPT2Stack:
    return build_seeded(
        lambda: GPT2Stack(n_layers, hidden, heads, mlp_ratio, eps, vocab, max_positions), seed)


def gpt2_stack_inputs(model: GPT2Stack, batch: int, seq: int,
                      seed: int) -> tuple[torch.Tensor, ...]:
    gen = input_generator(seed)
    if model.vocab is not None:
        return (torch.randint(0, model.vocab, (batch, seq), generator=gen),)
    return (torch.randn(batch, seq, model.hidden, generator=gen),)
