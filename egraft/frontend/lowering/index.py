"""Indexing ATen ops: advanced indexing, gather, index_select, embedding, index_put.

Reads become ``Gather`` (take_along_axis) with index tensors built from the
model's integer tensors.  Writes of whole rows along one dim (``index_copy``,
``index_put`` with one 1-D index tensor, the KV cache update ``cache[:, :, pos]
= kv``) become one ``Scatter`` (put_along_axis) whose index is the 1-D index
broadcast by a stride-0 view, so a backend can write them into a state buffer
in place; the other writes are a match of every target position against every
index.  Negative indices are wrapped where torch allows them (``x[idx]``),
since the IR's Gather and Scatter require indices in range.
"""

from __future__ import annotations

import math

from ...ir import Op, shapes
from ...ir.builder import Tensor
from .table import lowering


def _wrap(idx: Tensor, n: int) -> Tensor:
    idx = idx.cast("int64")
    return Tensor.where(idx < 0, idx + n, idx)


def _linear_index(ctx, x: Tensor, indices):
    """Indexed dims, other dims, and one int64 index into the indexed dims flattened (row-major)."""
    pos = [i for i, t in enumerate(indices) if t is not None]
    for i in pos:
        if indices[i].dtype == "bool":
            raise ctx.unsupported("boolean mask index", "indexing with a boolean mask has a data-dependent "
                                  "shape; use torch.where(mask, x, fill) instead")
    others = [d for d in range(x.ndim) if d not in pos]
    bshape = shapes.broadcast_shapes(*[indices[i].shape for i in pos])
    lin = None
    for i in pos:
        n = x.shape[i]
        t = _wrap(indices[i], n).expand(bshape)
        lin = t if lin is None else lin * n + t
    return pos, others, bshape, lin


@lowering("aten.index")
def index(ctx, x, indices):
    indices = list(indices)
    pos = [i for i, t in enumerate(indices) if t is not None]
    if len(pos) == 1 and indices[pos[0]].dtype != "bool":
        i = pos[0]
        return x.index_select(i, _wrap(indices[i], x.shape[i]))
    pos, others, bshape, lin = _linear_index(ctx, x, indices)
    flat = x.permute(pos + others).reshape((math.prod(x.shape[i] for i in pos),) + tuple(x.shape[d] for d in others))
    out = flat.index_select(0, lin)  # [*bshape, *others]
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    if adjacent and pos[0] > 0:  # torch keeps the indexed block in place when the indexed dims are adjacent
        nb, p0 = len(bshape), pos[0]
        rest = list(range(nb, out.ndim))
        out = out.permute(rest[:p0] + list(range(nb)) + rest[p0:])
    return out


@lowering("aten.index_select")
def index_select(ctx, x, dim, idx):
    if x.ndim == 0:
        return x
    return x.index_select(dim, idx.reshape((-1,)) if idx.ndim == 0 else idx)


@lowering("aten.gather")
def gather(ctx, x, dim, idx, sparse_grad=False):
    if x.ndim == 0:
        return x
    return x.gather(dim, idx.cast("int64") if idx.dtype != "int64" else idx)


