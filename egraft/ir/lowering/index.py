"""Indexing ATen ops: advanced indexing, gather, index_select, embedding, index_put.

All of them become ``Gather`` (take_along_axis) with index tensors built from
the model's integer tensors.  Negative indices are wrapped where torch allows
them (``x[idx]``), since the IR's Gather requires indices in range.
"""

from __future__ import annotations

import math

from .. import shapes
from ..builder import Tensor
from .registry import lowering


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


@lowering("aten.index_put")
def index_put(ctx, x, indices, values, accumulate=False):
    """x[indices] = values (or +=), as a match of every target position against every index (O(N*K))."""
    indices = list(indices) + [None] * (x.ndim - len(indices))
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
    p = ctx.b.iota(n_p, "int64").reshape((n_p, 1))
    match = lin.reshape((1, k)).eq(p)  # [n_p, k]
    mshape = (n_p, k) + (1,) * len(rest)
    if accumulate:
        contrib = Tensor.where(match.reshape(mshape), vals.unsqueeze(0), ctx.b.constant(0, x.dtype))
        out = flat + contrib.sum(1)
    else:
        kk = Tensor.where(match, ctx.b.iota(k, "int64").reshape((1, k)), -1).max(1)  # last write wins
        hit = (kk > -1).reshape((n_p,) + (1,) * len(rest))
        out = Tensor.where(hit, vals.index_select(0, kk.maximum(0)), flat)
    out = out.reshape(tuple(x.shape[i] for i in pos) + rest)
    inv = [0] * x.ndim
    for j, d in enumerate(pos + others):
        inv[d] = j
    return out.permute(inv)
