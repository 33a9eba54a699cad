"""Algebra rules: identities, constant folding, exp2/log2/recip, distributivity, comm/assoc.

Floating-point policy: a rule may change results at the rounding level
(reassociation, 1/(1/x)); it may NOT change them where an input value is
ordinary.  So identities that only hold on part of the domain are guarded
(``exp2(log2 a) = a`` needs ``a >= 0``, via the ``nonneg`` analysis) or left
out (``log2(exp2 x) = x`` fails once exp2 overflows; ``x * recip(x) = 1``
fails at 0 and inf; ``x + 0 = x`` flips -0.0, so it is kept to int/bool).
The sign of zero is otherwise not tracked.  Folded constants must be finite
and non-zero (egglog equates -0.0 with 0.0).

A scalar literal appears either broadcast, ``(View (ScalarF v d) s st o)``,
or bare for rank-0 operands, ``(ScalarF v d)``; rules list both forms and both
operand orders (comm/assoc are explosive, so the safe phase cannot rely on them).
"""

from __future__ import annotations

from ...ir.builder import GraphBuilder, Tensor
from ...ir.dtypes import FLOAT_DTYPES
from ..rule import RuleSpec, Witness, pair, program, rand_shape


def _lit(ctor: str, v: str, d: str = "d", k: int = 0) -> list[str]:
    """A scalar literal pattern, broadcast and bare."""
    return [f"(View ({ctor} {v} {d}) s{k} st{k} o{k})", f"({ctor} {v} {d})"]


def _both(op: str, a: str, b: str) -> list[str]:
    return [f"({op} {a} {b})", f"({op} {b} {a})"]


def _rewrites(lhs_list, rhs, when: str = "") -> str:
    w = f" :when ({when})" if when else ""
    return "\n".join(f"(rewrite {lhs} {rhs}{w})" for lhs in lhs_list)


def _unions(lhs_list, rhs, facts: str = "") -> str:
    return "\n".join(f"(rule ((= e {lhs}) {facts}) ((union e {rhs})))" for lhs in lhs_list)


def _int_dtype_guard(d="d"):
    return " ".join(f'(!= {d} "{f}")' for f in FLOAT_DTYPES)


# -- identities -------------------------------------------------------------------

MUL_ONE = "\n".join(
    _rewrites(_both("Mul", "x", lit), "x") for lit in _lit("ScalarF", "1.0") + _lit("ScalarI", "1")
)
ADD_ZERO_INT = "\n".join(
    _rewrites(_both("Add", "x", lit), "x", f"(= d (dtype x)) {_int_dtype_guard()}") for lit in _lit("ScalarI", "0")
)


def _fold(op: str, fn: str, nonzero: bool) -> str:
    """c1 op c2 -> literal, and (x op c1) op c2 -> x op literal."""
    guard = f"(< (abs ({fn} a b)) 1e300)" + (f" (!= ({fn} a b) 0.0)" if nonzero else "")
    out = []
    for (la, lb) in (( "(View (ScalarF a d) s st o)", "(View (ScalarF b d) s st o)"), ("(ScalarF a d)", "(ScalarF b d)")):
        res = la.replace("a d", f"({fn} a b) d")
        out.append(_unions([f"({op} {la} {lb})"], res, guard))
        inner = _both(op, "x", la)
        out.append(_unions([f"({op} {i} {lb})" for i in inner] + [f"({op} {lb} {i})" for i in inner],
                           f"({op} x {res})", guard))
    return "\n".join(out)


FOLD_MUL = _fold("Mul", "*", nonzero=True)
FOLD_ADD = _fold("Add", "+", nonzero=False)

# -- exp2 / log2 / recip / sqrt -------------------------------------------------------

EXP2_LOG2 = "(rule ((= e (Exp2 (Log2 a))) (nonneg a)) ((union e a)))"
EXP2_MUL = "(rewrite (Mul (Exp2 a) (Exp2 b)) (Exp2 (Add a b)))"
RECIP_RECIP = "(rewrite (Recip (Recip x)) x)"
RECIP_MUL = "(birewrite (Recip (Mul a b)) (Mul (Recip a) (Recip b)))"
RECIP_EXP2 = ("(rule ((= e (Recip (Exp2 x))) (= s (shape x)) (= d (dtype x)) (= z (zeros (vec-length s))))"
              " ((union e (Exp2 (Mul x (View (ScalarF -1.0 d) s z 0))))))")
