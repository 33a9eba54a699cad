"""The check's eager reference on a CPU without half-precision matrix instructions: its bfloat16 and float16
matrix products computed as float32 products of the same values, rounded once.

``egraft.compile`` checks every program against the user's model run in
eager PyTorch.  On a CPU whose oneDNN has no bfloat16 (float16) path
(``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` false: AVX2 hosts such as
AMD Zen 3), PyTorch's half-precision matrix product is a slow generic loop:
one forward pass of a 494 M-parameter model in bfloat16 over 256 tokens
takes 25.7 s on one Zen 3 core, against 5.1 s with its products done as
below, and that one check was a fifth of the whole compile.

PyTorch's CPU kernel forms each product's sums in float32 and rounds the
result to the half type once (``addmm`` adds the bias before that
rounding).  :class:`FloatProducts` computes the same thing with float32's
fast kernel: the half operands (exact in float32) upcast, the product in
float32, the result rounded to the half type.  The two differ only in the
order of the float32 sums, which the check's dtype-aware tolerances
already allow for.  Only ``mm``, ``addmm``, ``bmm`` and ``baddbmm`` of
half-precision CPU tensors with at least :data:`MIN_ROWS` rows change
(upcasting the weight costs more than a few-row product saves); every other
operation of the model runs as PyTorch runs it.  ``EGRAFT_EAGER_HALF=1``
keeps PyTorch's own kernel.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..env import flag

MIN_ROWS = 8
ENV_VAR = "EGRAFT_EAGER_HALF"
_HALF = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}
_aten = torch.ops.aten
_PRODUCTS = {_aten.mm.default: 0, _aten.bmm.default: 0, _aten.addmm.default: 1, _aten.baddbmm.default: 1}


def slow_half_products(dtype: torch.dtype) -> bool:
    """Whether this CPU's PyTorch lacks a fast `dtype` matrix product (oneDNN says it has none); False for a
    dtype that is not half precision, or where torch cannot tell."""
    name = _HALF.get(dtype)
    try:
        return name is not None and not bool(getattr(torch.ops.mkldnn, name)())
    except (AttributeError, RuntimeError):
        return False


class FloatProducts(TorchDispatchMode):
    """Half-precision matrix products of CPU tensors computed in float32 and rounded once (module docstring)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = _PRODUCTS.get(func)
        if first is not None and not kwargs:
            ts = args[first:first + 2]
            dt = ts[0].dtype
            if (dt in _HALF and all(isinstance(a, torch.Tensor) and a.dtype == dt and a.device.type == "cpu"
                                    for a in args[:first + 2]) and ts[0].shape[-2] >= MIN_ROWS):
                return func(*(a.float() if isinstance(a, torch.Tensor) else a for a in args)).to(dt)
        return func(*args, **kwargs)


def float_products_for(model: torch.nn.Module):
    """A context in which `model`'s eager run computes its half-precision products in float32 where this CPU
    lacks a fast kernel for them (its parameters' and buffers' half dtypes); a no-op otherwise."""
    dts = {t.dtype for t in list(model.parameters()) + list(model.buffers()) if t.dtype in _HALF}
    if flag(ENV_VAR, False) or not any(slow_half_products(d) for d in dts):
        return contextlib.nullcontext()
    return FloatProducts()


__all__ = ["ENV_VAR", "FloatProducts", "MIN_ROWS", "float_products_for", "slow_half_products"]
