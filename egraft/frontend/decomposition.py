"""The decomposition table the tracer lowers with: core ATen, minus the mid-level ops egraft lowers whole."""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten

# Mid-level ops kept out of the core-ATen decomposition: their rules write the
# primitive forms of egraft's idioms (Attention, Softmax, LayerNorm, RMSNorm)
# and of GELU/SiLU, instead of torch's longer decompositions (e.g. SDPA's
# ~25-op math path with its masked-row guard).
KEEP_WHOLE = (
    aten.scaled_dot_product_attention,
    aten.layer_norm, aten.native_layer_norm,
    aten.rms_norm,
    aten.softmax, aten._softmax, aten._safe_softmax,
    aten.log_softmax, aten._log_softmax,
    aten.gelu, aten.silu,
)


def decomposition_table() -> dict:
    """The core-ATen decomposition table minus :data:`KEEP_WHOLE` (a fresh copy each call)."""
    return dict(_decomposition_table())


@functools.lru_cache(maxsize=1)
def _decomposition_table() -> dict:
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    keep = set(KEEP_WHOLE)
    for op in list(table):
        if getattr(op, "overloadpacket", None) in keep:
            del table[op]
    return table