RECIP_SQRT = "(birewrite (Recip (Sqrt x)) (Sqrt (Recip x)))"
SQRT_SQUARE = "(rule ((= e (Mul (Sqrt x) (Sqrt x))) (nonneg x)) ((union e x)))"
SQRT_MUL = "(rule ((= e (Mul (Sqrt a) (Sqrt b))) (nonneg a) (nonneg b)) ((union e (Sqrt (Mul a b)))))"

# -- casts / where ---------------------------------------------------------------------

CAST_ROUNDTRIP = "\n".join(
    f'(rule ((= e (Cast (Cast x "float64") d)) (= d (dtype x)) (= d "{dt}")) ((union e x)))'
    for dt in FLOAT_DTYPES if dt != "float64"
)
CAST_NOOP = "(rule ((= e (Cast x d)) (= d (dtype x))) ((union e x)))"
WHERE_SAME = "(rewrite (Where c a a) a)"
WHERE_CONST = "\n".join([
    "(rewrite (Where (View (ScalarI 1 \"bool\") s st o) a b) a)",
    "(rewrite (Where (View (ScalarI 0 \"bool\") s st o) a b) b)",
    "(rewrite (Where (ScalarI 1 \"bool\") a b) a)",
    "(rewrite (Where (ScalarI 0 \"bool\") a b) b)",
])

# -- distributivity, comm, assoc ----------------------------------------------------------

FACTOR = "\n".join([
    "(rewrite (Add (Mul a c) (Mul b c)) (Mul (Add a b) c))",
    "(rewrite (Add (Mul c a) (Mul c b)) (Mul c (Add a b)))",
    "(rewrite (Add (Mul a c) (Mul c b)) (Mul (Add a b) c))",
    "(rewrite (Add (Mul c a) (Mul b c)) (Mul (Add a b) c))",
])
EXPAND = "(rewrite (Mul (Add a b) c) (Add (Mul a c) (Mul b c)))\n(rewrite (Mul c (Add a b)) (Add (Mul c a) (Mul c b)))"
COMM = "(rewrite (Add a b) (Add b a))\n(rewrite (Mul a b) (Mul b a))"
ASSOC = "(birewrite (Add a (Add b c)) (Add (Add a b) c))\n(birewrite (Mul a (Mul b c)) (Mul (Mul a b) c))"


# -- witnesses ------------------------------------------------------------------------------

def _s(rng, rank=None):
    return rand_shape(rng, rank)


def _w_mul_one(rng):
    s = _s(rng)
    return pair(lambda x: (x * 1.0) * 1.5, lambda x: x * 1.5, s)


def _w_add_zero(rng):
    s = _s(rng)
    return Witness(program(lambda x: ((x.cast("int64") + 0) * 3).cast("float32"), s))


def _w_fold_mul(rng):
    s = _s(rng)
    c1, c2 = float(rng.uniform(0.5, 2)), float(rng.uniform(-2, -0.5))
    return pair(lambda x: (x * c1) * c2, lambda x: x * (c1 * c2), s)


def _w_fold_add(rng):
    s = _s(rng)
    c1, c2 = float(rng.uniform(0.5, 2)), float(rng.uniform(-2, -0.5))
    return pair(lambda x: (x + c1) + c2, lambda x: x + (c1 + c2), s)


def _w_exp2_log2(rng):
    s = _s(rng)
    return pair(lambda x: (x * x).log2().exp2(), lambda x: x * x, s)


def _w_exp2_mul(rng):
    s = _s(rng)
    return pair(lambda x, y: x.exp2() * y.exp2(), lambda x, y: (x + y).exp2(), s, s)


def _w_recip_recip(rng):
    s = _s(rng)
    return pair(lambda x: (x * x + 1.0).recip().recip(), lambda x: x * x + 1.0, s)


def _w_recip_mul(rng):
    s = _s(rng)
    return pair(lambda x, y: (_pos(x) * _pos(y)).recip(), lambda x, y: _pos(x).recip() * _pos(y).recip(), s, s)


def _pos(t):
    return t * t + 0.5


def _w_recip_exp2(rng):
    s = _s(rng)
    return pair(lambda x: x.exp2().recip(), lambda x: (-x).exp2(), s)


def _w_recip_sqrt(rng):
    s = _s(rng)
    return pair(lambda x: _pos(x).sqrt().recip(), lambda x: _pos(x).recip().sqrt(), s)


def _w_sqrt_square(rng):
    s = _s(rng)
    return pair(lambda x: _pos(x).sqrt() * _pos(x).sqrt(), lambda x: _pos(x), s)


