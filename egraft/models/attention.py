"""Attention workloads: grouped-query attention and its variants.

One ``Attention`` module covers the variants through constructor flags, so
each registry entry is a small, readable configuration of it:

- ``gqa_attention``: n_kv_heads < n_heads, causal SDPA.
- ``qknorm_attention``: Q and K RMS-normalised per head (Qwen3 / OLMo-2 style).
- ``mask_attention``: an explicit ``attn_mask`` input (boolean or additive)
  instead of ``is_causal``.
- the Llama block uses it with rotary embeddings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._common import RMSNorm, build_seeded, input_generator

KV_EXPANDS = ("repeat_interleave", "expand")
MASK_KINDS = (None, "bool", "additive")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    """Multi-head attention with optional GQA, QK-norm, rotary embeddings and explicit mask.

    Input ``x`` [batch, seq, hidden]; with ``mask`` set, also ``attn_mask``
    [batch, 1, seq, seq] (bool: True = attend; additive: 0 or -inf).
    """

    def __init__(self, hidden: int, heads: int, kv_heads: int | None = None, *,
                 qk_norm: bool = False, rope: bool = False, rope_theta: float = 10000.0,
                 kv_expand: str = "repeat_interleave", mask: str | None = None,
                 bias: bool = False, eps: float = 1e-6) -> None:
        super().__init__()
        kv_heads = heads if kv_heads is None else kv_heads
        if hidden % heads or heads % kv_heads:
            raise ValueError(f"need heads | hidden and kv_heads | heads, got "
                             f"hidden={hidden} heads={heads} kv_heads={kv_heads}")
        if kv_expand not in KV_EXPANDS:
            raise ValueError(f"kv_expand must be one of {KV_EXPANDS}, got {kv_expand!r}")
        if mask not in MASK_KINDS:
            raise ValueError(f"mask must be one of {MASK_KINDS}, got {mask!r}")
        self.hidden, self.heads, self.kv_heads = hidden, heads, kv_heads
        self.head_dim = hidden // heads
        if rope and self.head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, got {self.head_dim}")
        self.kv_expand, self.mask = kv_expand, mask
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps) if qk_norm else None
        self.rope = rope
        if rope:
            exponent = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
            self.register_buffer("inv_freq", 1.0 / (rope_theta ** exponent), persistent=False)

    def _expand_kv(self, t: torch.Tensor) -> torch.Tensor:
        n_rep = self.heads // self.kv_heads
        if n_rep == 1:
            return t
        if self.kv_expand == "repeat_interleave":
            return t.repeat_interleave(n_rep, dim=1)
        b, kv, s, d = t.shape  # Hugging Face's repeat_kv
        return t[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)

    def _rotary(self, seq: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(seq, device=like.device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(like.dtype), emb.sin().to(like.dtype)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        if (attn_mask is None) != (self.mask is None):
            raise ValueError("pass attn_mask exactly when the module was built with mask=...")
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.rope:
            cos, sin = self._rotary(s, x)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k, v = self._expand_kv(k), self._expand_kv(v)
        if self.mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


def gqa_attention(hidden: int = 32, heads: int = 4, kv_heads: int = 2,
                  kv_expand: str = "repeat_interleave", seed: int = 0) -> Attention:
    return build_seeded(lambda: Attention(hidden, heads, kv_heads, kv_expand=kv_expand), seed)


def qknorm_attention(hidden: int = 32, heads: int = 4, kv_heads: int = 2,
                     seed: int = 0) -> Attention:
    return build_seeded(lambda: Attention(hidden, heads, kv_heads, qk_norm=True), seed)


def mask_attention(hidden: int = 32, heads: int = 4, kv_heads: int = 2,
                   mask: str = "bool", seed: int = 0) -> Attention:
    if mask is None:
        raise ValueError("mask_attention needs mask='bool' or 'additive'")
    return build_seeded(lambda: Attention(hidden, heads, kv_heads, mask=mask), seed)


def attention_mask(batch: int, seq: int, kind: str,
                   gen: torch.Generator) -> torch.Tensor:
    """A causal mask with ~20% of the past randomly dropped, per batch row.

    The diagonal is always allowed, so no query row is fully masked (SDPA
    would give NaN there, which is torch's behaviour, not a workload).
    """
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    keep = torch.rand(batch, 1, seq, seq, generator=gen) < 0.8
    allowed = (causal & keep) | torch.eye(seq, dtype=torch.bool)
    if kind == "bool":
        return allowed
    if kind == "additive":
        return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    raise ValueError(f"mask kind must be 'bool' or 'additive', got {kind!r}")


def mask_attention_inputs(model: Attention, batch: int, seq: int,
                          seed: int) -> tuple[torch.Tensor, ...]:
    gen = input_generator(seed)
    x = torch.randn(batch, seq, model.hidden, generator=gen)
    return x, attention_mask(batch, seq, model.mask, gen)
