"""Data movement on ``Tensor``: strided views, gathers, padding and concatenation.

Every reshape, permute, expand, slice, select and flip is one ``View``
(the builder composes chains of them); what a strided view cannot express
(gathers, padding, concatenation) is written with Iota, Gather and Where,
since the IR has no concat or pad primitive.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..errors import IRError
from . import dtypes, shapes
from .op_groups import Op
from .tensor_base import TensorBase, promote, reduce_axes


class Movement:
    """Mixin of :class:`~egraft.ir.builder.Tensor`: views, gathers and padding."""

    __slots__ = ()

    def view_as_strided(self, shape, strides, offset=0):
        return self.builder.view(self, shape, strides, offset)

    def reshape(self, shape):
        shape = list(shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = shapes.numel(self.shape) // max(known, 1)
        shape = tuple(int(s) for s in shape)
        if shapes.numel(shape) != shapes.numel(self.shape):
            raise IRError(f"cannot reshape {self.shape} to {shape}")
        return self.builder.view(self, shape, shapes.contiguous_strides(shape), 0)

    def permute(self, dims):
        dims = [shapes.normalize_axis(d, self.ndim) for d in dims]
        if sorted(dims) != list(range(self.ndim)):
            raise IRError(f"permute dims {dims} are not a permutation of {self.ndim} axes")
        cs = shapes.contiguous_strides(self.shape)
        return self.builder.view(self, [self.shape[d] for d in dims], [cs[d] for d in dims], 0)

    def transpose(self, a=-2, b=-1):
        dims = list(range(self.ndim))
        a, b = shapes.normalize_axis(a, self.ndim), shapes.normalize_axis(b, self.ndim)
        dims[a], dims[b] = dims[b], dims[a]
        return self.permute(dims)

    @property
    def T(self):
        return self.transpose(-2, -1)

    def movedim(self, src, dst):
        src, dst = shapes.normalize_axis(src, self.ndim), shapes.normalize_axis(dst, self.ndim)
        dims = [d for d in range(self.ndim) if d != src]
        dims.insert(dst, src)
        return self.permute(dims)

    def expand(self, shape):
        """Broadcast to `shape` (numpy rules, -1 keeps a dim) as a stride-0 view."""
        shape = tuple(int(s) for s in shape)
        if shape == self.shape:
            return self
        if len(shape) < self.ndim:
            raise IRError(f"cannot expand {self.shape} to the lower-rank shape {shape}")
        lead = len(shape) - self.ndim
        cs = shapes.contiguous_strides(self.shape)
        strides = [0] * lead
        out_shape = list(shape[:lead])
        for n, s, t in zip(self.shape, cs, shape[lead:]):
            if t == -1:
                t = n
            if n == t:
                strides.append(s)
            elif n == 1:
                strides.append(0)
            else:
                raise IRError(f"cannot expand dimension of size {n} to {t} (shape {self.shape} -> {shape})")
            out_shape.append(t)
        return self.builder.view(self, out_shape, strides, 0)

    def unsqueeze(self, axis):
        axis = axis % (self.ndim + 1)
        return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

    def squeeze(self, axis=None):
        axes = reduce_axes(axis, self.ndim) if axis is not None else tuple(i for i, n in enumerate(self.shape) if n == 1)
        return self.reshape(tuple(n for i, n in enumerate(self.shape) if not (i in axes and n == 1)))

    def slice(self, axis, start=None, stop=None, step=1):
        axis = shapes.normalize_axis(axis, self.ndim)
        n = self.shape[axis]
        start, stop, step = slice(start, stop, step).indices(n)
        length = len(range(start, stop, step))
        cs = shapes.contiguous_strides(self.shape)
        shape = list(self.shape)
        shape[axis] = length
        strides = list(cs)
        strides[axis] = cs[axis] * step
        return self.builder.view(self, shape, strides, start * cs[axis] if length else 0)

    def select(self, axis, index):
        axis = shapes.normalize_axis(axis, self.ndim)
        n = self.shape[axis]
        if not -n <= index < n:
            raise IRError(f"index {index} out of range for axis {axis} of size {n}")
        cs = shapes.contiguous_strides(self.shape)
        keep = [d for d in range(self.ndim) if d != axis]
        return self.builder.view(self, [self.shape[d] for d in keep], [cs[d] for d in keep], (index % n) * cs[axis])

    def flip(self, axis):
        axis = shapes.normalize_axis(axis, self.ndim)
        cs = list(shapes.contiguous_strides(self.shape))
        off = (self.shape[axis] - 1) * cs[axis]
        cs[axis] = -cs[axis]
        return self.builder.view(self, self.shape, cs, off)

    def gather(self, axis, idx):
        axis = shapes.normalize_axis(axis, self.ndim)
        if idx.ndim != self.ndim:
            raise IRError("gather index must have the source's rank")
        if any(i != axis and idx.shape[i] > self.shape[i] for i in range(self.ndim)):
            raise IRError(f"gather index shape {idx.shape} exceeds source {self.shape} off axis {axis}")
        src = self
        for d in range(self.ndim):
            if d != axis and idx.shape[d] != self.shape[d]:
                src = src.slice(d, 0, idx.shape[d])
        return self.builder.add("Gather", (src, idx), axis=axis)

    def scatter(self, axis, idx, upd):
        """``self`` with ``upd`` written at ``idx`` along `axis` (put_along_axis; the inverse of ``gather``).

        `idx` (int) and `upd` (``self``'s dtype) have one shape, ``self``'s except along `axis`; the indices
        must be distinct along `axis` within each line and lie in ``[0, self.shape[axis])``.
        """
        axis = shapes.normalize_axis(axis, self.ndim)
        return self.builder.add(Op.Scatter, (self, idx, upd), axis=axis)

    def index_select(self, axis, idx):
        """out = self taken at `idx` (any shape, int) along `axis`; idx dims replace that axis."""
        axis = shapes.normalize_axis(axis, self.ndim)
        flat = idx.reshape((-1,))
        k = flat.shape[0]
        shape = list(self.shape)
        shape[axis] = k
        full_idx = flat.reshape(tuple(k if d == axis else 1 for d in range(self.ndim))).expand(shape)
        out = self.builder.add("Gather", (self, full_idx), axis=axis)
        return out.reshape(self.shape[:axis] + idx.shape + self.shape[axis + 1:])

    def pad(self, axis, before, after, value=0):
        """Pad one axis with a constant, as Iota + Gather + Where."""
        axis = shapes.normalize_axis(axis, self.ndim)
        n = self.shape[axis]
        total = n + before + after
        i = self.builder.iota(total, "int64") - before
        valid = (i >= 0) & (i < n)
        idx = i.maximum(0).minimum(n - 1)
        g = self.index_select(axis, idx)
        vshape = tuple(total if d == axis else 1 for d in range(self.ndim))
        fill = self.builder.lift(value, self) if isinstance(value, TensorBase) or (
            isinstance(value, float) and not dtypes.is_float(self.dtype)) else self.builder.constant(value, self.dtype)
        return TensorBase.where(valid.reshape(vshape), g, fill)


def cat(tensors: Sequence[TensorBase], axis: int):
    """Concatenate along `axis` as Iota + Gather + Where (the IR has no concat)."""
    tensors = [t for t in tensors if t.shape[shapes.normalize_axis(axis, t.ndim)] > 0] or list(tensors[:1])
    if len(tensors) == 1:
        return tensors[0]
    t0 = tensors[0]
    axis = shapes.normalize_axis(axis, t0.ndim)
    for t in tensors[1:]:
        if t.ndim != t0.ndim or any(d != axis and t.shape[d] != t0.shape[d] for d in range(t0.ndim)):
            raise IRError(
                f"cat along axis {axis} needs equal shapes off that axis, got {[x.shape for x in tensors]}; "
                "expand or reshape the operands first"
            )
    dt = tensors[0].dtype
    for t in tensors[1:]:
        dt = promote(dt, t.dtype)
    total = sum(t.shape[axis] for t in tensors)
    i = t0.builder.iota(total, "int64")
    vshape = tuple(total if d == axis else 1 for d in range(t0.ndim))
    out = None
    start = total
    for t in reversed(tensors):
        n = t.shape[axis]
        start -= n
        g = t.cast(dt).index_select(axis, (i - start).maximum(0).minimum(n - 1))
        out = g if out is None else TensorBase.where((i < start + n).reshape(vshape), g, out)
    return out


def stack(tensors: Sequence[TensorBase], axis: int):
    axis = axis % (tensors[0].ndim + 1)
    return cat([t.unsqueeze(axis) for t in tensors], axis)
