"""Realise an IR ``View`` with XLA movement ops instead of a gather.

A view ``(shape, strides, offset)`` reads the row-major flattening of its
source: ``out[i] = flat[offset + sum(i_d * strides_d)]``.  XLA gathers are
slow on CPU and block fusion, while reshape / slice / transpose / rev /
broadcast are free or fuse into their consumer.  So a view is planned as

    flat source -> (pad) -> reshape into a "digit box" -> strided slice
    -> reshape -> transpose -> rev -> broadcast

whenever the strides *nest* (sorted by size, each stride is a multiple of
the next and a dimension never walks past the next coarser stride).  That
covers every reshape, permute, expand, slice (with step), select, flip and
their compositions.  Views whose dimensions overlap (sliding windows, as
convolution uses) are split along their smallest offending dimension into a
stack of nesting views; only if that would take too many pieces does the
plan fall back to one gather from the flat source with static indices.

The plan is pure shape arithmetic (:func:`plan_view`), so it is tested
without JAX; :func:`apply_view` runs a plan on a ``jax`` array.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Sequence

import numpy as np

MAX_STACK_PIECES = 64  # overlapping views: at most this many slices before using a gather


@dataclass(frozen=True)
class SlicePlan:
    """A nesting view: flat slice, pad, box reshape, strided slice, then back to the view's shape."""

    pre_start: int  # first take flat[pre_start:]
    pad_to: int  # then pad with zeros at the end up to this length (no pad if already that long)
    box: tuple[int, ...]  # reshape into this "digit box"
    starts: tuple[int, ...]
    limits: tuple[int, ...]
    split: tuple[int, ...]  # reshape the slice to the kept dims' sizes, in stride order
    perm: tuple[int, ...]  # transpose back to view order
    rev: tuple[int, ...]  # kept dims (in view order) to reverse
    kept_axes: tuple[int, ...]  # output axes the kept dims become; the rest are broadcast
    shape: tuple[int, ...]  # the view's shape

    @property
    def is_gather(self) -> bool:
        return False


@dataclass(frozen=True)
class StackPlan:
    """An overlapping view as a stack of sub-views along one output axis."""

    axis: int
    pieces: tuple

    @property
    def is_gather(self) -> bool:
        return any(p.is_gather for p in self.pieces)


@dataclass(frozen=True)
class GatherPlan:
    """The last resort: static flat indices into the source."""

    index: np.ndarray  # the view's shape

    @property
    def is_gather(self) -> bool:
        return True


@dataclass(frozen=True)
class ZeroPlan:
    shape: tuple[int, ...]

    @property
    def is_gather(self) -> bool:
        return False


def gather_index(shape, strides, offset) -> np.ndarray:
    """The flat source index of every view element (the reference definition)."""
    index = np.full(tuple(shape), offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(shape, strides)):
        if s and n > 1:
            index += (np.arange(n, dtype=np.int64) * s).reshape((n,) + (1,) * (len(shape) - d - 1))
    return index


