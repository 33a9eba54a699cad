"""Index arithmetic for ``View`` in Triton kernels.

Which source index a view position reads is the IR's strided-view analysis
(:func:`egraft.ir.strided.digit_map`): when every view dimension walks
inside one "digit" of the source's row-major layout without carrying, each
source index is affine in the view index (``src_j = base_j + sum c * i_d``,
``c`` negative for flips), which keeps generated index code free of ``//``
and ``%``.  Other views (merging reshapes of a computed tensor) fall back to
divmod in the emitter (``rules._view``).
"""

from __future__ import annotations

from ...ir import shapes
from ...ir.strided import digit_map

__all__ = ["digit_map", "is_row_broadcast"]


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
