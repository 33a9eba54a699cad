"""Shape and stride arithmetic, kept in one place.

A ``View(x, shape, strides, offset)`` indexes the *logical row-major
flattening* of ``x``: ``out[i] = flat(x)[offset + sum(i_d * strides_d)]``.
So a view of any tensor is well defined whether or not ``x`` is itself a
view; a backend decides how to materialise it.  Static integer shapes only;
symbolic dimensions would be added here.
"""

from __future__ import annotations

from math import prod
from typing import Sequence

from ..errors import IRError

Shape = tuple[int, ...]


def numel(shape: Sequence[int]) -> int:
    return int(prod(shape))


def contiguous_strides(shape: Sequence[int]) -> Shape:
    strides = []
    acc = 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(strides))


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise IRError(f"axis {axis} is out of range for a tensor of rank {rank}")
    return axis % rank if rank else 0


def broadcast_shapes(*shapes: Sequence[int]) -> Shape:
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise IRError(f"shapes {[tuple(s) for s in shapes]} cannot be broadcast together")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def view_extent(shape: Sequence[int], strides: Sequence[int], offset: int) -> tuple[int, int]:
    """Smallest and largest flat index a view touches (the view must be non-empty)."""
    lo = hi = offset
    for n, s in zip(shape, strides):
        if n == 0:
            return offset, offset
        step = (n - 1) * s
        if step < 0:
            lo += step
        else:
            hi += step
    return lo, hi


def check_view(src_shape: Sequence[int], shape: Sequence[int], strides: Sequence[int], offset: int) -> None:
    if len(shape) != len(strides):
        raise IRError(f"View shape {tuple(shape)} and strides {tuple(strides)} differ in rank")
    if any(n < 0 for n in shape):
        raise IRError(f"View shape {tuple(shape)} has a negative dimension")
    if numel(shape) == 0:
        return
    lo, hi = view_extent(shape, strides, offset)
    if lo < 0 or hi >= numel(src_shape):
        raise IRError(
            f"View (shape {tuple(shape)}, strides {tuple(strides)}, offset {offset}) reads flat "
            f"indices {lo}..{hi}, outside a source of shape {tuple(src_shape)} ({numel(src_shape)} elements)"
        )


def is_identity_view(src_shape, shape, strides, offset) -> bool:
    return (
        tuple(shape) == tuple(src_shape)
        and offset == 0
        and all(n == 1 or s == c for n, s, c in zip(shape, strides, contiguous_strides(shape)))
    )


def compose_views(
    inner_src_shape: Sequence[int],
    inner: tuple[Shape, Shape, int],
    outer: tuple[Shape, Shape, int],
) -> tuple[Shape, Shape, int] | None:
    """One view equal to ``outer`` applied to the result of ``inner``, or None.

    ``inner`` maps its logical index to a flat index of its source;
    ``outer`` maps its index to a flat index of the inner view's *logical*
    row-major layout.  The composition is strided exactly when every outer
    dimension walks inside one digit of the inner layout without carrying;
    that covers chains of reshape/permute/expand/slice.  When it does not
    hold, None is returned and the caller keeps both views.
    """
    ishape, istrides, ioff = inner
    oshape, ostrides, ooff = outer
    if numel(oshape) == 0 or numel(ishape) == 0:
        return None
    # Merge inner dims whose logical and physical strides both chain.
    sizes: list[int] = []
    phys: list[int] = []
    for n, s in zip(ishape, istrides):
        if n == 1:
            continue
        if sizes and phys[-1] == n * s:
            sizes[-1] *= n
            phys[-1] = s
        else:
            sizes.append(n)
            phys.append(s)
    if not sizes:
        sizes, phys = [1], [0]
    logical = contiguous_strides(sizes)
    # Digits of the base offset.
    rem = ooff
    base = []
    for L in logical:
        base.append(rem // L)
        rem %= L
    used = [0] * len(sizes)
    new_strides = []
    for n, s in zip(oshape, ostrides):
        if n == 1 or s == 0:
            new_strides.append(0)
            continue
        if s < 0:
            return None
        # the coarsest digit whose place value divides s and that absorbs the walk
        j = None
        for k in range(len(sizes)):
            L = logical[k]
            if s % L == 0 and (s // L) * (n - 1) < sizes[k]:
                j = k
                break
        if j is None:
            return None
        c = s // logical[j]
        used[j] += c * (n - 1)
        new_strides.append(c * phys[j])
    for k in range(len(sizes)):
        if base[k] + used[k] >= sizes[k]:
            return None
    off = ioff + sum(b * p for b, p in zip(base, phys))
    return tuple(oshape), tuple(new_strides), off
