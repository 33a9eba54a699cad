"""MLP workloads: a plain GELU MLP and the SwiGLU gated MLP of Llama."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._common import build_seeded, input_generator


class MLP(nn.Module):
    """Linear → GELU → Linear (→ GELU → Linear … for ``n_layers`` > 2). Input [batch, d]."""

    def __init__(self, d: int, hidden: int, d_out: int, n_layers: int = 2) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {n_layers}")
        dims = [d] + [hidden] * (n_layers - 1) + [d_out]
        self.d = d
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            if i > 0:
                x = F.gelu(x)
            x = layer(x)
        return x


class GatedMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, bias-free as in Llama. Input [batch, seq, hidden]."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def mlp(d: int = 32, hidden: int = 64, d_out: int | None = None, n_layers: int = 2,
        seed: int = 0) -> MLP:
    return build_seeded(lambda: MLP(d, hidden, d if d_out is None else d_out, n_layers), seed)


def mlp_inputs(model: MLP, batch: int, seq: int, seed: int) -> tuple[torch.Tensor, ...]:
    del seq  # a plain MLP takes [batch, d]
    return (torch.randn(batch, model.d, generator=input_generator(seed)),)


def gated_mlp(hidden: int = 32, intermediate: int = 64, seed: int = 0) -> GatedMLP:
    return build_seeded(lambda: GatedMLP(hidden, intermediate), seed)


def hidden_states_inputs(model: nn.Module, batch: int, seq: int,
                         seed: int) -> tuple[torch.Tensor, ...]:
    """One [batch, seq, model.hidden] float32 tensor: the input of every sequence workload."""
    return (torch.randn(batch, seq, model.hidden, generator=input_generator(seed)),)
