"""Shape and stride arithmetic, kept in one place.

A ``View(x, shape, strides, offset)`` indexes the *logical row-major
flattening* of ``x``: ``out[i] = flat(x)[offset + sum(i_d * strides_d)]``.
So a view of any tensor is well defined whether or not ``x`` is itself a
view; a backend decides how to materialise it.  Static integer shapes only;
symbolic dimensions would be added here.  What a view reads (digit maps,
composition, decomposition into movement ops) is analysed in :mod:`.strided`.
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
