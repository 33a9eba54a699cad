"""Activations and clamps: relu, gelu, silu, leaky_relu, elu/selu, hardtanh, clamp (NaN-preserving bounds).

The rules are written with the builder's comparisons and ``Where`` so NaN
and signed zeros come out as torch gives them (checked by the special-value
tests of every lowering rule).
"""

from __future__ import annotations

from ...ir.builder import Tensor
from . import helpers as h
from .table import lowering


@lowering("aten.relu")
def relu(ctx, x):
    zero = x.builder.constant(0, x.dtype, x.shape)
    return Tensor.where(x < 0, zero, x)  # NaN stays NaN


@lowering("aten.gelu", upcast=True)
def gelu(ctx, x, approximate="none"):
    return x.gelu(approximate)


@lowering("aten.silu", upcast=True)
def silu(ctx, x):
    return x.silu()


@lowering("aten.leaky_relu")
def leaky_relu(ctx, x, negative_slope=0.01):
    return Tensor.where(x > 0, x, x * negative_slope)


@lowering("aten.elu", upcast=True)
def elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    neg = ((x * input_scale).exp() - 1.0) * alpha
    out = Tensor.where(x < 0, neg, x)  # elu(-0.0) is -0.0, nan stays nan
    return out * scale if scale != 1.0 else out


@lowering("aten.hardtanh")
def hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return x.clamp(min_val, max_val)


@lowering("aten.clamp", "aten.clip")
def clamp(ctx, x, min=None, max=None):
    dt = ctx.promote(x, min, max)
    out = x.cast(dt)
    # where(x < lo, lo, x): a NaN x stays NaN; a NaN bound gives NaN, as in torch
    if min is not None:
        lo = ctx.tensor(min, dt)
        out = Tensor.where(out < lo, lo, out)
        out = Tensor.where(h.isnan(lo), lo, out) if isinstance(min, Tensor) else out
    if max is not None:
        hi = ctx.tensor(max, dt)
        out = Tensor.where(hi < out, hi, out)
        out = Tensor.where(h.isnan(hi), hi, out) if isinstance(max, Tensor) else out
    return out


@lowering("aten.clamp_min")
def clamp_min(ctx, x, min):
    return clamp(ctx, x, min, None)


@lowering("aten.clamp_max")
def clamp_max(ctx, x, max):
    return clamp(ctx, x, None, max)
