"""Movement ATen ops: views, slicing, joining, splitting, padding, flips.

Everything here is a ``View`` (zero FLOPs) where the result is a strided
window of the input's *logical* row-major layout, and Iota/Gather/Where
otherwise (cat, pad, roll, scatters).  torch's views alias memory; the IR
has no memory, so ``clone``/``contiguous``/``alias`` are identities and
``as_strided`` is only accepted on inputs whose storage is their logical
layout (a contiguous, offset-0 tensor).
"""

from __future__ import annotations

import numpy as np

from ...ir import shapes
from ...ir.builder import Tensor, cat as _cat, stack as _stack
from .table import lowering


@lowering("aten.view", "aten._unsafe_view", "aten.view_copy")
def view(ctx, x, size, *_):
    return x.reshape(tuple(size))


@lowering("aten.expand")
def expand(ctx, x, size, implicit=False):
    size = list(size)
    lead = len(size) - x.ndim
    size = [x.shape[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(size)]
    return x.expand(tuple(size))


@lowering("aten.permute", "aten.permute_copy")
def permute(ctx, x, dims):
    return x.permute(list(dims)) if x.ndim else x


@lowering("aten.transpose")
def transpose(ctx, x, dim0, dim1):
    return x.transpose(dim0, dim1) if x.ndim > 1 else x


@lowering("aten.t")
def t(ctx, x):
    return x.transpose(0, 1) if x.ndim == 2 else x


@lowering("aten.unsqueeze")
def unsqueeze(ctx, x, dim):
    return x.unsqueeze(dim)


@lowering("aten.squeeze")
def squeeze(ctx, x, dim=None):
    if x.ndim == 0:
        return x
    return x.squeeze(dim if dim is None or isinstance(dim, int) else tuple(dim))


@lowering("aten.clone", "aten.alias", "aten.detach", "aten.lift_fresh_copy")
def identity(ctx, x, *args, **kwargs):
    """No memory in the IR: copies and aliases are the value itself."""
    return x


@lowering("aten.slice")
def slice_(ctx, x, dim=0, start=None, end=None, step=1):
    return x.slice(dim, start, end, step)


@lowering("aten.select")
def select(ctx, x, dim, index):
    return x.select(dim, index)


@lowering("aten.narrow_copy")
def narrow_copy(ctx, x, dim, start, length):
    return x.slice(dim, start, start + length)


@lowering("aten.split_with_sizes")
def split_with_sizes(ctx, x, sizes, dim=0):
    out, start = [], 0
    for n in sizes:
        out.append(x.slice(dim, start, start + n))
        start += n
    return tuple(out)


@lowering("aten.split")
def split(ctx, x, size, dim=0):
    if not isinstance(size, int):
        return split_with_sizes(ctx, x, size, dim)
    n = x.shape[shapes.normalize_axis(dim, x.ndim)]
    return tuple(x.slice(dim, s, min(s + size, n)) for s in range(0, max(n, 1), max(size, 1)))


@lowering("aten.unbind", "aten.unbind_copy")
def unbind(ctx, x, dim=0):
    return tuple(x.select(dim, i) for i in range(x.shape[shapes.normalize_axis(dim, x.ndim)]))


@lowering("aten.cat", "aten.concat", "aten.concatenate")
def cat(ctx, tensors, dim=0):
    dt = ctx.dtype
    # torch (legacy) skips 1-D empty tensors in cat with higher-rank ones
    ts = [t.cast(dt) for t in tensors if not (t.ndim == 1 and t.shape[0] == 0 and len(ctx.shape) != 1)]
    if not ts:
        return ctx.builder.constant(0, dt, ctx.shape)
    return _cat(ts, dim)


@lowering("aten.stack")
def stack(ctx, tensors, dim=0):
    return _stack([t.cast(ctx.dtype) for t in tensors], dim)


@lowering("aten.flip")
def flip(ctx, x, dims):
    for d in dims:
        x = x.flip(d)
    return x


@lowering("aten.roll")
def roll(ctx, x, shifts, dims=()):
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    if not dims:  # roll of the flattened tensor
        return roll(ctx, x.reshape((-1,)), shifts, [0]).reshape(x.shape)
    for s, d in zip(shifts, dims):
        d = shapes.normalize_axis(d, x.ndim)
        n = x.shape[d]
        if n and s % n:
            k = s % n
            x = _cat([x.slice(d, n - k, n), x.slice(d, 0, n - k)], d)
    return x


@lowering("aten.repeat")
def repeat(ctx, x, repeats):
    repeats = list(repeats)
    lead = len(repeats) - x.ndim
    x = x.reshape((1,) * lead + x.shape)
    inter = []
    for r, n in zip(repeats, x.shape):
        inter += [1, n]
    y = x.reshape(tuple(inter))
    target = []
    for r, n in zip(repeats, x.shape):
        target += [r, n]
    return y.expand(tuple(target)).reshape(tuple(r * n for r, n in zip(repeats, x.shape)))


def _pad_pairs(pad, ndim):
    """torch's flat pad list (last dim first) as {axis: (before, after)}."""
    out = {}
    for i in range(len(pad) // 2):
        out[ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    return out


@lowering("aten.constant_pad_nd")
def constant_pad_nd(ctx, x, pad, value=0):
    for axis, (before, after) in _pad_pairs(pad, x.ndim).items():
        if before < 0:
            x, before = x.slice(axis, -before, None), 0
        if after < 0:
            x, after = x.slice(axis, 0, x.shape[axis] + after), 0
        if before or after:
            x = x.pad(axis, before, after, value)
    return x


def _index_pad(ctx, x, pad, index_fn):
    for axis, (before, after) in _pad_pairs(pad, x.ndim).items():
        n = x.shape[axis]
        idx = np.array([index_fn(i, n) for i in range(-before, n + after)], dtype=np.int64)
        x = x.index_select(axis, ctx.builder.tensor_constant(idx))
    return x


def _reflect(i, n):
    period = 2 * (n - 1)
    i = abs(i) % period if period else 0
    return period - i if i >= n else i


_INDEX_PAD = {"reflect": _reflect, "replicate": lambda i, n: min(max(i, 0), n - 1), "circular": lambda i, n: i % n}


@lowering("aten.pad")
def pad(ctx, x, pad, mode="constant", value=None):
    """F.pad kept whole (exports without decomposition): constant, reflect, replicate, circular."""
    if mode == "constant":
        return constant_pad_nd(ctx, x, pad, 0 if value is None else value)
    if mode not in _INDEX_PAD:
        raise ctx.unsupported(f"mode={mode!r}", "use constant, reflect, replicate or circular padding")
    return _index_pad(ctx, x, pad, _INDEX_PAD[mode])


for _k in (1, 2, 3):
    lowering(f"aten.reflection_pad{_k}d")(lambda ctx, x, pad: _index_pad(ctx, x, pad, _reflect))
    lowering(f"aten.replication_pad{_k}d")(lambda ctx, x, pad: _index_pad(ctx, x, pad, lambda i, n: min(max(i, 0), n - 1)))


@lowering("aten.as_strided", "aten.as_strided_copy")
def as_strided(ctx, x, size, stride, storage_offset=None):
    meta = ctx.arg_metas[0]
    if meta is None or not meta.is_contiguous() or meta.storage_offset() != 0:
        raise ctx.unsupported("on a non-contiguous input", "as_strided addresses storage, which egraft's IR "
                              "does not model; call .contiguous() first or use view/slice/unfold")
    return x.view_as_strided(tuple(size), tuple(stride), storage_offset or 0)


@lowering("aten.unfold")
def unfold(ctx, x, dim, size, step):
    if x.ndim == 0:
        return x.reshape((1,))
    dim = shapes.normalize_axis(dim, x.ndim)
    cs = shapes.contiguous_strides(x.shape)
    shape = list(x.shape)
    shape[dim] = (x.shape[dim] - size) // step + 1
    strides = list(cs)
    strides[dim] = cs[dim] * step
    return x.view_as_strided(shape + [size], strides + [cs[dim]], 0)


@lowering("aten.diagonal")
def diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    d1, d2 = shapes.normalize_axis(dim1, x.ndim), shapes.normalize_axis(dim2, x.ndim)
    cs = shapes.contiguous_strides(x.shape)
    n1, n2 = x.shape[d1], x.shape[d2]
    length = max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))
    start = (offset * cs[d2] if offset >= 0 else -offset * cs[d1]) if length else 0
    keep = [d for d in range(x.ndim) if d not in (d1, d2)]
    return x.view_as_strided([x.shape[d] for d in keep] + [length], [cs[d] for d in keep] + [cs[d1] + cs[d2]], start)


def _tri(ctx, x, diagonal, lower):
    r, c = x.shape[-2], x.shape[-1]
    i = ctx.builder.iota(r, "int64").reshape((r, 1))
    j = ctx.builder.iota(c, "int64").reshape((1, c))
    keep = (j - i) <= diagonal if lower else (j - i) >= diagonal
    return Tensor.where(keep, x, ctx.builder.constant(0, x.dtype))


@lowering("aten.tril")
def tril(ctx, x, diagonal=0):
    return _tri(ctx, x, diagonal, True)


@lowering("aten.triu")
def triu(ctx, x, diagonal=0):
    return _tri(ctx, x, diagonal, False)


@lowering("aten.slice_scatter")
def slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    """``x`` with its static slice along `dim` replaced by `src`: one Scatter at the slice's positions."""
    from .index import scatter_rows

    dim = shapes.normalize_axis(dim, x.ndim)
    start, end, step = slice(start, end, step).indices(x.shape[dim])
    covered = np.arange(start, end, step, dtype=np.int64)
    if covered.size == 0:
        return x
    if covered.size == x.shape[dim] and step == 1:
        return src.cast(x.dtype)
    return scatter_rows(x, dim, ctx.builder.tensor_constant(covered), src)


@lowering("aten.select_scatter")
def select_scatter(ctx, x, src, dim, index):
    dim = shapes.normalize_axis(dim, x.ndim)
    index = index % x.shape[dim]
    return slice_scatter(ctx, x, src.unsqueeze(dim), dim, index, index + 1, 1)


@lowering("aten.copy")
def copy(ctx, x, src, non_blocking=False):
    return src.cast(x.dtype).expand(x.shape)


@lowering("aten.fill")
def fill(ctx, x, value):
    if isinstance(value, Tensor):
        return value.cast(x.dtype).expand(x.shape)
    return ctx.builder.constant(value, x.dtype, x.shape)
