"""Python operators on ``Tensor``: arithmetic, comparisons and logic, in the IR's few primitives.

The IR has Add, Mul, Recip, Mod, LessThan and Where; everything else here is
written with them (``a - b`` is ``a + b * -1``, ``a >= b`` is ``not (a < b)``
with nan excluded), so backends and rewrites only ever see those.
"""

from __future__ import annotations

import math

from ..errors import IRError
from . import dtypes, shapes
from .tensor_base import TensorBase


class Operators:
    """Mixin of :class:`~egraft.ir.builder.Tensor`: ``+ - * / % < <= > >= ~ & | ^`` and friends."""

    __slots__ = ()

    def __add__(self, o):
        return self._binop("Add", o)

    def __radd__(self, o):
        return self.builder.lift(o, self)._binop("Add", self)

    def __mul__(self, o):
        return self._binop("Mul", o)

    def __rmul__(self, o):
        return self.builder.lift(o, self)._binop("Mul", self)

    def __neg__(self):
        if self.dtype == "bool":
            raise IRError("cannot negate a bool tensor")
        return self * -1

    def __sub__(self, o):
        return self + (-self.builder.lift(o, self))

    def __rsub__(self, o):
        return self.builder.lift(o, self) + (-self)

    def __truediv__(self, o):
        a, c = self._pair(o)
        if not dtypes.is_float(a.dtype):
            a, c = a.cast("float32"), c.cast("float32")
        return a * c.recip()

    def __rtruediv__(self, o):
        return self.builder.lift(o, self).__truediv__(self)

    def __mod__(self, o):
        """Truncated remainder (C semantics), the IR's Mod."""
        return self._binop("Mod", o)

    def unpack_int4(self):
        """int8 bytes ``[..., m]`` (16 divides m) -> int8 values ``[..., 2m]`` in -8..7: in each block of 16 bytes,
        bits 0-3 of each byte, then bits 4-7 of each (two's complement; the packed int4 weights of
        ``egraft.frontend.quantize``).  Each byte is read twice through a stride-0 view and the IR's ``Nibble``
        takes the field its position's parity names."""
        if self.dtype != "int8" or not self.ndim or self.shape[-1] % 16:
            raise IRError(f"unpack_int4 reads int8 bytes [..., m] in blocks of 16, got {self.dtype} {self.shape}")
        lead, m = self.shape[:-1], self.shape[-1]
        blocks = lead + (m // 16, 2, 16)
        twice = self.view_as_strided(blocks, shapes.contiguous_strides(self.shape)[:-1] + (16, 0, 1))
        pos = self.builder.iota(2, "int8").view_as_strided(blocks, (0,) * (len(lead) + 1) + (1, 0))  # low, high
        return twice._binop("Nibble", pos).reshape(lead + (2 * m,))

    def floor_mod(self, o):
        """Python/torch `%`: the result takes the divisor's sign."""
        a, c = self._pair(o)
        r = a % c
        fix = ((r < 0) & (c > 0)) | ((r > 0) & (c < 0))
        return TensorBase.where(fix, r + c, r)

    def __lt__(self, o):
        return self._binop("LessThan", o)

    def __gt__(self, o):
        return self.builder.lift(o, self)._binop("LessThan", self)

    def __le__(self, o):
        a, c = self._pair(o)
        return c >= a

    def __ge__(self, o):
        # not(a < c) alone would call nan >= x true; comparisons with nan are false
        a, c = self._pair(o)
        ge = ~(a < c)
        return ge & ~(a.isnan() | c.isnan()) if dtypes.is_float(a.dtype) else ge

    def eq(self, o):
        a, c = self._pair(o)
        eq = ~(a < c) & ~(c < a)
        return eq & ~(a.isnan() | c.isnan()) if dtypes.is_float(a.dtype) else eq

    def ne(self, o):
        return ~self.eq(o)

    def isnan(self):
        """True where the value is nan: the only value neither below inf nor above -inf."""
        if not dtypes.is_float(self.dtype):
            return self.builder.constant(False, "bool", self.shape)
        return ~((self < math.inf) | (self > -math.inf))

    def __invert__(self):
        if self.dtype != "bool":
            raise IRError("~ is logical not and needs a bool tensor")
        return TensorBase.where(self, False, True)

    def __and__(self, o):
        return self._binop("Mul", o, "bool")

    def __or__(self, o):
        return self._binop("Add", o, "bool")

    def __xor__(self, o):
        return self.ne(o)
