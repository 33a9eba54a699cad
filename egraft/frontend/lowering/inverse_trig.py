"""Inverse trigonometric and hyperbolic functions, which have no IR primitive.

``atan`` is the classic three-interval argument reduction (|x| > tan(3pi/8):
pi/2 - atan(1/x); |x| > tan(pi/8): pi/4 + atan((x-1)/(x+1))) followed by an
odd degree-9 minimax polynomial on [-tan(pi/8), tan(pi/8)], accurate to about
one float32 ulp.  The other functions are identities on ``atan``, ``log`` and
``sqrt``, written in their cancellation-free forms.  All branches are
computed and chosen with ``Where``, which is IEEE-safe, so inf and nan in an
unused branch do not leak.  The odd functions give -0.0 at -0.0, as torch does.
"""

from __future__ import annotations

import math

from ...ir.builder import Tensor
from . import helpers as h
from .table import lowering

_TAN_3PI_8 = 2.414213562373095
_TAN_PI_8 = 0.4142135623730950
_HUGE = 2.0 ** 26  # beyond this sqrt(a^2 + 1) rounds to a, in float32 and float64 alike
_ATAN_POLY = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)


def atan(x: Tensor) -> Tensor:
    a = x.abs()
    big = a > _TAN_3PI_8
    mid = ~big & (a > _TAN_PI_8)
    u = Tensor.where(big, -(a.recip()), Tensor.where(mid, (a - 1.0) / (a + 1.0), a))
    base = Tensor.where(big, math.pi / 2, Tensor.where(mid, math.pi / 4, 0.0)).cast(x.dtype)
    z = u * u
    p = z * _ATAN_POLY[0] + _ATAN_POLY[1]
    for c in _ATAN_POLY[2:]:
        p = p * z + c
    r = base + (p * z * u + u)
    return _odd(x, r)


def _odd(x: Tensor, r: Tensor) -> Tensor:
    """An odd function's value from ``r`` = f(|x|): -r below zero, and x itself at +-0.0 and nan."""
    return Tensor.where(x < 0, -r, Tensor.where(x > 0, r, x))


@lowering("aten.atan", upcast=True)
def atan_rule(ctx, x):
    return atan(x.cast(ctx.dtype))


@lowering("aten.atan2", upcast=True)
def atan2(ctx, y, x):
    Y, X = h.operands(ctx, y, x, kind="INT_TO_FLOAT")
    inf = Y.builder.constant(math.inf, Y.dtype, Y.shape)
    both_inf = h.eq(Y.abs(), inf) & h.eq(X.abs(), inf)  # inf/inf is nan; the angle is an odd multiple of pi/4
    r = atan(Tensor.where(both_inf, Tensor.where((Y < 0) ^ (X < 0), -1.0, 1.0).cast(Y.dtype), Y / X))
    zero = Y.builder.constant(0.0, Y.dtype, Y.shape)
    neg_y = (Y < 0) | (h.eq(Y, zero) & (Y.recip() < 0))  # -0.0 counts as negative, as in C's atan2
    r = Tensor.where(X < 0, Tensor.where(neg_y, r - math.pi, r + math.pi), r)
    # x == 0 (or both 0): the quotient is +-inf or nan; take the limits directly
    on_axis = Tensor.where(Y > 0, math.pi / 2, Tensor.where(Y < 0, -math.pi / 2, 0.0)).cast(Y.dtype)
    both_zero = h.eq(X, zero) & h.eq(Y, zero)
    at_zero = Tensor.where(X.recip() < 0, Tensor.where(neg_y, -math.pi, math.pi).cast(Y.dtype), Y)
    r = Tensor.where(h.eq(X, zero), on_axis, r)
    r = Tensor.where(both_zero, at_zero, r)
    return Tensor.where(h.isnan(X), X, Tensor.where(h.isnan(Y), Y, r))


@lowering("aten.asin", upcast=True)
def asin(ctx, x):
    x = x.cast(ctx.dtype)
    return atan(x / ((1.0 - x) * (1.0 + x)).sqrt())


@lowering("aten.acos", upcast=True)
def acos(ctx, x):
    x = x.cast(ctx.dtype)
    return 2.0 * atan(((1.0 - x) / (1.0 + x)).sqrt())


@lowering("aten.asinh", upcast=True)
def asinh(ctx, x):
    x = x.cast(ctx.dtype)
    a = x.abs()
    # log(a + sqrt(a^2+1)); for small a use log1p's form to keep relative accuracy; for large a
    # (where a^2 overflows, and sqrt(a^2+1) is a) log(2a)
    r = Tensor.where(a > _HUGE, a.log() + math.log(2), h.log1p(a + a * a / (1.0 + (a * a + 1.0).sqrt())))
    return _odd(x, r)


@lowering("aten.acosh", upcast=True)
def acosh(ctx, x):
    x = x.cast(ctx.dtype)
    t = x - 1.0
    return Tensor.where(x > _HUGE, x.log() + math.log(2), h.log1p(t + (2.0 * t + t * t).sqrt()))


@lowering("aten.atanh", upcast=True)
def atanh(ctx, x):
    x = x.cast(ctx.dtype)
    return 0.5 * h.log1p(2.0 * x / (1.0 - x))
