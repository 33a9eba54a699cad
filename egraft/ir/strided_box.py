"""A view of a flat buffer as movement ops: flip, pad, reshape, strided slice, transpose, broadcast.

Gathers are slow and block fusion in array compilers, while reshape,
slice, transpose, reverse and broadcast are free or fuse into their
consumer.  A view ``(shape, strides, offset)`` of a flat buffer is such a
chain exactly when its strides *nest*: dropping broadcast and size-1 dims,
reading flipped dims forwards (:func:`.strided.unflip`) and sorting by
stride, each stride is a multiple of the next finer one and a dim never
walks past the next coarser stride.  That covers every reshape, permute,
expand, slice (with step), select, flip and their compositions.  The plan is
then

    flat[pre_start:] -> pad/trim to pad_to -> reshape(box) -> slice(starts, limits)
    -> reshape(split) -> transpose(perm) -> reverse(rev) -> broadcast(shape, kept_axes)

where the *box* is the mixed-radix layout whose place values are the merged
(:func:`.strided.merge_runs`) strides.  :func:`run_box_plan` runs a plan
given the few ops it needs (numpy's, :class:`NumpyOps`, or a backend's).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Sequence

import numpy as np

from .strided import gather_index, merge_runs, unflip


@dataclass(frozen=True)
class SlicePlan:
    """A nesting view: flat slice, pad, box reshape, strided slice, then back to the view's shape."""

    pre_start: int  # first take flat[pre_start:]
    pad_to: int  # then pad with zeros at the end up to this length (trim if longer)
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


def box_plan(src_numel: int, shape: Sequence[int], strides: Sequence[int], offset: int):
    """A :class:`SlicePlan` for a non-empty view of a flat buffer, or the pair of output axes that do not nest."""
    shape, strides, offset = tuple(int(n) for n in shape), tuple(int(s) for s in strides), int(offset)
    kept = [d for d, (n, s) in enumerate(zip(shape, strides)) if n > 1 and s != 0]
    sizes = [shape[d] for d in kept]
    pos, offset, flipped = unflip(sizes, [strides[d] for d in kept], offset)
    order = sorted(range(len(kept)), key=lambda k: -pos[k])
    s_sorted = [pos[k] for k in order]
    n_sorted = [sizes[k] for k in order]
    for j in range(len(s_sorted) - 1):
        s, t, n = s_sorted[j], s_sorted[j + 1], n_sorted[j + 1]
        if s % t != 0 or n * t > s:
            return kept[order[j]], kept[order[j + 1]]
    m_sizes, m_strides = merge_runs(n_sorted, s_sorted)
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
        rev=tuple(flipped),
        kept_axes=tuple(kept),
        shape=shape,
    )


class NumpyOps:
    """The movement ops a plan needs, on numpy (exact and fast: the reference runner in tests)."""

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


def run_box_plan(flat, plan: SlicePlan, ops=None):
    """Run `plan` on the 1-D array `flat` with `ops` (default :class:`NumpyOps`)."""
    ops = ops or NumpyOps()
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


# -- overlapping views: a stack of nesting pieces, or a gather -------------------------------------------
# A view whose dimensions overlap (a sliding window) has no box plan; backends split it along its smallest
# offending dimension into a stack of nesting views, or, past MAX_STACK_PIECES pieces, read it with one
# gather of static flat indices (the reference definition, ``strided.gather_index``).

MAX_STACK_PIECES = 64  # overlapping views (backends split them into a stack of pieces): at most this many slices before using a gather


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


def plan_view(src_numel: int, shape: Sequence[int], strides: Sequence[int], offset: int,
              budget: int = MAX_STACK_PIECES):
    """A plan realising the view on a flat source of `src_numel` elements."""
    shape, strides, offset = tuple(int(n) for n in shape), tuple(int(s) for s in strides), int(offset)
    if prod(shape) == 0:
        return ZeroPlan(shape)
    plan = box_plan(src_numel, shape, strides, offset)
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
