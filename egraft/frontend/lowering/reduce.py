"""Reductions: sum, mean, max/min (with indices), arg-reductions, any/all, var, prod, cumsum, norms.

The IR reduces one axis at a time (``SumReduce``/``MaxReduce``); the
builder's ``sum``/``max`` chain them.  A 0-dim input reduces to itself, as in
torch.  Sums and means of half tensors accumulate in float32 (``upcast``),
matching torch's CPU kernels.
"""

from __future__ import annotations

import math

from ...ir import dtypes, shapes
from ...ir.builder import Tensor
from . import helpers as h
from .table import lowering


def _prep(ctx, x: Tensor, dtype) -> Tensor:
    """The operand in the result dtype (after the op's own `dtype=` cast, as torch applies it)."""
    return (x if dtype is None else x.cast(dtypes.from_torch(dtype))).cast(ctx.dtype)


def _operand(ctx, x: Tensor, dim, dtype) -> tuple[Tensor, tuple[int, ...] | None]:
    """The reduction's operand in its result dtype and the axes reduced (None: a 0-d operand, its own result)."""
    x = _prep(ctx, x, dtype)
    return x, (None if x.ndim == 0 else h.axes(dim, x.ndim))


@lowering("aten.sum", upcast=True)
def sum_(ctx, x, dim=None, keepdim=False, dtype=None):
    x, ax = _operand(ctx, x, dim, dtype)
    return x if ax is None else x.sum(ax, keepdim)


@lowering("aten.mean", upcast=True)
def mean(ctx, x, dim=None, keepdim=False, dtype=None):
    x, ax = _operand(ctx, x, dim, dtype)
    if ax is None:
        return x
    n = math.prod(x.shape[a] for a in ax)
    return x.sum(ax, keepdim) * (1.0 / n) if n else x.sum(ax, keepdim) * math.nan


@lowering("aten.prod", upcast=True)
def prod(ctx, x, dim=None, keepdim=False, dtype=None):
    x, ax = _operand(ctx, x, dim, dtype)
    if ax is None:
        return x
    out = x
    for a in sorted(ax, reverse=True):
        out = _prod_axis(out, a)
    return out.reshape(h.keep_shape(x.shape, ax)) if keepdim else out


def _prod_axis(x: Tensor, axis: int) -> Tensor:
    """Product over one axis as a tree of halvings (log n multiplies; no product primitive exists)."""
    n = x.shape[axis]
    if n == 0:
        return x.builder.constant(1, x.dtype, x.shape[:axis] + x.shape[axis + 1:])
    while x.shape[axis] > 1:
        n = x.shape[axis]
        half = n // 2
        lo, hi = x.slice(axis, 0, half), x.slice(axis, half, 2 * half)
        y = lo * hi
        if n % 2:
            y = _cat2(y, x.slice(axis, n - 1, n), axis)
        x = y
    return x.squeeze(axis)


def _cat2(a, b, axis):
    from ...ir.builder import cat

    return cat([a, b], axis)


def _minmax_all(x: Tensor, dim, keepdim, is_max: bool) -> Tensor:
    """max/min over ``dim``; MaxReduce propagates NaN as torch does, and min is -max(-x)."""
    if x.ndim == 0:
        return x
    ax = h.axes(dim, x.ndim)
    return x.max(ax, keepdim) if is_max else x.min(ax, keepdim)


@lowering("aten.amax")
def amax(ctx, x, dim=(), keepdim=False):
    return _minmax_all(x, dim, keepdim, True)


@lowering("aten.amin")
def amin(ctx, x, dim=(), keepdim=False):
    return _minmax_all(x, dim, keepdim, False)


def _arg(x: Tensor, axis: int, keepdim: bool, is_max: bool) -> Tensor:
    """First index of the max (min) along ``axis``; a NaN counts as the extreme, as in torch."""
    m = x.max(axis, keepdim=True) if is_max else x.min(axis, keepdim=True)
    n = x.shape[axis]
    idx = x.builder.iota(n, "int64").reshape(tuple(n if i == axis else 1 for i in range(x.ndim)))
    hit = h.eq(x, m.expand(x.shape))
    if dtypes.is_float(x.dtype):
        hit = hit | h.isnan(x)
    cand = Tensor.where(hit, idx.expand(x.shape), x.builder.constant(n, "int64", x.shape))
    return cand.min(axis, keepdim)


def _arg_rule(is_max):
    def rule(ctx, x, dim=None, keepdim=False):
        if x.ndim == 0:
            return x.builder.constant(0, "int64")
        if dim is None:
            out = _arg(x.reshape((-1,)), 0, False, is_max)
            return out.reshape((1,) * x.ndim) if keepdim else out
        return _arg(x, shapes.normalize_axis(dim, x.ndim), keepdim, is_max)
    return rule


lowering("aten.argmax")(_arg_rule(True))
lowering("aten.argmin")(_arg_rule(False))


def _minmax_dim(is_max):
    def rule(ctx, x, dim, keepdim=False):
        if x.ndim == 0:
            return x, x.builder.constant(0, "int64")
        axis = shapes.normalize_axis(dim, x.ndim)
        vals = x.max(axis, keepdim) if is_max else x.min(axis, keepdim)
        return vals, _arg(x, axis, keepdim, is_max)
    return rule