def _w_sqrt_mul(rng):
    s = _s(rng)
    return pair(lambda x, y: (x * x).sqrt() * y.exp2().sqrt(), lambda x, y: ((x * x) * y.exp2()).sqrt(), s, s)


def _w_cast_roundtrip(rng):
    s = _s(rng)
    return pair(lambda x: x.cast("float64").cast("float32").sin(), lambda x: x.sin(), s)


def _w_cast_noop(rng):
    s = _s(rng)
    b = GraphBuilder()
    x = b.input("x0", s, "float32")
    y = b.add("Cast", (x,), dtype="float32")
    return Witness(b.build([y.sin()]))


def _w_where_same(rng):
    s = _s(rng)
    return pair(lambda x, y: Tensor.where(x < y, x.sin(), x.sin()), lambda x, y: x.sin(), s, s)


def _w_where_const(rng):
    s = _s(rng)
    return pair(lambda x, y: Tensor.where(True, x, y) + Tensor.where(False, x, y), lambda x, y: x + y, s, s)


def _w_factor(rng):
    s = _s(rng)
    return pair(lambda a, b, c: a * c + b * c, lambda a, b, c: (a + b) * c, s, s, s)


def _w_expand(rng):
    s = _s(rng)
    return pair(lambda a, b, c: (a + b) * c, lambda a, b, c: a * c + b * c, s, s, s)


def _w_comm(rng):
    s = _s(rng)
    return pair(lambda a, b: (a + b) * (a * b).sin(), lambda a, b: (b + a) * (b * a).sin(), s, s)


def _w_assoc(rng):
    s = _s(rng)
    return pair(lambda a, b, c: (a + (b + c)) * (a * (b * c)), lambda a, b, c: ((a + b) + c) * ((a * b) * c), s, s, s)


# -- the other forms and the near-misses ------------------------------------------------------

def _w(fn, *ranks, dtype="float32", c=(1.25, -0.75)):
    """A witness of fn(*inputs, c1, c2), one input per entry of `ranks` (None: random rank >= 1),
    all inputs of one shape (rank-0 inputs make literals bare ``ScalarF``/``ScalarI``)."""
    def wit(rng):
        s = rand_shape(rng, ranks[0])
        return Witness(program(lambda *xs: fn(*xs, *c), *[s] * len(ranks), dtype=dtype))
    return wit


def _int(x):
    return x.cast("int64")


def _lit(x, v):
    """A literal broadcast to x's shape (bare for rank 0): c1 * c2 of two literals."""
    return x.builder.constant(v, x.dtype, x.shape)


_RANKS = (None, 0)  # broadcast literal, bare literal
_MUL_ONE = [(lambda x, a, b: x * 1.0), (lambda x, a, b: 1.0 * x),
            (lambda x, a, b: _int(x) * 1), (lambda x, a, b: 1 * _int(x))]
_ADD_ZERO = [(lambda x, a, b: _int(x) + 0), (lambda x, a, b: 0 + _int(x))]


def _fold_forms(op):
    return [lambda x, a, b: x + op(_lit(x, a), b), lambda x, a, b: op(op(x, a), b), lambda x, a, b: op(op(a, x), b),
            lambda x, a, b: op(b, op(x, a)), lambda x, a, b: op(b, op(a, x))]


def _both_ranks(forms):
    return tuple(_w(f, r) for f in forms for r in _RANKS)


_FACTOR = [lambda a, b, c, *_: c * a + c * b, lambda a, b, c, *_: a * c + c * b, lambda a, b, c, *_: c * a + b * c]
_CASTS = tuple(_w(lambda x, *_, dt=dt: x.cast("float64").cast(dt).sin(), None, dtype=dt) for dt in ("float16", "bfloat16"))
_NEAR = {  # rule short name -> programs that violate its guard
    "add-zero-int": (_w(lambda x, *_: x + 0.0, None),),
    "fold-mul": (_w(lambda x, a, b: (x * a) * b, None, c=(1e200, 1e200)),  # product overflows
                 _w(lambda x, a, b: (x * a) * b, None, c=(1e-200, 1e-200))),  # product is 0
    "fold-add": (_w(lambda x, a, b: (x + a) + b, None, c=(1e308, 1e308)),),
    "exp2-log2": (_w(lambda x, *_: x.log2().exp2(), None),),  # x may be negative
    "sqrt-square": (_w(lambda x, *_: x.sqrt() * x.sqrt(), None),),
    "sqrt-mul": (_w(lambda x, y, *_: x.sqrt() * (y * y).sqrt(), None, None),),
    "cast-roundtrip": (_w(lambda x, *_: x.cast("float16").cast("float32"), None),  # not through float64
                       _w(lambda x, *_: x.cast("float64").cast("float16"), None)),  # to another dtype
    "cast-noop": (_w(lambda x, *_: x.cast("float16"), None),),
    "where-same": (_w(lambda x, y, *_: Tensor.where(x < y, x, y), None, None),),
}
_MORE = {  # rule short name -> its other forms (the first is `witness`)
    "mul-one": _both_ranks(_MUL_ONE)[1:],
    "add-zero-int": _both_ranks(_ADD_ZERO)[1:] + (_w(lambda x, *_: x.cast("bool") + False, None),),
    "fold-mul": _both_ranks(_fold_forms(lambda p, q: p * q)),
    "fold-add": _both_ranks(_fold_forms(lambda p, q: p + q)),
    "cast-roundtrip": _CASTS,
    "where-const": (_w(lambda x, y, *_: Tensor.where(True, x, y) + Tensor.where(False, x, y), 0, 0),),
    "factor": tuple(_w(f, None, None, None) for f in _FACTOR),
    "expand": (_w(lambda a, b, c, *_: c * (a + b), None, None, None),),
    "assoc": (_w(lambda a, b, c, *_: ((a + b) + c) * ((a * b) * c), None, None, None),),
}


