"""Composite math on ``Tensor``: unary functions and reductions written in primitives.

The IR's transcendental primitives are Exp2, Log2, Sin, Sqrt and Recip;
exp, log, cos, tanh, erf, gelu, pow ... are compositions of them, and the
reductions beyond SumReduce/MaxReduce (min, mean, var, argmax, cumsum ...)
are compositions of those two.  Half-precision inputs of the longer
compositions run in float32 and round once (:func:`.tensor_base.in_float32`).
"""

from __future__ import annotations

import math

from . import dtypes, shapes
from .tensor_base import TensorBase, in_float32, reduce_axes

_where = TensorBase.where


class MathLib:
    """Mixin of :class:`~egraft.ir.builder.Tensor`: elementwise functions and reductions."""

    __slots__ = ()

    # -- the transcendental primitives ------------------------------------------------
    def exp2(self):
        return self._unary("Exp2")

    def log2(self):
        return self._unary("Log2")

    def sin(self):
        return self._unary("Sin")

    def sqrt(self):
        return self._unary("Sqrt")

    def recip(self):
        return self._unary("Recip")

    # -- composite elementwise functions --------------------------------------------------
    @in_float32
    def exp(self):
        return (self.float_() * (1 / math.log(2))).exp2()

    @in_float32
    def log(self):
        return self.log2() * math.log(2)

    @in_float32
    def cos(self):
        return (self.float_() + math.pi / 2).sin()

    def rsqrt(self):
        return self.sqrt().recip()

    def maximum(self, o):
        """Elementwise max; nan in either operand gives nan (torch.maximum, numpy.maximum)."""
        a, c = self._pair(o)
        take_c = (a < c) | c.isnan() if dtypes.is_float(a.dtype) else a < c
        return _where(take_c, c, a)

    def minimum(self, o):
        a, c = self._pair(o)
        take_c = (c < a) | c.isnan() if dtypes.is_float(a.dtype) else c < a
        return _where(take_c, c, a)

    def clamp(self, lo=None, hi=None):
        out = self
        if lo is not None:
            out = out.maximum(lo)
        if hi is not None:
            out = out.minimum(hi)
        return out

    def abs(self):
        # 0 - x, not -x, off the positive side: both zeros come out +0.0, as torch.abs gives (nan stays nan)
        return _where(self > 0, self, 0 - self)

    def sign(self):
        return _where(self > 0, 1, _where(self < 0, -1, 0)).cast(self.dtype)

    def relu(self):
        # select on `x < 0` so that nan passes through, as torch.relu does
        return _where(self < 0, self.builder.constant(0, self.dtype, self.shape), self)

    @in_float32
    def sigmoid(self):
        return (1 + (-self.float_()).exp()).recip()

    @in_float32
    def silu(self):
        return self * self.sigmoid()

    @in_float32
    def tanh(self):
        # 2*sigmoid(2x) - 1, written to stay finite for large |x|
        x = self.float_()
        t = 2 * (1 + (-2 * x).exp()).recip() - 1
        return _where((x < 0) | (x > 0), t, x)  # tanh(-0.0) is -0.0 (and nan stays nan)

    @in_float32
    def erf(self):
        """erf by a rational minimax approximation on [-4, 4] (float32-accurate)."""
        x = self.float_().maximum(-4.0).minimum(4.0)
        x2 = x * x
        alpha = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
                 -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
        beta = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
                -1.42647390514189e-02)
        p = x2 * alpha[0] + alpha[1]
        for c in alpha[2:]:
            p = p * x2 + c
        q = x2 * beta[0] + beta[1]
        for c in beta[2:]:
            q = q * x2 + c
        return x * p / q

    @in_float32
    def gelu(self, approximate: str = "none"):
        x = self.float_()
        if approximate == "tanh":
            return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
        return 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())

    def pow(self, e):
        """``self ** e``: small integer powers as products, others as exp2(e * log2(self))."""
        if isinstance(e, TensorBase):
            return (e * self.log2()).exp2()
        e = float(e)
        if e == int(e) and abs(e) <= 8:
            n = abs(int(e))
            out = self.builder.lift(1, self).expand(self.shape) if n == 0 else self
            for _ in range(n - 1):
                out = out * self
            return out.recip() if e < 0 else out
        if e == 0.5:
            return self.sqrt()
        if e == -0.5:
            return self.rsqrt()
        return (self.log2() * e).exp2()

    def trunc(self):
        if not dtypes.is_float(self.dtype):
            return self
        frac = self % 1.0  # nan exactly for +-inf and nan, which trunc leaves as they are
        t = self - frac
        t = _where((t < 0) | (t > 0), t, self * 0.0)  # a zero result keeps the input's sign: trunc(-0.5) is -0.0
        return _where(frac.isnan(), self, t)

    def floor(self):
        t = self.trunc()
        return _where(self < t, t - 1, t) if dtypes.is_float(self.dtype) else self

    def ceil(self):
        return -((-self).floor())

    # -- reductions --------------------------------------------------------------------
    def _reduce(self, op, axis, keepdim):
        axes = reduce_axes(axis, self.ndim)
        out = self
        for a in sorted(axes, reverse=True):
            out = self.builder.add(op, (out,), axis=a)
        if keepdim:
            out = out.reshape(tuple(1 if i in axes else n for i, n in enumerate(self.shape)))
        return out

    def sum(self, axis=None, keepdim=False):
        x = self.cast("int64") if self.dtype == "bool" else self
        return x._reduce("SumReduce", axis, keepdim)

    def max(self, axis=None, keepdim=False):
        return self._reduce("MaxReduce", axis, keepdim)

    def min(self, axis=None, keepdim=False):
        if self.dtype == "bool":
            return ~((~self).max(axis, keepdim))
        return -((-self).max(axis, keepdim))

    def any(self, axis=None, keepdim=False):
        return self.ne(0)._reduce("MaxReduce", axis, keepdim) if self.dtype != "bool" else self._reduce("MaxReduce", axis, keepdim)

    def all(self, axis=None, keepdim=False):
        b = self if self.dtype == "bool" else self.ne(0)
        return ~((~b).max(axis, keepdim))

    def mean(self, axis=None, keepdim=False):
        n = math.prod(self.shape[a] for a in reduce_axes(axis, self.ndim))
        return self.float_().sum(axis, keepdim) * (1.0 / n)

    def var(self, axis=None, correction=1, keepdim=False):
        axes = reduce_axes(axis, self.ndim)
        n = math.prod(self.shape[a] for a in axes)
        x = self.float_()
        d = x - x.mean(axes, keepdim=True)
        return (d * d).sum(axes, keepdim) * (1.0 / max(n - correction, 0) if n - correction > 0 else float("nan"))

    def argmax(self, axis: int, keepdim=False):
        """The first position of the maximum along `axis`: min over the positions that hit it."""
        axis = shapes.normalize_axis(axis, self.ndim)
        m = self.max(axis, keepdim=True)
        n = self.shape[axis]
        idx = self.builder.iota(n, "int64").reshape(tuple(n if i == axis else 1 for i in range(self.ndim)))
        cand = _where(self.eq(m), idx, n)
        return cand.min(axis, keepdim)

    @in_float32
    def logsumexp(self, axis, keepdim=False):
        m = self.max(axis, keepdim=True)
        out = (self - m).exp().sum(axis, keepdim=True).log() + m
        return out if keepdim else out.squeeze(reduce_axes(axis, self.ndim))

    def cumsum(self, axis: int):
        """Prefix sum along `axis` as a masked reduction (O(n^2), n = that axis)."""
        axis = shapes.normalize_axis(axis, self.ndim)
        n = self.shape[axis]
        x = self.cast("int64") if self.dtype == "bool" else self
        xm = x.movedim(axis, -1).unsqueeze(-2)  # [..., 1, n(j)]
        full = xm.expand(xm.shape[:-2] + (n, n))  # [..., i, j]
        i = self.builder.iota(n, "int64")
        keep = i.reshape((1, n)) <= i.reshape((n, 1))  # [i, j]: j <= i
        return _where(keep, full, self.builder.lift(0, x)).sum(-1).movedim(-1, axis)
