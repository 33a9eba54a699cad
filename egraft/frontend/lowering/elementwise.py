"""Elementwise ATen ops: arithmetic, comparisons, logic, math functions, selections (activations: :mod:`.activations`).

Binary rules first promote both operands to torch's result dtype (python
scalars become constants of that dtype), so ``bool + 2`` is an integer add,
not a logical or.  Multi-step float functions (``exp`` is ``exp2(x*log2e)``,
``gelu`` a dozen ops) are registered with ``upcast=True``: half-precision
arguments are computed in float32 and rounded once, as torch's CPU kernels do.
"""

from __future__ import annotations

import math

from ...ir import dtypes
from ...ir.builder import Tensor
from . import helpers as h
from .table import lowering


# --- arithmetic ------------------------------------------------------------------------

@lowering("aten.add")
def add(ctx, a, b, alpha=1):
    A, B = h.operands(ctx, a, b)
    return A + (B if alpha == 1 else B * alpha)


@lowering("aten.sub", "aten.rsub")
def sub(ctx, a, b, alpha=1):
    if ctx.op.startswith("aten.rsub"):
        a, b = b, a
    A, B = h.operands(ctx, a, b)
    return A - (B if alpha == 1 else B * alpha)


@lowering("aten.mul")
def mul(ctx, a, b):
    A, B = h.operands(ctx, a, b)
    for flag, other in ((a, B), (b, A)):
        if isinstance(flag, Tensor) and flag.dtype == "bool" and dtypes.is_float(other.dtype):
            # bool * x as a select that keeps IEEE's False * x = 0 * x (nan for nan and inf, -0.0 for x < 0): XLA
            # would rewrite convert(bool) * x into select(bool, x, 0) itself, which drops both
            return Tensor.where(flag, other, other * 0.0)
    return A * B


def _trunc_div(A: Tensor, B: Tensor) -> Tensor:
    """Integer division rounding toward zero (C semantics), exact for |quotient| < 2**52."""
    r = A % B
    q = (A - r).cast("float64") * B.cast("float64").recip()
    return Tensor.where(q < 0, q - 0.5, q + 0.5).cast(A.dtype)


def _floor_div_float(A: Tensor, B: Tensor) -> Tensor:
    """torch's floor division on floats (``div_floor_floating``): exact quotient of a - fmod(a, b)."""
    mod = A % B
    div = (A - mod) / B
    div = Tensor.where(mod.ne(0) & ((B < 0) ^ (mod < 0)), div - 1, div)
    fl = div.floor()
    fl = Tensor.where((div - fl) > 0.5, fl + 1, fl)
    exact = Tensor.where(div.eq(0), (A / B) * 0.0, fl)  # keeps the sign of a zero quotient
    return Tensor.where(B.eq(0), A / B, exact)


@lowering("aten.div", "aten.true_divide", "aten.floor_divide")
def div(ctx, a, b, rounding_mode=None):
    if ctx.op.startswith("aten.floor_divide"):
        rounding_mode = "floor"
    if rounding_mode is None:
        A, B = h.operands(ctx, a, b, kind="INT_TO_FLOAT")
        return A / B
    A, B = h.operands(ctx, a, b)
    if dtypes.is_float(A.dtype):
        return (A / B).trunc() if rounding_mode == "trunc" else _floor_div_float(A, B)
    q = _trunc_div(A, B)
    if rounding_mode == "trunc":
        return q
    r = A % B
    return Tensor.where(r.ne(0) & ((r < 0) ^ (B < 0)), q - 1, q)


@lowering("aten.remainder")
def remainder(ctx, a, b):
    A, B = h.operands(ctx, a, b)
    return A.floor_mod(B)


@lowering("aten.fmod")
def fmod(ctx, a, b):
    A, B = h.operands(ctx, a, b)
    return A % B


@lowering("aten.pow", upcast=True)
def pow_(ctx, a, b):
    if not isinstance(b, Tensor):  # Tensor_Scalar
        A = a.cast(ctx.dtype)
        e = float(b)
        if e == int(e) and abs(e) <= 64:
            out = h.int_pow(A, abs(int(e)))
            return out if e >= 0 else out.float_().recip()
        if e == 0.5:
            return A.sqrt()
        if e == -0.5:
            return A.rsqrt()
        return _pow_float(A, A.builder.constant(e, A.dtype, A.shape))
    A, B = h.operands(ctx, a, b)
    out = _pow_float(A.float_(), B.float_())
    return h.round_half_even(out) if not dtypes.is_float(A.dtype) else out