def _spec(name, text, wit, doc, explosive=False):
    short = name.split(".")[1]
    return RuleSpec(name, text, explosive=explosive, witness=wit, doc=doc, witnesses=_MORE.get(short, ()),
                    near_misses=_NEAR.get(short, ()))


RULES = [
    _spec("algebra.mul-one", MUL_ONE, wit=_w_mul_one, doc="x*1 = x (exact, any dtype)"),
    _spec("algebra.add-zero-int", ADD_ZERO_INT, wit=_w_add_zero,
          doc="x+0 = x for int/bool (for floats it would turn -0.0 into +0.0)"),
    _spec("algebra.fold-mul", FOLD_MUL, wit=_w_fold_mul,
          doc="fold c1*c2 and (x*c1)*c2; result must be finite, non-zero"),
    _spec("algebra.fold-add", FOLD_ADD, wit=_w_fold_add, doc="fold c1+c2 and (x+c1)+c2"),
    _spec("algebra.exp2-log2", EXP2_LOG2, wit=_w_exp2_log2, doc="exp2(log2 a) = a for a >= 0"),
    _spec("algebra.exp2-mul", EXP2_MUL, wit=_w_exp2_mul,
          doc="exp2(a)*exp2(b) = exp2(a+b) (only ever removes an overflow)"),
    _spec("algebra.recip-recip", RECIP_RECIP, wit=_w_recip_recip, doc="1/(1/x) = x"),
    _spec("algebra.recip-mul", RECIP_MUL, wit=_w_recip_mul, doc="1/(ab) = (1/a)(1/b)"),
    _spec("algebra.recip-exp2", RECIP_EXP2, wit=_w_recip_exp2, doc="1/exp2(x) = exp2(-x)"),
    _spec("algebra.recip-sqrt", RECIP_SQRT, wit=_w_recip_sqrt, doc="1/sqrt(x) = sqrt(1/x)"),
    _spec("algebra.sqrt-square", SQRT_SQUARE, wit=_w_sqrt_square, doc="sqrt(x)^2 = x for x >= 0"),
    _spec("algebra.sqrt-mul", SQRT_MUL, wit=_w_sqrt_mul, doc="sqrt(a)sqrt(b) = sqrt(ab) for a, b >= 0"),
    _spec("algebra.cast-roundtrip", CAST_ROUNDTRIP, wit=_w_cast_roundtrip,
          doc="a float->float64->float cast is the identity"),
    _spec("algebra.cast-noop", CAST_NOOP, wit=_w_cast_noop, doc="a cast to the same dtype"),
    _spec("algebra.where-same", WHERE_SAME, wit=_w_where_same, doc="where(c, a, a) = a"),
    _spec("algebra.where-const", WHERE_CONST, wit=_w_where_const, doc="where(true/false, a, b)"),
    _spec("algebra.factor", FACTOR, wit=_w_factor, doc="ac + bc = (a+b)c"),
    _spec("algebra.expand", EXPAND, explosive=True, wit=_w_expand, doc="(a+b)c = ac + bc"),
    _spec("algebra.comm", COMM, explosive=True, wit=_w_comm, doc="a+b = b+a, ab = ba"),
    _spec("algebra.assoc", ASSOC, explosive=True, wit=_w_assoc, doc="(a+b)+c = a+(b+c), same for *"),
]
