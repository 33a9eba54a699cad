"""The core of the builder's ``Tensor`` handle: identity, type, dtype promotion and selection.

``Tensor`` (in :mod:`.builder`) is this base combined with one mixin per
concern (operators, composite math, movement, idiom forms); each mixin
calls the others' methods through ``self``, so this module is the only one
they all import and none of them imports another.
"""

from __future__ import annotations

import functools

from ..errors import IRError
from . import dtypes, shapes
from .graph import Node


def in_float32(fn):
    """Run a composite math function on half inputs in float32 and round once at the end.

    torch computes exp/erf/gelu/softmax/norms of float16 and bfloat16 tensors in
    float32 ("opmath") and rounds the result once; rounding every step of a
    decomposition to half instead (a 20-op erf polynomial, an exp whose
    1/ln 2 constant is itself rounded to half) was measured 2% off torch's
    float16 gelu, beyond the float16 tolerance.
    """

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        if dtypes.is_half(self.dtype):
            return fn(self.cast(dtypes.compute_name(self.dtype)), *args, **kwargs).cast(self.dtype)
        return fn(self, *args, **kwargs)

    return wrapper


promote = dtypes.promote  # the dtype two operands meet in (the table's promotion ranks)


def reduce_axes(axis, rank) -> tuple[int, ...]:
    """`axis` (None: all, an int, or several) as sorted non-negative axes of a rank-`rank` tensor."""
    if axis is None:
        return tuple(range(rank))
    if isinstance(axis, int):
        axis = (axis,)
    return tuple(sorted({shapes.normalize_axis(a, rank) for a in axis}))


class TensorBase:
    """A handle on one builder node; arithmetic on it appends IR nodes.

    ``builder`` is the :class:`GraphBuilder` the node lives in and ``id`` its
    node id there.  ``b`` is the old short name of ``builder``, kept while
    callers move over.
    """

    __slots__ = ("builder", "id")
    __array_priority__ = 1000  # numpy defers to our reflected operators: array * tensor is a Tensor

    def __init__(self, builder, id: int):
        self.builder, self.id = builder, id

    @property
    def node(self) -> Node:
        return self.builder.nodes[self.id]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> str:
        return self.node.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self):
        return f"Tensor(%{self.id} {self.node.op} {list(self.shape)} {self.dtype})"

    __hash__ = object.__hash__  # handles hash by identity; elementwise equality is eq()

    # -- operand alignment ---------------------------------------------------------
    def _pair(self, other, dtype=None):
        """`self` and `other` cast to one dtype and expanded to one shape (numpy broadcasting)."""
        o = self.builder.lift(other, self)
        dt = dtype or promote(self.dtype, o.dtype)
        a, c = self.cast(dt), o.cast(dt)
        shape = shapes.broadcast_shapes(a.shape, c.shape)
        return a.expand(shape), c.expand(shape)

    def _binop(self, op, other, dtype=None):
        a, c = self._pair(other, dtype)
        return self.builder.add(op, (a, c))

    def _unary(self, op):
        return self.builder.add(op, (self.float_(),))

    def cast(self, dtype: str):
        return self if dtype == self.dtype else self.builder.add("Cast", (self,), dtype=dtype)

    def float_(self):
        """`self` if floating point, else cast to float32 (what a float op of an int tensor computes in)."""
        return self if dtypes.is_float(self.dtype) else self.cast("float32")

    @staticmethod
    def where(cond, a, b):
        """Select `a` where `cond` else `b`; either may be a Python scalar, all broadcast together."""
        ref = next((t for t in (cond, a, b) if isinstance(t, TensorBase)), None)
        if ref is None:
            raise IRError("where needs at least one Tensor operand")
        bld = ref.builder
        cond = bld.lift(cond, ref) if isinstance(cond, TensorBase) else bld.constant(bool(cond), "bool")
        if not isinstance(a, TensorBase) and not isinstance(b, TensorBase):
            dt = "bool" if isinstance(a, bool) and isinstance(b, bool) else (
                "float32" if isinstance(a, float) or isinstance(b, float) else "int64")
            a, b = bld.constant(a, dt), bld.constant(b, dt)
        elif not isinstance(a, TensorBase):
            a = bld.lift(a, b)
        elif not isinstance(b, TensorBase):
            b = bld.lift(b, a)
        if cond.dtype != "bool":
            cond = cond.ne(0)
        dt = promote(a.dtype, b.dtype)
        a, b = a.cast(dt), b.cast(dt)
        shape = shapes.broadcast_shapes(cond.shape, a.shape, b.shape)
        return bld.add("Where", (cond.expand(shape), a.expand(shape), b.expand(shape)))