@lowering("aten.embedding")
def embedding(ctx, weight, idx, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return weight.index_select(0, idx)


def scatter_rows(x: Tensor, dim: int, idx: Tensor, values: Tensor) -> Tensor:
    """`x` with ``x[.., idx[k], ..] = values[.., k, ..]`` along `dim`: one Scatter of `idx` (1-D) broadcast.

    `values` is cast to `x`'s dtype and broadcast to `x`'s shape with `dim` of
    size ``len(idx)``; `idx` may hold negative (wrapped) indices.
    """
    k = idx.shape[0]
    shape = tuple(k if d == dim else n for d, n in enumerate(x.shape))
    vals = values.cast(x.dtype).expand(shape)
    full = _wrap(idx, x.shape[dim]).reshape(tuple(k if d == dim else 1 for d in range(x.ndim))).expand(shape)
    return x.builder.add(Op.Scatter, (x, full, vals), axis=dim)


@lowering("aten.index_put")
def index_put(ctx, x, indices, values, accumulate=False):
    """x[indices] = values (or +=): one Scatter for one 1-D index tensor (index_put's duplicate positions
    are undefined without accumulate), else a match of every target position against every index (O(N*K))."""
    indices = list(indices) + [None] * (x.ndim - len(indices))
    pos = [i for i, t in enumerate(indices) if t is not None]
    if not accumulate and len(pos) == 1 and indices[pos[0]].ndim == 1 and indices[pos[0]].dtype != "bool":
        return scatter_rows(x, pos[0], indices[pos[0]], _as_tensor(ctx, values, x))
    pos, others, bshape, lin = _linear_index(ctx, x, indices)
    n_p = math.prod(x.shape[i] for i in pos)
    rest = tuple(x.shape[d] for d in others)
    flat = x.permute(pos + others).reshape((n_p,) + rest)
    k = math.prod(bshape)
    vals = values.cast(x.dtype)
    # values broadcast against the indexing result's shape (adjacent dims keep their place in x[indices])
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    if adjacent and pos[0] > 0:
        res_shape = tuple(x.shape[d] for d in others[:pos[0]]) + bshape + tuple(x.shape[d] for d in others[pos[0]:])
        vals = vals.expand(res_shape)
        nb, p0 = len(bshape), pos[0]
        vals = vals.permute(list(range(p0, p0 + nb)) + list(range(p0)) + list(range(p0 + nb, vals.ndim)))
    else:
        vals = vals.expand(bshape + rest)
    vals = vals.reshape((k,) + rest)
    lin = lin.reshape((k,))
    p = ctx.builder.iota(n_p, "int64").reshape((n_p, 1))
    match = lin.reshape((1, k)).eq(p)  # [n_p, k]
    mshape = (n_p, k) + (1,) * len(rest)
    if accumulate:
        contrib = Tensor.where(match.reshape(mshape), vals.unsqueeze(0), ctx.builder.constant(0, x.dtype))
        hit = match.max(1).reshape((n_p,) + (1,) * len(rest))
        out = Tensor.where(hit, flat + contrib.sum(1), flat)  # an untouched -0.0 stays -0.0 (-0.0 + 0.0 is +0.0)
    else:
        kk = Tensor.where(match, ctx.builder.iota(k, "int64").reshape((1, k)), -1).max(1)  # last write wins
        hit = (kk > -1).reshape((n_p,) + (1,) * len(rest))
        out = Tensor.where(hit, vals.index_select(0, kk.maximum(0)), flat)
    out = out.reshape(tuple(x.shape[i] for i in pos) + rest)
    inv = [0] * x.ndim
    for j, d in enumerate(pos + others):
        inv[d] = j
    return out.permute(inv)


def _match(idx: Tensor, dim: int, n: int) -> Tensor:
    """bool [..., n, m, ...]: target position p (new axis ``dim``) is written by source position k (axis dim+1)."""
    p = idx.builder.iota(n, "int64").reshape(tuple(n if d == dim else 1 for d in range(idx.ndim + 1)))
    return idx.cast("int64").unsqueeze(dim).eq(p)


def _embed(sub: Tensor, full_shape, fill) -> Tensor:
    """``sub`` (a leading box of ``full_shape``) padded out to ``full_shape`` with ``fill``."""
    for d, (a, n) in enumerate(zip(sub.shape, full_shape)):
        if a != n:
            sub = sub.pad(d, 0, n - a, fill)
    return sub


def _scatter(ctx, x, dim, idx, src, reduce=None):
    """torch.scatter family along ``dim``: a plain scatter covering every other axis is one ``Scatter``; a
    reducing one, or one over part of the other axes, matches every target position against every index
    (O(n*m)), where the last of two writes to one position wins."""
    dim = shapes.normalize_axis(dim, x.ndim)
    n = x.shape[dim]
    if not isinstance(src, Tensor):
        src = ctx.builder.constant(src, x.dtype, idx.shape)
    src = src.cast(x.dtype)
    for d in range(src.ndim):
        if src.shape[d] != idx.shape[d]:
            src = src.slice(d, 0, idx.shape[d])
    box = tuple(n if d == dim else idx.shape[d] for d in range(x.ndim))
    if reduce is None and box == x.shape:
        # torch leaves two writes to one position undefined: the rows' writes are one Scatter (the KV-cache
        # update of a slot cache), not the O(n*m) match below
        return x.builder.add(Op.Scatter, (x, _wrap(idx, n).cast("int64"), src), axis=dim)
    x_box = x
    for d in range(x.ndim):
        if d != dim and x.shape[d] != box[d]:
            x_box = x_box.slice(d, 0, box[d])
    match = _match(idx, dim, n)  # [..., n, m, ...]
    hit_any = match.max(dim + 1)  # [..., n, ...]
    if reduce in ("sum", "add"):
        contrib = Tensor.where(match, src.unsqueeze(dim), ctx.builder.constant(0, x.dtype)).sum(dim + 1)
        new = Tensor.where(hit_any, x_box + contrib, x_box)  # an untouched -0.0 stays -0.0 (-0.0 + 0.0 is +0.0)
    elif reduce in ("prod", "multiply"):
        from .reduce import _prod_axis

        contrib = _prod_axis(Tensor.where(match, src.unsqueeze(dim), ctx.builder.constant(1, x.dtype)), dim + 1)
        new = x_box * contrib
    elif reduce in ("amax", "amin"):
        lowest = -math.inf if reduce == "amax" else math.inf
        vals = Tensor.where(match, src.unsqueeze(dim), ctx.builder.constant(lowest, x.dtype))
        ext = vals.max(dim + 1) if reduce == "amax" else vals.min(dim + 1)
        new = Tensor.where(hit_any, x_box.maximum(ext) if reduce == "amax" else x_box.minimum(ext), x_box)
    elif reduce is None:
        m = idx.shape[dim]
        k = ctx.builder.iota(m, "int64").reshape(tuple(m if d == dim + 1 else 1 for d in range(idx.ndim + 1)))
        last = Tensor.where(match, k, -1).max(dim + 1)  # the last write wins
        new = Tensor.where(hit_any, src.gather(dim, last.maximum(0)), x_box)
    else:
        raise ctx.unsupported(f"reduce={reduce!r}", "use sum, prod, amax or amin")
    if box == x.shape:
        return new
    inside = _embed(ctx.builder.constant(True, "bool", box), x.shape, False)
    return Tensor.where(inside, _embed(new, x.shape, 0), x)


@lowering("aten.scatter")
def scatter(ctx, x, dim, idx, src, reduce=None):
    return _scatter(ctx, x, dim, idx, src, {"add": "sum", "multiply": "prod"}.get(reduce, reduce))


@lowering("aten.scatter_add")
def scatter_add(ctx, x, dim, idx, src):
    return _scatter(ctx, x, dim, idx, src, "sum")


@lowering("aten.scatter_reduce")
def scatter_reduce(ctx, x, dim, idx, src, reduce, include_self=True):
    if reduce == "mean" or not include_self:
        raise ctx.unsupported(f"reduce={reduce!r}, include_self={include_self}",
                              "use scatter_reduce with sum/prod/amax/amin and include_self=True")
    return _scatter(ctx, x, dim, idx, src, reduce)


@lowering("aten.index_add")
def index_add(ctx, x, dim, idx, source, alpha=1):
    dim = shapes.normalize_axis(dim, x.ndim)
    src = source if alpha == 1 else source * alpha
    full_idx = idx.reshape(tuple(idx.shape[0] if d == dim else 1 for d in range(x.ndim))).expand(
        tuple(src.shape[d] if d != dim else idx.shape[0] for d in range(x.ndim)))
    return _scatter(ctx, x, dim, full_idx, src, "sum")


@lowering("aten.index_copy")
def index_copy(ctx, x, dim, idx, source):
    """``x.index_copy(dim, idx, source)``: one Scatter (index_copy's positions are distinct)."""
    if x.ndim == 0:
        return source.cast(x.dtype).reshape(())
    dim = shapes.normalize_axis(dim, x.ndim)
    return scatter_rows(x, dim, idx.reshape((-1,)), source)


def _as_tensor(ctx, v, like: Tensor) -> Tensor:
    return v if isinstance(v, Tensor) else ctx.builder.constant(v, like.dtype)


@lowering("aten.index_fill")
def index_fill(ctx, x, dim, idx, value):
    dim = shapes.normalize_axis(dim, x.ndim)
    n = x.shape[dim]
    hit = _match(idx.reshape((-1,)), 0, n).max(1)  # [n]
    v = value.cast(x.dtype) if isinstance(value, Tensor) else ctx.builder.constant(value, x.dtype)
    return Tensor.where(hit.reshape(tuple(n if d == dim else 1 for d in range(x.ndim))), v, x)
