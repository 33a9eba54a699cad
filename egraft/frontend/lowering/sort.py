"""Sorting ops (sort, topk, kthvalue, median) as pairwise comparisons: O(n^2) per row.

The IR has no sort primitive.  The stable rank of element i along an axis is
``#{j: x_j before x_i} + #{j < i: x_j == x_i}`` ("before" is ``<`` ascending,
``>`` descending); the element of rank r is then picked with a one-hot match
and a Gather.  This is exact and meant for the short axes models sort (top-k
routing over experts, small candidate lists).  Ties keep their original
order (a stable sort); torch's unstable ``topk``/``median`` may order tied
indices differently, but the values agree.
"""

from __future__ import annotations

import math

from ...ir import dtypes, shapes
from ...ir.builder import Tensor
from . import helpers as h
from .table import lowering


def _ranks(x: Tensor, axis: int, descending: bool) -> Tensor:
    """int64 stable rank of every element along ``axis`` (NaN sorts as the largest value, as in torch)."""
    n = x.shape[axis]
    xi = x.unsqueeze(axis + 1)  # [..., n(i), 1, ...]
    xj = x.unsqueeze(axis)  # [..., 1, n(j), ...]
    full = x.shape[:axis] + (n, n) + x.shape[axis + 1:]
    a, b = xi.expand(full), xj.expand(full)
    if dtypes.is_float(x.dtype):
        nan_a, nan_b = h.isnan(a), h.isnan(b)
        less = (b < a) | (nan_a & ~nan_b)  # x_j < x_i with nan largest
        more = (a < b) | (nan_b & ~nan_a)
        same = h.eq(a, b) | (nan_a & nan_b)
    else:
        less, more, same = b < a, a < b, h.eq(a, b)
    before = more if descending else less
    i = x.builder.iota(n, "int64")
    shape_i = tuple(n if d == axis else 1 for d in range(len(full)))
    shape_j = tuple(n if d == axis + 1 else 1 for d in range(len(full)))
    earlier = i.reshape(shape_j) < i.reshape(shape_i)  # j < i
    counted = before | (same & earlier.expand(full))
    return counted.cast("int64").sum(axis + 1)


def _sorted(x: Tensor, axis: int, descending: bool, k: int | None = None):
    """(values, indices) of the first k elements in sorted order along ``axis``."""
    n = x.shape[axis]
    k = n if k is None else k
    rank = _ranks(x, axis, descending)  # [..., n(i), ...]
    r = x.builder.iota(k, "int64").reshape(tuple(k if d == axis + 1 else 1 for d in range(x.ndim + 1)))
    hit = rank.unsqueeze(axis + 1).eq(r)  # [..., n(i), k, ...]
    i = x.builder.iota(n, "int64").reshape(tuple(n if d == axis else 1 for d in range(x.ndim + 1)))
    idx = Tensor.where(hit, i, x.builder.constant(0, "int64")).sum(axis)  # [..., k, ...]
    return x.gather(axis, idx), idx


@lowering("aten.sort")
def sort(ctx, x, dim=-1, descending=False, stable=None):
    if isinstance(dim, bool):  # sort.stable(x, *, stable, dim, descending) passes keywords; positional forms vary
        dim, descending = -1, dim
    if x.ndim == 0:
        return x, ctx.builder.constant(0, "int64")
    return _sorted(x, shapes.normalize_axis(dim, x.ndim), bool(descending))


@lowering("aten.topk")
def topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, ctx.builder.constant(0, "int64")
    return _sorted(x, shapes.normalize_axis(dim, x.ndim), bool(largest), int(k))


@lowering("aten.kthvalue")
def kthvalue(ctx, x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, ctx.builder.constant(0, "int64")
    axis = shapes.normalize_axis(dim, x.ndim)
    vals, idx = _sorted(x, axis, False, int(k))
    vals, idx = vals.select(axis, k - 1), idx.select(axis, k - 1)
    return (vals.unsqueeze(axis), idx.unsqueeze(axis)) if keepdim else (vals, idx)


@lowering("aten.median")
def median(ctx, x, dim=None, keepdim=False):
    """Lower median (torch's definition); with a dim also the index of that element."""
    if dim is None:
        flat = x.reshape((-1,))
        if not flat.shape[0]:
            return flat.sum()
        return _nan_first(flat, *kthvalue(ctx, flat, (flat.shape[0] - 1) // 2 + 1, 0), 0, False)[0]
    if x.ndim == 0:
        return x, ctx.builder.constant(0, "int64")
    axis = shapes.normalize_axis(dim, x.ndim)
    return _nan_first(x, *kthvalue(ctx, x, (x.shape[axis] - 1) // 2 + 1, axis, keepdim), axis, keepdim)


def _nan_first(x: Tensor, vals: Tensor, idx: Tensor, axis: int, keepdim: bool):
    """torch's median propagates nan: a row holding one gives nan, at the index of its first nan."""
    if not dtypes.is_float(x.dtype):
        return vals, idx
    n = x.shape[axis]
    pos = x.builder.iota(n, "int64").reshape(tuple(n if d == axis else 1 for d in range(x.ndim)))
    first = Tensor.where(h.isnan(x), pos, x.builder.constant(n, "int64")).min(axis, keepdim)
    has = first < n
    return Tensor.where(has, math.nan, vals).cast(vals.dtype), Tensor.where(has, first, idx)
