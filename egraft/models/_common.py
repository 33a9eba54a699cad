"""Shared building blocks for the reference models.

The models are plain ``torch.nn.Module``s with no egraft imports: they are
what a user would hand to egraft, so they stay ordinary PyTorch.

Initialisation is deliberately *not* PyTorch's default: weights are drawn
with std 1/sqrt(fan_in) (activations stay O(1) at any width, so numeric
comparisons are meaningful), and 1-D parameters (norm scales, biases) are
random around their neutral value, so a rewrite that wrongly drops a norm
weight or a bias changes the output and is caught.
"""

from __future__ import annotations

import math
from typing import Callable, TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


class RMSNorm(nn.Module):
    """RMSNorm written out explicitly (no ``F.rms_norm``), as Llama does it."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _randomise_(module: nn.Module, gen: torch.Generator) -> None:
    """Re-draw every parameter (and BatchNorm statistics) from ``gen``."""
    with torch.no_grad():
        for m in module.modules():
            # a module may list parameters stored [in, out] (e.g. LoRA A, B)
            in_first = getattr(m, "params_stored_in_out", ())
            for leaf, p in m.named_parameters(recurse=False):
                if p.dim() >= 2:
                    # Linear [out, in]; conv [out, in, kh, kw]
                    fan_in = p.shape[0] if leaf in in_first else p[0].numel()
                    p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
                elif leaf == "bias":
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))
                else:  # norm scales
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(0.2 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(
                    0.5 + torch.rand(m.running_var.shape, generator=gen)
                )


def build_seeded(ctor: Callable[[], M], seed: int) -> M:
    """Construct ``ctor()``, randomise it from ``seed``, return it in eval mode, float32.

    Construction runs inside ``fork_rng`` so the caller's global RNG state is
    untouched; all values come from a private generator, so the same seed
    gives bit-identical weights.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = ctor()
    gen = torch.Generator().manual_seed(seed)
    _randomise_(module, gen)
    return module.float().eval()


def input_generator(seed: int) -> torch.Generator:
    # offset so inputs are not drawn from the same stream as the weights
    return torch.Generator().manual_seed(1_000_003 + seed)
