"""Tensor creation, dtype conversion, and the bookkeeping ops export leaves behind.

Creation ops take their shape and dtype from the exported node's
``meta['val']`` (the argument lists of ``full``/``zeros``/``new_*``/``*_like``
differ, the result type does not).  ``arange`` with integral start and step
is an ``Iota``; with fractional ones it is folded to a constant, computed in
float64 as torch does.
"""

from __future__ import annotations

import numpy as np

from ...ir import dtypes
from .table import lowering


def _const(ctx, value):
    return ctx.builder.constant(value, ctx.out_dtype, ctx.shape)


@lowering("aten.full")
def full(ctx, size, fill_value, **_):
    return _const(ctx, fill_value)


@lowering("aten.full_like", "aten.new_full")
def full_like(ctx, x, *args, **kwargs):
    value = args[-1] if ctx.op.startswith("aten.new_full") else args[0]
    return _const(ctx, value)


@lowering("aten.zeros", "aten.zeros_like", "aten.new_zeros", "aten.empty", "aten.empty_like", "aten.new_empty",
          "aten.empty_strided", "aten.new_empty_strided", "aten.empty_permuted")
def zeros(ctx, *args, **kwargs):
    """Zeros; ``empty`` is zeros too (its contents are unspecified, zeros are one valid choice)."""
    return _const(ctx, 0)


@lowering("aten.ones", "aten.ones_like", "aten.new_ones")
def ones(ctx, *args, **kwargs):
    return _const(ctx, 1)


@lowering("aten.scalar_tensor")
def scalar_tensor(ctx, s, **_):
    return _const(ctx, s)


@lowering("aten.arange")
def arange(ctx, *args, **_):
    nums = [a for a in args if isinstance(a, (int, float))]
    start, step = (0, 1) if len(nums) == 1 else (nums[0], nums[2] if len(nums) > 2 else 1)
    n = ctx.shape[0]
    dt = ctx.out_dtype
    if float(start) == int(start) and float(step) == int(step) and n < 2 ** 24:
        i = ctx.builder.iota(n, "int64")
        if step != 1:
            i = i * int(step)
        if start != 0:
            i = i + int(start)
        return i.cast(dt)
    values = float(start) + float(step) * np.arange(n, dtype=np.float64)
    return ctx.builder.tensor_constant(values.astype(dtypes.to_numpy(dt)))


@lowering("aten._to_copy", "aten.type_as")
def to_copy(ctx, x, *args, **kwargs):
    return x.cast(ctx.out_dtype)


@lowering("aten._assert_tensor_metadata")
def assertion(ctx, *args, **kwargs):
    """Checks export inserts; shapes and dtypes are static and checked by the driver, so they lower to nothing."""
    return None
