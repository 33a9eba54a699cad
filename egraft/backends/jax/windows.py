"""Sliding-window peepholes in JAX: convolution and pooling as one XLA op.

Which reductions are convolutions or pools is decided backend-neutrally
(:mod:`egraft.backends.window_match`); here the plans become
``lax.conv_general_dilated`` / ``lax.reduce_window``, which are faster than
the literal lowering (a stack of slices feeding a dot) and never materialise
the im2col columns.  The op's result is read back through the plan's
``out_view`` (realised with ``rules.realise_view``: free transposes/reshapes).
"""

from __future__ import annotations

import numpy as np

from ...ir.shapes import contiguous_strides
from ..window_match import AxisMap, ConvPlan, PoolPlan, axis_map, conv_plan, peel_pads, pool_plan, reduce_chain

__all__ = [
    "AxisMap", "ConvPlan", "PoolPlan", "axis_map", "conv_plan", "emit_conv", "emit_pool", "peel_pads", "pool_plan",
    "reduce_chain",
]


def emit_conv(ctx, plan: ConvPlan, x, w, view_fn):
    from jax import lax

    from .rules import compute_f32

    dt = ctx.jdt(plan.dtype)
    shape, strides, offset = plan.w_view
    w = view_fn(w, shape, strides, offset)
    w = w.reshape((shape[0] * shape[1],) + tuple(shape[2:]))
    x, w = compute_f32(x.astype(dt)), compute_f32(w.astype(dt))
    r = x.ndim
    dn = lax.ConvDimensionNumbers(tuple(range(r)), tuple(range(r)), tuple(range(r)))
    y = lax.conv_general_dilated(
        x, w, window_strides=plan.strides, padding=plan.padding, rhs_dilation=plan.dilation,
        dimension_numbers=dn, feature_group_count=plan.groups, precision=ctx.precision)
    ctx.stats["peephole_convs"] += 1
    return _finish(y, plan, view_fn)


def emit_pool(ctx, plan: PoolPlan, x, view_fn):
    import jax.numpy as jnp
    from jax import lax

    from .rules import compute_f32

    x = x.astype(ctx.jdt(plan.dtype))
    if plan.kind == "sum":
        x = compute_f32(x)
        init, op = np.array(0, x.dtype), lax.add
    else:
        init = np.array(-np.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min, x.dtype)
        op = lax.max
    y = lax.reduce_window(x, init, op, plan.window, plan.strides, plan.padding, window_dilation=plan.dilation)
    ctx.stats["peephole_pools"] += 1
    return _finish(y, plan, view_fn)


def _finish(y, plan, view_fn):
    import jax.numpy as jnp

    shape, strides, offset = plan.out_view
    if tuple(y.shape) != tuple(shape) or tuple(strides) != tuple(contiguous_strides(shape)) or offset:
        y = view_fn(y, shape, strides, offset)
    return jnp.reshape(y, plan.out_shape)