def _pow_float(x: Tensor, y: Tensor) -> Tensor:
    """x**y = exp2(y*log2|x|), with C's (and torch's) special cases: a finite negative base needs an integer
    exponent, an odd one keeps the base's sign (-0.0 included), and 1**y, (-1)**+-inf and x**0 are 1."""
    c = lambda v: y.builder.constant(v, y.dtype, y.shape)  # noqa: E731
    r = (y * x.abs().log2()).exp2()
    y_int = h.eq(y, y.trunc())
    y_odd = h.eq(y.abs() % 2.0, c(1.0))  # false for +-inf and nan
    r = Tensor.where(y_odd & _sign_bit(x), -r, r)
    r = Tensor.where((x < 0) & (x > -math.inf) & ~y_int, math.nan, r)  # (-inf)**y is +-0 or +-inf
    one = h.eq(y, c(0.0)) | h.eq(x, c(1.0)) | (h.eq(x, c(-1.0)) & h.eq(y.abs(), c(math.inf)))
    return Tensor.where(one, 1.0, r).cast(x.dtype)


def _sign_bit(x: Tensor) -> Tensor:
    """x < 0, and -0.0 (whose reciprocal is -inf)."""
    return (x < 0) | (h.eq(x, x.builder.constant(0.0, x.dtype, x.shape)) & (x.recip() < 0))


# --- unary math ----------------------------------------------------------------------------

def _float_unary(method):
    def rule(ctx, x):
        return getattr(x.cast(ctx.dtype), method)()
    return rule


for _name, _method, _up in [
    ("aten.exp", "exp", True), ("aten.exp2", "exp2", False), ("aten.log", "log", True),
    ("aten.log2", "log2", False), ("aten.sqrt", "sqrt", False), ("aten.rsqrt", "rsqrt", True),
    ("aten.reciprocal", "recip", False), ("aten.sin", "sin", False), ("aten.cos", "cos", True),
    ("aten.tanh", "tanh", True), ("aten.sigmoid", "sigmoid", True), ("aten.erf", "erf", True),
]:
    lowering(_name, upcast=_up)(_float_unary(_method))


@lowering("aten.log10", upcast=True)
def log10(ctx, x):
    return x.cast(ctx.dtype).log2() * (math.log(2) / math.log(10))


@lowering("aten.log1p", upcast=True)
def log1p(ctx, x):
    return h.log1p(x.cast(ctx.dtype))


@lowering("aten.expm1", upcast=True)
def expm1(ctx, x):
    x = x.cast(ctx.dtype)
    # (e^x - 1) * x / log(e^x) corrects the cancellation near 0 (Kahan's trick)
    u = x.exp()
    um1 = u - 1.0
    r = Tensor.where(u.eq(1.0), x, Tensor.where(um1.eq(-1.0), -1.0, um1 * x / u.log()))
    return Tensor.where(h.eq(u, u.builder.constant(math.inf, u.dtype, u.shape)), u, r)  # inf*x/inf is nan


@lowering("aten.tan", upcast=True)
def tan(ctx, x):
    """sin/cos in float64: near odd multiples of pi/2, cos's float32 rounding becomes tan's relative error."""
    return (x.cast("float64").sin() / x.cast("float64").cos()).cast(ctx.dtype)


@lowering("aten.sinh", upcast=True)
def sinh(ctx, x):
    x = x.cast(ctx.dtype)
    return _odd_at_zero(x, (x.exp() - (-x).exp()) * 0.5)


def _odd_at_zero(x: Tensor, r: Tensor) -> Tensor:
    """``r`` = f(x) for an odd f with f(0) = 0, with f(-0.0) = -0.0 (a difference of equal terms is +0.0)."""
    return Tensor.where((x < 0) | (x > 0), r, x)


@lowering("aten.cosh", upcast=True)
def cosh(ctx, x):
    x = x.cast(ctx.dtype)
    return (x.exp() + (-x).exp()) * 0.5


@lowering("aten.erfc", upcast=True)
def erfc(ctx, x):
    return 1.0 - x.cast(ctx.dtype).erf()


@lowering("aten.copysign")
def copysign(ctx, a, b):
    A, B = h.operands(ctx, a, b, kind="INT_TO_FLOAT")
    mag = A.abs()
    return Tensor.where(_sign_bit(B), -mag, mag)  # -0.0 has a sign too


@lowering("aten.hypot", upcast=True)
def hypot(ctx, a, b):
    A, B = h.operands(ctx, a, b)
    inf = A.builder.constant(math.inf, A.dtype, A.shape)
    return Tensor.where(h.eq(A.abs(), inf) | h.eq(B.abs(), inf), inf, (A * A + B * B).sqrt())  # hypot(inf, nan) is inf


@lowering("aten.signbit")
def signbit(ctx, x):
    return _sign_bit(x) if dtypes.is_float(x.dtype) else x < 0


@lowering("aten.neg")
def neg(ctx, x):
    return -x


@lowering("aten.abs")
def abs_(ctx, x):
    return x if x.dtype == "bool" else x.abs()


@lowering("aten.sign", "aten.sgn")
def sign(ctx, x):
    return x if x.dtype == "bool" else x.sign()  # torch: sign(nan) and sign(-0.0) are +0.0


@lowering("aten.floor")
def floor(ctx, x):
    return x.floor()


@lowering("aten.ceil")
def ceil(ctx, x):
    return x.ceil()


