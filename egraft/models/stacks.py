"""Single-layer workloads: RMSNorm → Linear, and a LoRA-adapted Linear.

Both are small programs where the interesting rewrites move work onto
weights: the RMSNorm scale folds into the Linear weight, and the LoRA
product ``A @ B`` merges into ``W``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._common import RMSNorm, build_seeded


class RMSNormLinear(nn.Module):
    """``Linear(RMSNorm(x))``, bias-free. Input [batch, seq, hidden]."""

    def __init__(self, hidden: int, out: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden = hidden
        self.norm = RMSNorm(hidden, eps)
        self.proj = nn.Linear(hidden, out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class LoRALinear(nn.Module):
    """``y = x @ W^T + ((x @ A) @ B) * scaling``. Input [batch, seq, hidden].

    W is [out, in] (nn.Linear layout), A is [in, r], B is [r, out]. B is
    random, not zero as at the start of LoRA training, so the adapter
    contributes to the output.
    """

    params_stored_in_out = ("lora_A", "lora_B")

    def __init__(self, hidden: int, out: int, rank: int, alpha: float) -> None:
        super().__init__()
        self.hidden = hidden
        self.scaling = alpha / rank
        self.weight = nn.Parameter(torch.empty(out, hidden))
        self.lora_A = nn.Parameter(torch.empty(hidden, rank))
        self.lora_B = nn.Parameter(torch.empty(rank, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight) + ((x @ self.lora_A) @ self.lora_B) * self.scaling


def rmsnorm_linear(hidden: int = 32, out: int = 48, eps: float = 1e-6,
                   seed: int = 0) -> RMSNormLinear:
    return build_seeded(lambda: RMSNormLinear(hidden, out, eps), seed)


def lora_linear(hidden: int = 32, out: int = 48, rank: int = 4, alpha: float = 8.0,
                seed: int = 0) -> LoRALinear:
    return build_seeded(lambda: LoRALinear(hidden, out, rank, alpha), seed)
