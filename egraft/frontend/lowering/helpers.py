"""Small IR idioms the lowering rules share: IEEE-correct comparisons, promotion, axes.

The builder's ``eq``/``<=`` are exact on integers but treat NaN as equal to
everything; torch follows IEEE (NaN compares unequal, and propagates through
``maximum``).  The float versions here add the NaN checks torch's semantics
need, and keep the cheap builder forms for integers and bools.
"""

from __future__ import annotations

import math
from typing import Sequence

from ...ir import dtypes, shapes
from ...ir.builder import Tensor


def operands(ctx, a, b, kind: str = "DEFAULT", dtype: str | None = None) -> tuple[Tensor, Tensor]:
    """``a`` and ``b`` (Tensors or python scalars) as Tensors of torch's promoted dtype, broadcast."""
    dt = dtype or ctx.promote(a, b, kind=kind)
    ref = a if isinstance(a, Tensor) else b
    A = a.cast(dt) if isinstance(a, Tensor) else ctx.builder.constant(a, dt)
    B = b.cast(dt) if isinstance(b, Tensor) else ctx.builder.constant(b, dt)
    shape = shapes.broadcast_shapes(A.shape, B.shape) if isinstance(ref, Tensor) else ()
    return A.expand(shape), B.expand(shape)


def isnan(x: Tensor) -> Tensor:
    if not dtypes.is_float(x.dtype):
        return x.builder.constant(False, "bool", x.shape)
    # NaN is the only value neither below +inf nor above -inf
    return ~(x < math.inf) & ~(x > -math.inf)


def eq(a: Tensor, b: Tensor) -> Tensor:
    e = ~(a < b) & ~(b < a)
    if dtypes.is_float(a.dtype):
        e = e & ~isnan(a) & ~isnan(b)
    return e


def lt(a: Tensor, b: Tensor) -> Tensor:
    return a < b


def le(a: Tensor, b: Tensor) -> Tensor:
    if dtypes.is_float(a.dtype):
        return (a < b) | eq(a, b)
    return ~(b < a)


def maximum(a: Tensor, b: Tensor) -> Tensor:
    """torch.maximum: NaN in either operand gives NaN."""
    out = Tensor.where(a < b, b, a)
    return Tensor.where(isnan(b), b, out) if dtypes.is_float(a.dtype) else out


def minimum(a: Tensor, b: Tensor) -> Tensor:
    out = Tensor.where(b < a, b, a)
    return Tensor.where(isnan(b), b, out) if dtypes.is_float(a.dtype) else out


def log1p(x: Tensor) -> Tensor:
    """log(1+x), correcting the rounding of 1+x by x/((1+x)-1) (Goldberg's trick); log1p(inf) is inf."""
    u = x + 1.0
    d = u - 1.0
    r = Tensor.where(eq(d, x.builder.constant(0.0, x.dtype, x.shape)), x, u.log() * (x / d))
    return Tensor.where(eq(u, x.builder.constant(math.inf, x.dtype, x.shape)), u, r)


def axes(dim, rank: int) -> tuple[int, ...]:
    """torch's dim argument (None, [] = all; int; list) as sorted non-negative axes."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(rank))
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(sorted({shapes.normalize_axis(d, max(rank, 1)) for d in dim}))


def keep_shape(shape: Sequence[int], ax: Sequence[int]) -> tuple[int, ...]:
    return tuple(1 if i in ax else n for i, n in enumerate(shape))


def int_pow(x: Tensor, n: int) -> Tensor:
    """x**n for an integer n >= 0 by repeated squaring (exact sign, log n multiplies)."""
    result = None
    base = x
    while n:
        if n & 1:
            result = base if result is None else result * base
        n >>= 1
        if n:
            base = base * base
    return result if result is not None else x.builder.constant(1, x.dtype, x.shape)


def round_half_even(x: Tensor) -> Tensor:
    """torch.round: nearest integer, ties to even; values >= 2**52 (or 2**23 in float32) are already integers."""
    r = (x + 0.5).floor()
    tie = eq(r - x, x.builder.constant(0.5, x.dtype, x.shape))
    odd = ~eq(r % 2.0, x.builder.constant(0.0, x.dtype, x.shape))
    r = Tensor.where(tie & odd, r - 1, r)
    r = Tensor.where(eq(r, x.builder.constant(0.0, x.dtype, x.shape)), x * 0.0, r)  # round(-0.3) is -0.0, as in torch
    big = 1.0 / dtypes.row(x.dtype).eps  # 2**52 in float64: the spacing there is 1
    return Tensor.where(~(x.abs() < big), x, r)
