"""Index arithmetic for ``View``: which source index a view position reads.

A view reads the row-major flattening of its source:
``src_flat = offset + sum_d i_d * stride_d``.  When every view dimension walks
inside one "digit" of the source's row-major layout without carrying, the
source index is affine per dimension (``src_j = base_j + sum c * i_d``):
that covers expand, permute, slicing with steps, flips, selects and
splitting reshapes, and keeps generated index code free of ``//`` and ``%``.
Other views (merging reshapes of a computed tensor) fall back to divmod.
"""

from __future__ import annotations

from ...ir import shapes


def digit_map(src_shape, shape, strides, offset):
    """Per source dim j: (base_j, [(view dim d, coefficient c), ...]); None when not per-digit."""
    src_shape = tuple(src_shape)
    if shapes.numel(src_shape) == 0 or shapes.numel(shape) == 0:
        return None
    cs = shapes.contiguous_strides(src_shape)
    real = [j for j, n in enumerate(src_shape) if n > 1]
    base = [0] * len(src_shape)
    rem = offset
    for j in real:
        base[j], rem = divmod(rem, cs[j])
    if rem:
        return None
    terms: list[list] = [[] for _ in src_shape]
    lo = [0] * len(src_shape)
    hi = [0] * len(src_shape)
    for d, (n, s) in enumerate(zip(shape, strides)):
        if n == 1 or s == 0:
            continue
        for j in real:
            if s % cs[j] == 0 and abs(s // cs[j]) * (n - 1) < src_shape[j]:
                c = s // cs[j]
                terms[j].append((d, c))
                if c > 0:
                    hi[j] += c * (n - 1)
                else:
                    lo[j] += c * (n - 1)
                break
        else:
            return None
    for j in range(len(src_shape)):
        if base[j] + lo[j] < 0 or base[j] + hi[j] >= src_shape[j]:
            return None
    return [(base[j], terms[j]) for j in range(len(src_shape))]


def is_row_broadcast(src_shape, shape, strides, offset, axis) -> bool:
    """True when the view is ``src`` (the source with `axis` reduced away) broadcast back along `axis`.

    This is the keepdim-reshape + expand the builder writes after a reduction
    (``x - x.max(-1, keepdim=True)``); such a use reads the reduced value at
    the same row, so the reduction can share the consumer's row tile.
    """
    if offset != 0 or len(shape) != len(src_shape) + 1 or axis is None:
        return False
    if tuple(shape[:axis]) + tuple(shape[axis + 1:]) != tuple(src_shape):
        return False
    cs = shapes.contiguous_strides(src_shape)
    want = list(cs[:axis]) + [0] + list(cs[axis:])
    return all(n == 1 or s == w for n, s, w in zip(shape, strides, want))