@lowering("aten.trunc")
def trunc(ctx, x):
    return x.trunc()


@lowering("aten.frac")
def frac(ctx, x):
    return x - x.trunc()


@lowering("aten.round")
def round_(ctx, x, decimals=0):
    if not dtypes.is_float(x.dtype):
        return x
    if decimals == 0:
        return h.round_half_even(x)
    scale = 10.0 ** decimals
    return h.round_half_even(x * scale) / scale


@lowering("aten.isnan")
def isnan(ctx, x):
    return h.isnan(x)


@lowering("aten.isinf")
def isinf(ctx, x):
    if not dtypes.is_float(x.dtype):
        return x.builder.constant(False, "bool", x.shape)
    return h.eq(x.abs(), x.builder.constant(math.inf, x.dtype, x.shape))


@lowering("aten.isfinite")
def isfinite(ctx, x):
    if not dtypes.is_float(x.dtype):
        return x.builder.constant(True, "bool", x.shape)
    return x.abs() < math.inf


# --- selections ----------------------------------------------------------------------------

@lowering("aten.maximum", "aten.fmax")
def maximum(ctx, a, b):
    A, B = h.operands(ctx, a, b)
    if ctx.op.startswith("aten.fmax"):  # NaN loses
        return Tensor.where(h.isnan(B), A, Tensor.where((A < B) | h.isnan(A), B, A))
    return h.maximum(A, B)


@lowering("aten.minimum", "aten.fmin")
def minimum(ctx, a, b):
    A, B = h.operands(ctx, a, b)
    if ctx.op.startswith("aten.fmin"):
        return Tensor.where(h.isnan(B), A, Tensor.where((B < A) | h.isnan(A), B, A))
    return h.minimum(A, B)


@lowering("aten.where")
def where(ctx, cond, a=None, b=None):
    if a is None:
        raise ctx.unsupported("one-argument form", "torch.where(cond) returns data-dependent shapes; "
                              "use torch.where(cond, a, b)")
    A, B = h.operands(ctx, a, b)
    c = cond if cond.dtype == "bool" else cond.ne(0)
    return Tensor.where(c, A, B)


@lowering("aten.masked_fill")
def masked_fill(ctx, x, mask, value):
    v = ctx.tensor(value, x.dtype)
    return Tensor.where(mask, v, x)


@lowering("aten.lerp", upcast=True)
def lerp(ctx, a, b, weight):
    dt = ctx.promote(a, b, weight)
    A, B = a.cast(dt), b.cast(dt)
    w = ctx.tensor(weight, dt)
    # torch's two-sided form (exact at w = 1): from a for |w| < 0.5, from b otherwise
    d = B - A
    return Tensor.where(w.abs() < 0.5, A + w * d, B - d * (1.0 - w))


# --- comparisons and logic ----------------------------------------------------------------------

def _compare(fn, swap=False):
    def rule(ctx, a, b):
        A, B = h.operands(ctx, a, b)
        return fn(B, A) if swap else fn(A, B)
    return rule


lowering("aten.eq")(_compare(h.eq))
lowering("aten.ne")(_compare(lambda a, b: ~h.eq(a, b)))
lowering("aten.lt")(_compare(h.lt))
lowering("aten.le")(_compare(h.le))
lowering("aten.gt")(_compare(h.lt, swap=True))
lowering("aten.ge")(_compare(h.le, swap=True))


def _as_bool(ctx, v):
    if isinstance(v, Tensor):
        return v if v.dtype == "bool" else ~h.eq(v, v.builder.constant(0, v.dtype, v.shape))
    return ctx.builder.constant(bool(v), "bool")


def _logical(fn):
    def rule(ctx, a, b):
        A, B = _as_bool(ctx, a), _as_bool(ctx, b)
        return fn(A, B)
    return rule


lowering("aten.logical_and")(_logical(lambda a, b: a & b))
lowering("aten.logical_or")(_logical(lambda a, b: a | b))
lowering("aten.logical_xor")(_logical(lambda a, b: a ^ b))


@lowering("aten.logical_not")
def logical_not(ctx, x):
    return ~_as_bool(ctx, x)


def _bitwise(fn, name):
    def rule(ctx, a, b):
        A, B = h.operands(ctx, a, b)
        if A.dtype != "bool":
            raise ctx.unsupported(f"on {A.dtype}", f"egraft lowers bitwise {name} on bool tensors only; "
                                  "integer bit manipulation has no IR primitive")
        return fn(A, B)
    return rule


lowering("aten.bitwise_and")(_bitwise(lambda a, b: a & b, "and"))
lowering("aten.bitwise_or")(_bitwise(lambda a, b: a | b, "or"))
lowering("aten.bitwise_xor")(_bitwise(lambda a, b: a ^ b, "xor"))


@lowering("aten.bitwise_not")
def bitwise_not(ctx, x):
    if x.dtype == "bool":
        return ~x
    return -x - 1  # two's complement: ~x == -x - 1