lowering("aten.max.dim")(_minmax_dim(True))
lowering("aten.min.dim")(_minmax_dim(False))


@lowering("aten.max.default")
def max_all(ctx, x):
    return _minmax_all(x, None, False, True)


@lowering("aten.min.default")
def min_all(ctx, x):
    return _minmax_all(x, None, False, False)


@lowering("aten.max.other")
def max_other(ctx, a, b):
    A, B = h.operands(ctx, a, b)
    return h.maximum(A, B)


@lowering("aten.min.other")
def min_other(ctx, a, b):
    A, B = h.operands(ctx, a, b)
    return h.minimum(A, B)


def _bool_reduce(is_any):
    def rule(ctx, x, dim=None, keepdim=False):
        bx = x if x.dtype == "bool" else ~h.eq(x, x.builder.constant(0, x.dtype, x.shape))
        if bx.ndim == 0:
            return bx
        ax = h.axes(dim, bx.ndim)
        return bx.max(ax, keepdim) if is_any else ~((~bx).max(ax, keepdim))
    return rule


lowering("aten.any")(_bool_reduce(True))
lowering("aten.all")(_bool_reduce(False))


def _correction(ctx, correction, unbiased):
    if correction is not None:
        return float(correction)
    return 1.0 if unbiased is None or unbiased else 0.0


def _var(x: Tensor, ax, correction: float, keepdim: bool):
    n = math.prod(x.shape[a] for a in ax)
    mu = x.sum(ax, keepdim=True) * (1.0 / n) if n else x.sum(ax, keepdim=True) * math.nan
    d = x - mu.expand(x.shape)
    denom = n - correction
    scale = 1.0 / denom if denom > 0 else math.nan
    return (d * d).sum(ax, keepdim) * scale, (mu if keepdim else mu.reshape(tuple(
        s for i, s in enumerate(mu.shape) if i not in ax)))


@lowering("aten.var", upcast=True)
def var(ctx, x, dim=None, unbiased=None, keepdim=False, correction=None):
    if isinstance(dim, bool):  # var.default(x, unbiased)
        dim, unbiased = None, dim
    x = x.cast(ctx.dtype)
    return _var(x, h.axes(dim, x.ndim), _correction(ctx, correction, unbiased), keepdim)[0]


@lowering("aten.std", upcast=True)
def std(ctx, x, dim=None, unbiased=None, keepdim=False, correction=None):
    return var(ctx, x, dim, unbiased, keepdim, correction).sqrt()


@lowering("aten.var_mean", upcast=True)
def var_mean(ctx, x, dim=None, unbiased=None, keepdim=False, correction=None):
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    x = x.cast(ctx.dtype)
    return _var(x, h.axes(dim, x.ndim), _correction(ctx, correction, unbiased), keepdim)


@lowering("aten.cumsum", upcast=True)
def cumsum(ctx, x, dim, dtype=None):
    x = _prep(ctx, x, dtype)
    if x.ndim == 0:
        return x
    return x.cumsum(dim)


@lowering("aten.cumprod", upcast=True)
def cumprod(ctx, x, dim, dtype=None):
    """Prefix product: a product tree over the masked [..., i, j<=i] square (O(n^2 log n))."""
    x = _prep(ctx, x, dtype)
    if x.ndim == 0:
        return x
    axis = shapes.normalize_axis(dim, x.ndim)
    n = x.shape[axis]
    xm = x.movedim(axis, -1).unsqueeze(-2)
    full = xm.expand(xm.shape[:-2] + (n, n))
    i = x.builder.iota(n, "int64")
    keep = i.reshape((1, n)) <= i.reshape((n, 1))
    masked = Tensor.where(keep, full, x.builder.constant(1, x.dtype))
    return _prod_axis(masked, masked.ndim - 1).movedim(-1, axis)


@lowering("aten.logsumexp", upcast=True)
def logsumexp(ctx, x, dim, keepdim=False):
    x = x.float_().cast(ctx.dtype)
    if x.ndim == 0:
        return x
    ax = h.axes(dim, x.ndim)
    m = x.max(ax, keepdim=True)
    m = Tensor.where(m.abs() < math.inf, m, m.builder.constant(0.0, m.dtype, m.shape))  # inf maxima: shift by 0
    out = (x - m.expand(x.shape)).exp().sum(ax, keepdim=True).log() + m
    return out if keepdim else out.reshape(tuple(s for i, s in enumerate(out.shape) if i not in ax))


@lowering("aten.linalg_vector_norm", upcast=True)
def vector_norm(ctx, x, ord=2, dim=None, keepdim=False, dtype=None):
    x = _prep(ctx, x, dtype).abs()
    if x.ndim == 0:
        x = x.reshape((1,))
        dim, keepdim = 0, False
    ax = h.axes(dim, x.ndim)
    ord = float(ord)
    if ord == math.inf:
        return x.max(ax, keepdim)
    if ord == -math.inf:
        return x.min(ax, keepdim)
    if ord == 0:
        return x.ne(0).cast(x.dtype).sum(ax, keepdim)
    if ord == 1:
        return x.sum(ax, keepdim)
    if ord == 2:
        return (x * x).sum(ax, keepdim).sqrt()
    return x.pow(ord).sum(ax, keepdim).pow(1.0 / ord)