def plan_view(src_numel: int, shape: Sequence[int], strides: Sequence[int], offset: int,
              budget: int = MAX_STACK_PIECES):
    """A plan realising the view on a flat source of `src_numel` elements."""
    shape, strides, offset = tuple(int(n) for n in shape), tuple(int(s) for s in strides), int(offset)
    if prod(shape) == 0:
        return ZeroPlan(shape)
    plan = _slice_plan(src_numel, shape, strides, offset)
    if isinstance(plan, SlicePlan):
        return plan
    a, b = plan  # two output axes whose strides overlap
    axis = a if shape[a] <= shape[b] else b
    n = shape[axis]
    if n > budget:
        return GatherPlan(gather_index(shape, strides, offset))
    sub_shape = shape[:axis] + shape[axis + 1:]
    sub_strides = strides[:axis] + strides[axis + 1:]
    pieces = tuple(plan_view(src_numel, sub_shape, sub_strides, offset + i * strides[axis], budget // n)
                   for i in range(n))
    if any(p.is_gather for p in pieces):
        return GatherPlan(gather_index(shape, strides, offset))
    return StackPlan(axis, pieces)


def _slice_plan(src_numel, shape, strides, offset):
    """A SlicePlan, or the pair of output axes that do not nest."""
    kept = [d for d, (n, s) in enumerate(zip(shape, strides)) if n > 1 and s != 0]
    sizes = [shape[d] for d in kept]
    rev = []
    pos = []
    for k, d in enumerate(kept):
        s = strides[d]
        if s < 0:  # read it forwards from its far end, reverse afterwards
            offset += (shape[d] - 1) * s
            s = -s
            rev.append(k)
        pos.append(s)
    order = sorted(range(len(kept)), key=lambda k: -pos[k])
    s_sorted = [pos[k] for k in order]
    n_sorted = [sizes[k] for k in order]
    for j in range(len(s_sorted) - 1):
        s, t, n = s_sorted[j], s_sorted[j + 1], n_sorted[j + 1]
        if s % t != 0 or n * t > s:
            return kept[order[j]], kept[order[j + 1]]
    # merge runs of dims that are contiguous with respect to each other
    m_sizes: list[int] = []
    m_strides: list[int] = []
    for n, s in zip(n_sorted, s_sorted):
        if m_sizes and m_strides[-1] == n * s:
            m_sizes[-1] *= n
            m_strides[-1] = s
        else:
            m_sizes.append(n)
            m_strides.append(s)
    if not m_sizes:  # one element
        m_sizes, m_strides = [1], [1]
    places = m_strides + [1]
    inner = [places[j] // places[j + 1] for j in range(len(m_strides))]

    def digits_of(x):
        out = []
        for p in places:
            out.append(x // p)
            x %= p
        return out

    # Prefer slicing the box at the offset's digits (no flat pre-slice); if a
    # digit would carry, pre-slice the flat source at the offset instead.
    pre = 0
    digits = digits_of(offset)
    if any(c + n > b for c, n, b in zip(digits[1:], m_sizes[1:], inner)) or digits[-1] + 1 > inner[-1]:
        pre, digits = offset, [0] * len(places)
    length = src_numel - pre
    top = max(-(-length // places[0]), digits[0] + m_sizes[0])
    limits = tuple(c + n for c, n in zip(digits, m_sizes)) + (digits[-1] + 1,)
    return SlicePlan(
        pre_start=pre,
        pad_to=top * places[0],
        box=(top, *inner),
        starts=tuple(digits),
        limits=limits,
        split=tuple(n_sorted),
        perm=tuple(order.index(k) for k in range(len(kept))),
        rev=tuple(rev),
        kept_axes=tuple(kept),
        shape=shape,
    )


class _JaxOps:
    """The movement ops a plan needs, in jax (the numpy twin below runs plans in tests)."""

    def __init__(self):
        import jax.numpy as jnp
        from jax import lax

        self.jnp, self.lax = jnp, lax

    def zeros(self, shape, dt):
        return self.jnp.zeros(shape, dt)

    def reshape(self, x, shape):
        return self.jnp.reshape(x, shape)

    def slice(self, x, starts, limits):
        return self.lax.slice(x, tuple(starts), tuple(limits))

    def pad_end(self, x, n):
        return self.jnp.pad(x, (0, n))

    def transpose(self, x, perm):
        return self.jnp.transpose(x, perm)

    def rev(self, x, axes):
        return self.lax.rev(x, tuple(axes))

    def broadcast(self, x, shape, axes):
        return self.lax.broadcast_in_dim(x, shape, tuple(axes))

    def stack(self, xs, axis):
        return self.jnp.stack(xs, axis=axis)

    def take(self, flat, index):
        idx = index.astype(np.int32) if index.max() < 2**31 else index
        return self.jnp.take(flat, self.jnp.asarray(idx), mode="clip")  # static, in range


class NumpyOps:
    """Plans run on numpy: fast, exact, for testing the shape arithmetic."""

    def zeros(self, shape, dt):
        return np.zeros(shape, dt)

    def reshape(self, x, shape):
        return np.reshape(x, shape)

    def slice(self, x, starts, limits):
        return x[tuple(slice(a, b) for a, b in zip(starts, limits))]

    def pad_end(self, x, n):
        return np.pad(x, (0, n))

    def transpose(self, x, perm):
        return np.transpose(x, perm)

    def rev(self, x, axes):
        return np.flip(x, tuple(axes))

    def broadcast(self, x, shape, axes):
        full = [1] * len(shape)
        for a, n in zip(axes, x.shape):
            full[a] = n
        return np.broadcast_to(np.reshape(x, full), shape)

    def stack(self, xs, axis):
        return np.stack(xs, axis=axis)

    def take(self, flat, index):
        return flat[index]


_JAX_OPS = None


def apply_view(x, plan, ops=None):
    """Run a view plan on the (any-shape) array `x` (jax by default, or ``ops=NumpyOps()``)."""
    global _JAX_OPS
    if ops is None:
        if _JAX_OPS is None:
            _JAX_OPS = _JaxOps()
        ops = _JAX_OPS
    if isinstance(plan, ZeroPlan):
        return ops.zeros(plan.shape, x.dtype)
    return _apply_flat(ops.reshape(x, (-1,)), plan, ops)


def _apply_flat(flat, plan, ops):
    if isinstance(plan, GatherPlan):
        return ops.take(flat, plan.index)
    if isinstance(plan, StackPlan):
        return ops.stack([_apply_flat(flat, p, ops) for p in plan.pieces], plan.axis)
    if isinstance(plan, ZeroPlan):
        return ops.zeros(plan.shape, flat.dtype)
    n = flat.shape[0]
    y = flat
    if plan.pre_start:
        y = ops.slice(y, (plan.pre_start,), (n,))
        n -= plan.pre_start
    if plan.pad_to > n:
        y = ops.pad_end(y, plan.pad_to - n)
    elif plan.pad_to < n:
        y = ops.slice(y, (0,), (plan.pad_to,))
    y = ops.reshape(y, plan.box)
    if plan.starts != (0,) * len(plan.box) or plan.limits != plan.box:
        y = ops.slice(y, plan.starts, plan.limits)
    y = ops.reshape(y, plan.split)
    if plan.perm != tuple(range(len(plan.perm))):
        y = ops.transpose(y, plan.perm)
    if plan.rev:
        y = ops.rev(y, plan.rev)
    if tuple(y.shape) != plan.shape:
        y = ops.broadcast(y, plan.shape, plan.kept_axes)
    return y
