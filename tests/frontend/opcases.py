"""Per-op test cases: for every key of ``LOWERINGS``, torch functions that reach that rule.

A case is a torch function and 1-3 *input sets* (shapes, with broadcasting,
and inputs made non-contiguous inside the function with ``.mT``/slicing);
the test bundles the input sets into one module (one export per case) and
compares ``evaluate`` against eager torch.  ``raw=True`` exports without the
core-ATen decomposition (``decompositions={}``), which is how mid-level ops
such as ``aten.linear`` reach their own rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


# --- input specs ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    shape: tuple
    kind: str = "normal"  # normal | positive | int | distinct | bool | uniform
    lo: float = -8
    hi: float = 9
    dtype: str | None = None  # fixed dtype (ints, bools); None = the case's float dtype

    def make(self, rng: torch.Generator, float_dtype: torch.dtype) -> torch.Tensor:
        if self.kind == "distinct":  # distinct indices into a dim of size hi, each written as i or i - hi
            n = int(self.hi)
            idx = torch.randperm(n, generator=rng)[:self.shape[0]]
            neg = (torch.rand(idx.shape, generator=rng) < 0.5) & bool(self.lo)
            return torch.where(neg, idx - n, idx).to(getattr(torch, self.dtype or "int64"))
        if self.kind == "int":
            return torch.randint(int(self.lo), int(self.hi), self.shape, generator=rng, dtype=getattr(torch, self.dtype or "int64"))
        if self.kind == "bool":
            t = torch.rand(self.shape, generator=rng) < 0.5
            if t.numel():
                t.view(-1)[0] = True
            return t
        if self.kind == "positive":
            t = torch.rand(self.shape, generator=rng, dtype=torch.float64) * 1.5 + 0.5
        elif self.kind == "uniform":
            t = torch.rand(self.shape, generator=rng, dtype=torch.float64) * (self.hi - self.lo) + self.lo
        else:
            t = torch.randn(self.shape, generator=rng, dtype=torch.float64)
        return t.to(getattr(torch, self.dtype) if self.dtype else float_dtype)


def Fl(*shape):
    return Spec(tuple(shape))


def Pos(*shape):
    return Spec(tuple(shape), "positive")


def Int(*shape, lo=-8, hi=9, dtype="int64"):
    return Spec(tuple(shape), "int", lo, hi, dtype)


def Distinct(k, n, negative=True, dtype="int64"):
    """k distinct indices into a dim of size n (with `negative`, about half written as i - n): a position list."""
    return Spec((k,), "distinct", 1 if negative else 0, n, dtype)


def Bool(*shape):
    return Spec(tuple(shape), "bool")


def Uni(lo, hi, *shape):
    return Spec(tuple(shape), "uniform", lo, hi)


@dataclass(frozen=True)
class Case:
    fn: Callable
    sets: tuple  # tuple of tuples of Spec
    raw: bool = False  # export without decompositions
    half: bool = False  # also run in float16 and bfloat16
    tol: float = 1e-5
    # outputs whose largest magnitude is below `floor` are compared absolutely (rel_err's floor): a sum of unit
    # normals can cancel to near zero, and its rounding noise (torch and numpy add in different orders)
    # relative to that near-zero sum says nothing about the rule
    floor: float = 0.0


def case(fn, *sets, **kw) -> Case:
    return Case(fn, tuple(tuple(s) for s in sets), **kw)


CASES: dict[str, list[Case]] = {}


def add(key: str, *cases: Case):
    CASES.setdefault(key, []).extend(cases)


# --- elementwise ---------------------------------------------------------------------------

add("aten.add",
    case(lambda a, b: a + b, [Fl(3, 4), Fl(4)], [Fl(2, 1, 5), Fl(3, 1)], half=True),
    case(lambda a, b: (a.mT + 2.5 * b, a + 3, torch.add(a, b.mT, alpha=2)), [Fl(4, 3), Fl(3, 4)]),
    case(lambda i, j: (i + j, i + 1, (i > 0) + 2, (i > 0) + (j > 0)), [Int(3, 4), Int(4)]),
    case(lambda i, x: i + x, [Int(3, 4), Fl(4)]))
add("aten.sub",
    case(lambda a, b: (a - b, a - 1.5, torch.sub(a, b, alpha=3)), [Fl(3, 4), Fl(4)], [Fl(2, 3), Fl(2, 1)]),
    case(lambda i, j: i - j, [Int(5), Int(5)]))
add("aten.rsub", case(lambda a: torch.rsub(a, 2.0), [Fl(3, 4)], raw=True))
add("aten.mul",
    case(lambda a, b: (a * b, a * 0.5, a[:, ::2] * b[:, ::2]), [Fl(3, 4), Fl(1, 4)], [Fl(2, 6), Fl(2, 6)], half=True),
    case(lambda i, b: (i * 3, (i > 0) * b, (i > 0) * (b > 0)), [Int(3, 4), Fl(3, 4)]))
add("aten.div",
    case(lambda a, b: (a / b, a / 3.0, b.mT / a.mT), [Fl(3, 4), Pos(3, 4)], [Fl(2, 5), Pos(1, 5)], half=True),
    case(lambda i, j: (i / j, torch.div(i, j, rounding_mode="trunc"), torch.div(i, j, rounding_mode="floor"),
                       torch.div(i, 3, rounding_mode="floor")),
         [Int(4, 5, lo=-50, hi=50), Int(4, 5, lo=1, hi=7)], [Int(6, lo=-50, hi=50), Int(6, lo=-7, hi=-1)]),
    case(lambda a, b: (torch.div(a, b, rounding_mode="trunc"), torch.div(a, b, rounding_mode="floor"),
                       torch.div(a, -0.75, rounding_mode="floor")), [Uni(-10, 10, 4, 6), Uni(0.3, 2, 4, 6)]))
add("aten.true_divide", case(lambda a, b: torch.true_divide(a, b), [Fl(3, 4), Pos(3, 4)], raw=True))
add("aten.floor_divide", case(lambda a, b, i: (torch.floor_divide(a, b), torch.floor_divide(i, 3)),
                              [Uni(-10, 10, 3, 4), Uni(-3, -0.2, 3, 4), Int(5, lo=-20, hi=20)], raw=True))
add("aten.remainder",
    case(lambda a, b: (torch.remainder(a, b), a % 0.7, torch.remainder(a, -0.7)), [Uni(-5, 5, 3, 4), Uni(0.3, 2, 3, 4)]),
    case(lambda i, j: (i % j, i % 3, i % -3), [Int(4, 5, lo=-20, hi=20), Int(4, 5, lo=1, hi=6)]))
add("aten.fmod",
    case(lambda a, b: (torch.fmod(a, b), torch.fmod(a, -0.7)), [Uni(-5, 5, 3, 4), Uni(0.3, 2, 3, 4)]),
    case(lambda i: torch.fmod(i, 3), [Int(5, lo=-20, hi=20)]))
add("aten.pow",
    case(lambda x: (x ** 2, x ** 3, x ** -1, x.abs() ** 0.5, x.abs() ** -0.5, (x.abs() + 0.5) ** 1.7, x ** 0, x ** 11),
         [Uni(-2, 2, 3, 4)], half=True),
    case(lambda x, y: (x ** y, 2.0 ** y, x.abs() ** y), [Uni(-2, 2, 4, 5), Int(4, 5, lo=-3, hi=4)], [Pos(3, 4), Uni(-2, 2, 3, 4)]),
    case(lambda i: (i ** 2, i ** 3), [Int(6, lo=-5, hi=6)]))
add("aten.copysign", case(lambda a, b: (torch.copysign(a, b), torch.copysign(a, -1.0)), [Fl(3, 4), Fl(4)]))
add("aten.hypot", case(lambda a, b: torch.hypot(a, b), [Fl(3, 4), Fl(4)]))
add("aten.signbit", case(lambda x, i: (torch.signbit(x), torch.signbit(i)), [Fl(3, 4), Int(5)]))
add("aten.neg", case(lambda x, i: (-x, -i), [Fl(3, 4), Int(3)]))
add("aten.abs", case(lambda x, i: (x.abs(), i.abs(), x.mT.abs()), [Fl(3, 4), Int(5)]))
add("aten.sign", case(lambda x, i: (x.sign(), i.sign()), [Fl(3, 4), Int(6)]))
add("aten.sgn", case(lambda x: x.sgn(), [Fl(3, 4)], raw=True))
for _op, _fn, _spec in [
    ("aten.exp", torch.exp, Fl(3, 4)), ("aten.exp2", torch.exp2, Fl(3, 4)), ("aten.log", torch.log, Pos(3, 4)),
    ("aten.log2", torch.log2, Pos(3, 4)), ("aten.log10", torch.log10, Pos(3, 4)), ("aten.sqrt", torch.sqrt, Pos(3, 4)),
    ("aten.rsqrt", torch.rsqrt, Pos(3, 4)), ("aten.reciprocal", torch.reciprocal, Pos(3, 4)),
    ("aten.sin", torch.sin, Fl(3, 4)), ("aten.cos", torch.cos, Fl(3, 4)), ("aten.tan", torch.tan, Uni(-1.2, 1.2, 3, 4)),
    ("aten.tanh", torch.tanh, Uni(-6, 6, 3, 4)), ("aten.sigmoid", torch.sigmoid, Uni(-9, 9, 3, 4)),
    ("aten.erf", torch.erf, Uni(-5, 5, 4, 8)), ("aten.erfc", torch.erfc, Uni(-3, 3, 3, 4)),
    ("aten.sinh", torch.sinh, Fl(3, 4)), ("aten.cosh", torch.cosh, Fl(3, 4)),
    ("aten.log1p", torch.log1p, Uni(-0.9, 3, 3, 4)), ("aten.expm1", torch.expm1, Uni(-3, 3, 3, 4)),
    ("aten.floor", torch.floor, Uni(-5, 5, 3, 4)), ("aten.ceil", torch.ceil, Uni(-5, 5, 3, 4)),
    ("aten.trunc", torch.trunc, Uni(-5, 5, 3, 4)),
    ("aten.relu", torch.relu, Fl(3, 4)), ("aten.silu", F.silu, Fl(3, 4)),
]:
    add(_op, case(lambda x, f=_fn: (f(x), f(x.transpose(-1, -2)[1:])), [_spec], [Spec((2, 3, 5), _spec.kind, _spec.lo, _spec.hi)],
                  half=_op in ("aten.exp", "aten.rsqrt", "aten.tanh", "aten.sigmoid", "aten.relu", "aten.silu",
                               "aten.log", "aten.sqrt")))
for _op, _fn, _spec in [("aten.atan", torch.atan, Uni(-6, 6, 4, 7)), ("aten.asin", torch.asin, Uni(-1, 1, 4, 7)),
                         ("aten.acos", torch.acos, Uni(-1, 1, 4, 7)), ("aten.asinh", torch.asinh, Uni(-5, 5, 4, 7)),
                         ("aten.acosh", torch.acosh, Uni(1, 6, 4, 7)), ("aten.atanh", torch.atanh, Uni(-0.95, 0.95, 4, 7))]:
    add(_op, case(lambda x, f=_fn: (f(x), f(x.mT)), [_spec]))
add("aten.atan2", case(lambda y, x: (torch.atan2(y, x), torch.atan2(y, x.round()), torch.atan2(torch.zeros_like(y), x), torch.atan2(y, torch.zeros_like(x))),
                       [Fl(4, 7), Fl(4, 7)], [Fl(3, 1), Fl(5)]))
add("aten.frac", case(lambda x: (torch.frac(x), torch.frac(x.mT)), [Uni(-5, 5, 3, 4)], raw=True))
add("aten.round",
    case(lambda x: (torch.round(x), torch.round(x * 2) / 2, torch.round(x + 0.5)),
         [Uni(-5, 5, 4, 6)]),
    case(lambda x: torch.round(x, decimals=2), [Uni(-5, 5, 3, 4)]))
add("aten.isnan", case(lambda x: (torch.isnan(x.log()), torch.isnan(x)), [Fl(3, 4)]))
add("aten.isinf", case(lambda x: (torch.isinf(1 / (x.round())), torch.isinf(x)), [Uni(-2, 2, 3, 4)], raw=True))
add("aten.isfinite", case(lambda x: torch.isfinite(x.log()), [Fl(3, 4)], raw=True))
add("aten.gelu", case(lambda x: (F.gelu(x), F.gelu(x, approximate="tanh"), F.gelu(x.mT)), [Uni(-6, 6, 4, 5)], half=True))
add("aten.leaky_relu", case(lambda x: (F.leaky_relu(x), F.leaky_relu(x, 0.2)), [Fl(3, 4)]))
add("aten.elu", case(lambda x: (F.elu(x), F.elu(x, 0.5), F.selu(x)), [Fl(3, 4)]))
add("aten.hardtanh", case(lambda x: (F.hardtanh(x), F.relu6(x * 4)), [Fl(3, 4)]))
add("aten.clamp", case(lambda x, lo, hi: (x.clamp(-0.5, 0.5), x.clamp(min=0.1), x.clamp(max=0.2),
                                          torch.clamp(x, lo, hi)), [Fl(3, 4), Fl(3, 4), Fl(4)]),
    case(lambda i: i.clamp(-2, 3), [Int(5)]))
add("aten.clip", case(lambda x: torch.clip(x, -0.5, 0.5), [Fl(3, 4)], raw=True))
add("aten.clamp_min", case(lambda x, y: torch.clamp_min(x, y), [Fl(3, 4), Fl(4)], raw=True))
add("aten.clamp_max", case(lambda x, y: torch.clamp_max(x, y), [Fl(3, 4), Fl(4)], raw=True))
add("aten.maximum", case(lambda a, b: torch.maximum(a, b), [Fl(3, 4), Fl(4)], [Int(3, 4), Int(3, 4)]))
add("aten.minimum", case(lambda a, b: torch.minimum(a, b), [Fl(3, 4), Fl(4)], [Int(3, 4), Int(3, 4)]))
add("aten.fmax", case(lambda a, b: torch.fmax(a, b.log()), [Fl(3, 4), Fl(4)]))
add("aten.fmin", case(lambda a, b: torch.fmin(a, b.log()), [Fl(3, 4), Fl(4)]))
add("aten.where", case(lambda c, a, b: (torch.where(c, a, b), torch.where(c, a, 0.0), torch.where(a > 0, 1.0, b)),
                       [Bool(3, 4), Fl(3, 4), Fl(4)], [Bool(2, 1), Fl(1, 3), Fl(2, 3)]))
add("aten.masked_fill", case(lambda x, m: (x.masked_fill(m, -1.0), x.masked_fill(m, float("-inf"))),
                             [Fl(3, 4), Bool(3, 4)], [Fl(2, 3, 4), Bool(4)], raw=True))
add("aten.lerp", case(lambda a, b, w: (torch.lerp(a, b, 0.3), torch.lerp(a, b, w)), [Fl(3, 4), Fl(3, 4), Fl(4)], raw=True))
for _op, _fn in [("aten.eq", torch.eq), ("aten.ne", torch.ne), ("aten.lt", torch.lt), ("aten.le", torch.le),
                 ("aten.gt", torch.gt), ("aten.ge", torch.ge)]:
    add(_op, case(lambda a, b, f=_fn: (f(a, b), f(a, 0.0), f(a.round(), b.round()), f(a, b.log())),
                  [Fl(3, 4), Fl(4)], [Fl(2, 3), Fl(2, 3)]),
         case(lambda i, j, f=_fn: (f(i, j), f(i, 2), f(i, 1.5)), [Int(3, 4, lo=-3, hi=3), Int(4, lo=-3, hi=3)]))
for _op, _fn in [("aten.logical_and", torch.logical_and), ("aten.logical_or", torch.logical_or),
                 ("aten.logical_xor", torch.logical_xor)]:
    add(_op, case(lambda a, b, x, f=_fn: (f(a, b), f(a, x), f(x, x.round())), [Bool(3, 4), Bool(4), Fl(3, 4)]))
add("aten.logical_not", case(lambda a, x, i: (torch.logical_not(a), torch.logical_not(x.round()), ~a, torch.logical_not(i)),
                             [Bool(3, 4), Fl(3, 4), Int(5, lo=-1, hi=2)]))
for _op, _fn in [("aten.bitwise_and", lambda a, b: a & b), ("aten.bitwise_or", lambda a, b: a | b),
                 ("aten.bitwise_xor", lambda a, b: a ^ b)]:
    add(_op, case(lambda a, b, f=_fn: f(a, b), [Bool(3, 4), Bool(4)], [Bool(2, 3), Bool(2, 3)]))
add("aten.bitwise_not", case(lambda a, i: (~a, ~i), [Bool(3, 4), Int(5)]))


# --- reductions ------------------------------------------------------------------------------

add("aten.sum",
    case(lambda x: (x.sum(), x.sum(0), x.sum(-1, keepdim=True), x.mT.sum(0), x.sum((0, 1)), x.sum(dtype=torch.float64)),
         [Fl(3, 4)], [Fl(2, 3, 5)], half=True, floor=1.0),
    case(lambda i, b: (i.sum(1), b.sum(), b.sum(0)), [Int(3, 4), Bool(3, 4)]))
add("aten.mean", case(lambda x: (x.mean(), x.mean(0), x.mean(-1, keepdim=True), x.mT.mean(1)), [Fl(3, 4)], [Fl(2, 3, 5)],
                      half=True, floor=1.0))
add("aten.prod", case(lambda x: (x.prod(), x.prod(0), x.prod(-1, keepdim=True)), [Uni(0.5, 1.5, 3, 5)], [Fl(7)]),
    case(lambda i: i.prod(0), [Int(5, 3, lo=-3, hi=4)]))
add("aten.amax", case(lambda x: (x.amax(), x.amax(0), x.amax((0, 1), keepdim=True), x.mT.amax(0)), [Fl(3, 4)], [Fl(2, 3, 5)], half=True),
    case(lambda i: i.amax(1), [Int(3, 4)]))
add("aten.amin", case(lambda x: (x.amin(), x.amin(0), x.amin(-1, keepdim=True)), [Fl(3, 4)], [Fl(2, 3, 5)]),
    case(lambda i: i.amin(1), [Int(3, 4)]))
add("aten.argmax", case(lambda x, i: (x.argmax(), x.argmax(0), x.argmax(-1, keepdim=True), i.argmax(1), x.mT.argmax(0)),
                        [Fl(3, 4), Int(3, 4, lo=0, hi=3)]))
add("aten.argmin", case(lambda x, i: (x.argmin(), x.argmin(0), i.argmin(1, keepdim=True)), [Fl(3, 4), Int(3, 4, lo=0, hi=3)]))
add("aten.max.dim", case(lambda x, i: (*torch.max(x, 1), *torch.max(i, 0, keepdim=True)), [Fl(3, 4), Int(3, 4, lo=0, hi=3)]))
add("aten.min.dim", case(lambda x, i: (*torch.min(x, 1), *torch.min(i, 0, keepdim=True)), [Fl(3, 4), Int(3, 4, lo=0, hi=3)]))
add("aten.max.default", case(lambda x: (x.max(), x.mT.max()), [Fl(3, 4)], raw=True))
add("aten.min.default", case(lambda x: x.min(), [Fl(3, 4)], raw=True))
add("aten.max.other", case(lambda a, b: torch.max(a, b), [Fl(3, 4), Fl(4)], raw=True))
add("aten.min.other", case(lambda a, b: torch.min(a, b), [Fl(3, 4), Fl(4)], raw=True))
add("aten.any", case(lambda b, x: (b.any(), b.any(0), b.any(-1, keepdim=True), (x > 1).any((0, 1)), x.any(0)),
                     [Bool(3, 4), Fl(3, 4)]))
add("aten.all", case(lambda b, x: (b.all(), b.all(0), (x > -1).all(-1, keepdim=True), x.all(1)), [Bool(3, 4), Fl(3, 4)], raw=True))
add("aten.var", case(lambda x: (x.var(), x.var(0), x.var(-1, keepdim=True, correction=0), x.mT.var(0)), [Fl(3, 4)], [Fl(2, 3, 5)]))
add("aten.std", case(lambda x: (x.std(), x.std(0)), [Fl(3, 4)], raw=True))
add("aten.var_mean", case(lambda x: (*torch.var_mean(x, 0), *torch.var_mean(x, -1, correction=0, keepdim=True)), [Fl(3, 4)]))
add("aten.cumsum", case(lambda x, i, b: (x.cumsum(0), x.cumsum(-1), x.mT.cumsum(1), i.cumsum(0), b.cumsum(1)),
                        [Fl(3, 4), Int(3, 4), Bool(3, 4)]))
add("aten.cumprod", case(lambda x, i: (x.cumprod(0), x.cumprod(-1), x.mT.cumprod(1), i.cumprod(1)),
                         [Uni(0.5, 1.5, 3, 5), Int(3, 4, lo=-2, hi=3)]))
add("aten.logsumexp", case(lambda x: (x.logsumexp(0), x.logsumexp(-1, keepdim=True), (x * 30).logsumexp(1)), [Fl(3, 4)], raw=True))
add("aten.linalg_vector_norm", case(lambda x: (torch.linalg.vector_norm(x), torch.linalg.vector_norm(x, 1, dim=0),
                                               torch.linalg.vector_norm(x, float("inf"), dim=1), torch.linalg.vector_norm(x, 3, dim=-1, keepdim=True),
                                               torch.linalg.vector_norm(x, 0, dim=1), torch.linalg.vector_norm(x, float("-inf"), dim=1)),
                                    [Fl(3, 4)]))

add("aten.sort", case(lambda x, i: (*x.sort(-1), *x.sort(0, descending=True), *i.sort(dim=1, stable=True), *x.mT.sort(-1)),
                      [Fl(4, 6), Int(3, 7, lo=0, hi=3)]))
add("aten.topk", case(lambda x, i: (*x.topk(3), *x.topk(2, 0, largest=False), i.topk(2)[0]), [Fl(4, 6), Int(3, 7, lo=0, hi=3)]))
add("aten.kthvalue", case(lambda x: (*x.kthvalue(2), *x.kthvalue(3, 0, keepdim=True)), [Fl(4, 6)]))
add("aten.median", case(lambda x, i: (x.median(), *x.median(1), i.median(0)[0], i.median()), [Fl(4, 5), Int(4, 5, lo=0, hi=3)]))


# --- matrix products -------------------------------------------------------------------------------

add("aten.mm", case(lambda a, b: (a @ b, a @ b.mT.mT, b.mT @ a.mT), [Fl(3, 4), Fl(4, 5)], [Fl(1, 6), Fl(6, 2)], half=True))
add("aten.bmm", case(lambda a, b: (torch.bmm(a, b), torch.bmm(a, b.transpose(1, 2).transpose(1, 2))), [Fl(2, 3, 4), Fl(2, 4, 5)], half=True))
add("aten.addmm", case(lambda x, w, b: (F.linear(x, w, b), torch.addmm(b, x, w.mT, beta=0.5, alpha=2)), [Fl(3, 4), Fl(5, 4), Fl(5)],
                       [Fl(1, 6), Fl(2, 6), Fl(2)], half=True))
add("aten.baddbmm", case(lambda b, x, y: (torch.baddbmm(b, x, y), torch.baddbmm(b, x, y, beta=0, alpha=0.5)), [Fl(2, 3, 5), Fl(2, 3, 4), Fl(2, 4, 5)], raw=True))
add("aten.addbmm", case(lambda b, x, y: torch.addbmm(b, x, y), [Fl(3, 5), Fl(2, 3, 4), Fl(2, 4, 5)], raw=True))
add("aten.addmv", case(lambda b, m, v: torch.addmv(b, m, v), [Fl(3), Fl(3, 4), Fl(4)], raw=True))
add("aten.mv", case(lambda m, v: torch.mv(m, v), [Fl(3, 4), Fl(4)], raw=True))
add("aten.dot", case(lambda a, b: torch.dot(a, b), [Fl(5), Fl(5)], raw=True))
add("aten.vdot", case(lambda a, b: torch.vdot(a, b), [Fl(5), Fl(5)], raw=True))
add("aten.matmul", case(lambda a, b, v: (a @ b, a @ v, v @ b), [Fl(2, 3, 4), Fl(4, 5), Fl(4)], raw=True))
add("aten.linear", case(lambda x, w, b: (F.linear(x, w, b), F.linear(x, w)), [Fl(2, 3, 4), Fl(5, 4), Fl(5)], raw=True))


# --- movement ---------------------------------------------------------------------------------------

add("aten.view", case(lambda x: (x.view(4, 3), x.view(-1), x.reshape(2, 6) + 1), [Fl(3, 4)]))
add("aten._unsafe_view", case(lambda x: torch.ops.aten._unsafe_view(x * 2, [4, 3]), [Fl(3, 4)], raw=True))
add("aten.view_copy", case(lambda x: torch.view_copy(x, (4, 3)), [Fl(3, 4)]))
add("aten.permute_copy", case(lambda x: torch.permute_copy(x, (1, 0)), [Fl(3, 4)]))
add("aten.unbind_copy", case(lambda x: torch.unbind_copy(x, 1), [Fl(3, 4)]))
add("aten.as_strided_copy", case(lambda x: torch.as_strided_copy(x + 1, (2, 2), (1, 4)), [Fl(3, 4)]))
add("aten.narrow_copy", case(lambda x: torch.narrow_copy(x, 1, 1, 2), [Fl(3, 4)]))
add("aten.expand", case(lambda x: (x.expand(2, 3, 4), x[:, :1].expand(-1, 5)), [Fl(3, 4)]))
add("aten.permute", case(lambda x: (x.permute(2, 0, 1), x.permute(1, 0, 2) * 2), [Fl(2, 3, 4)]))
add("aten.transpose", case(lambda x: torch.ops.aten.transpose(x, 0, 2), [Fl(2, 3, 4)], raw=True))
add("aten.t", case(lambda x: x.t() * 1, [Fl(3, 4)], raw=True))
add("aten.unsqueeze", case(lambda x: (x.unsqueeze(0), x.unsqueeze(-1), x[None, :, None]), [Fl(3, 4)]))
add("aten.squeeze", case(lambda x: (x.squeeze(), x.squeeze(1), x.squeeze((1, 3))), [Fl(3, 1, 4, 1)]))
add("aten.clone", case(lambda x: x.mT.clone() + 0, [Fl(3, 4)]))
add("aten.alias", case(lambda x: torch.ops.aten.alias(x) * 2, [Fl(3, 4)]))
add("aten.detach", case(lambda x: x.detach() * 2, [Fl(3, 4)], raw=True))
# a tensor made in forward (torch.tensor): torch.export copies the constant in (lift_fresh_copy)
add("aten.lift_fresh_copy", case(lambda x: x * torch.tensor([1.0, -2.0, 0.5, 3.0]), [Fl(3, 4)]))
add("aten.slice", case(lambda x: (x[1:], x[:, ::2], x[:, 1:-1:2], x[-2:, :100], x[5:]), [Fl(4, 6)]))
add("aten.select", case(lambda x: (x[1], x[:, -1], x[0, 2]), [Fl(4, 6)]))
add("aten.split_with_sizes", case(lambda x: (*x.split([1, 3], 0), *torch.split(x, [2, 4], -1)), [Fl(4, 6)]))
add("aten.split", case(lambda x: (*x.split(2, 1), *x.chunk(2, 0), *x.split(4, 1)), [Fl(4, 6)], raw=True))
add("aten.unbind", case(lambda x: x.unbind(1), [Fl(2, 3, 4)], raw=True))
add("aten.cat", case(lambda a, b: (torch.cat([a, b], 0), torch.cat([a, a.mT.mT], 1), torch.cat([a, b.int()], 0)),
                     [Fl(2, 3), Fl(4, 3)]),
    case(lambda a, e: torch.cat([a, e, a], 0), [Fl(2, 3), Fl(0)]))
add("aten.concat", case(lambda a, b: torch.concat([a, b], -1), [Fl(2, 3), Fl(2, 4)], raw=True))
add("aten.concatenate", case(lambda a, b: torch.concatenate([a, b], 0), [Fl(2, 3), Fl(1, 3)], raw=True))
add("aten.stack", case(lambda a, b: (torch.stack([a, b]), torch.stack([a, b], -1)), [Fl(2, 3), Fl(2, 3)], raw=True))
add("aten.flip", case(lambda x: (x.flip(0), x.flip((1, 2)), x.mT.flip(0)), [Fl(2, 3, 4)], [Fl(4, 4, 2)]))
add("aten.roll", case(lambda x: (x.roll(1, 0), x.roll((2, -1), (1, 2)), x.roll(5)), [Fl(2, 3, 4)], raw=True))
add("aten.repeat", case(lambda x: (x.repeat(2, 1), x.repeat(1, 2, 3), x.mT.repeat(2, 2)), [Fl(2, 3)]))
add("aten.constant_pad_nd", case(lambda x: (F.pad(x, (1, 2)), F.pad(x, (0, 0, 2, 1), value=3.0), F.pad(x, (-1, 1, 1, -1))),
                                 [Fl(2, 3, 4)]))
for _k, _shape, _pad in [(1, (2, 3, 5), [2, 1]), (2, (1, 2, 4, 5), [2, 1, 1, 2]), (3, (1, 2, 3, 4, 3), [1, 1, 1, 0, 0, 1])]:
    for _kind in ("reflection", "replication"):
        add(f"aten.{_kind}_pad{_k}d", case(lambda x, op=getattr(torch.ops.aten, f"{_kind}_pad{_k}d"), p=_pad: op(x, p) * 1,
                                           [Fl(*_shape)], raw=True))
add("aten.pad", case(lambda x: (F.pad(x, (1, 2)), F.pad(x, (2, 1, 1, 2), mode="reflect"), F.pad(x, (2, 1, 0, 0), mode="replicate"),
                                F.pad(x, (1, 2, 2, 1), mode="circular"), F.pad(x, (1, 1), value=2.0)), [Fl(1, 2, 4, 5)], raw=True))
add("aten.as_strided", case(lambda x: (x + 1).as_strided((3, 2), (1, 3), 1), [Fl(3, 4)]))
add("aten.unfold", case(lambda x: (x.unfold(1, 3, 2), x.unfold(0, 2, 1)), [Fl(3, 7)]))
add("aten.diagonal", case(lambda x: (torch.diagonal(x), torch.diagonal(x, 1), torch.diagonal(x, -1, 1, 2)), [Fl(3, 4, 4)]))
add("aten.tril", case(lambda x: (torch.tril(x), torch.tril(x, -1), torch.tril(x, 2)), [Fl(3, 4)], [Fl(2, 4, 4)], raw=True))
add("aten.triu", case(lambda x: (torch.triu(x), torch.triu(x, 1)), [Fl(3, 4)], raw=True))


def _slice_set(x, y):
    x = x.clone()
    x[:, 1:3] = y
    return x


def _select_set(x, y):
    x = x.clone()
    x[1] = y
    return x


def _copy(x, y):
    x = x.clone()
    x.copy_(y)
    return x


def _fill(x):
    x = x.clone()
    x.fill_(2.0)
    return x


def _index_put(x, i, v):
    x = x.clone()
    x[i] = v
    return x


def _index_put_acc(x, i, j, v):
    return x.index_put((i, j), v, accumulate=True)


add("aten.slice_scatter", case(_slice_set, [Fl(3, 5), Fl(3, 2)]),
    case(lambda x, y: (torch.slice_scatter(x, y, 0, 1, 6, 2), torch.slice_scatter(x, y[:1], 0, -2, None, 5),
                       torch.slice_scatter(x, x * 2, 1)), [Fl(7, 3), Fl(3, 3)], raw=True))
add("aten.select_scatter", case(_select_set, [Fl(3, 5), Fl(5)], raw=True))
add("aten.copy", case(_copy, [Fl(3, 4), Fl(4)], [Fl(2, 5), Fl(2, 1)]))
add("aten.fill", case(_fill, [Fl(3, 4)], raw=True))
def _index_put_dim(x, i, v, w):
    x = x.clone()
    x[:, :, i] = v  # a KV cache write: positions along dim 2
    x[:, :, i[:2]] = w[:, :, :2, :1]  # values broadcast along the last dim
    return x


def _index_put_rows(x, i, j, v):
    x = x.clone()
    x[i, 2:4] = v  # one index tensor and a slice
    x[j] = 0.5  # a scalar value
    return x


# duplicate indices without accumulate are undefined in torch (and refused by the reference's Scatter)
add("aten.index_put", case(_index_put, [Fl(5, 3), Distinct(4, 5), Fl(3)]),
    case(_index_put_dim, [Fl(2, 3, 6, 4), Distinct(3, 6), Fl(2, 3, 3, 4), Fl(2, 3, 6, 4)]),
    case(_index_put_rows, [Fl(6, 5), Distinct(3, 6), Distinct(2, 6), Fl(3, 2)]),
    case(_index_put_acc, [Fl(4, 5), Int(6, lo=0, hi=4), Int(6, lo=0, hi=5), Fl(6)]))


# --- indexing ------------------------------------------------------------------------------------------

add("aten.index", case(lambda x, i, j: (x[i], x[:, j], x[i, j[:4]], x[:, i[:2, None], j[None, :3]], x[i[:3], :, j[:3]]),
                       [Fl(5, 6, 7), Int(4, lo=-5, hi=5), Int(5, lo=0, hi=6)]))
add("aten.index_select", case(lambda x, i: (x.index_select(0, i), x.index_select(1, i[:2]), x.mT.index_select(1, i)),
                              [Fl(5, 6), Int(4, lo=0, hi=5)]))
add("aten.gather", case(lambda x, i: (torch.gather(x, 1, i), torch.gather(x, 0, i[:3, :2])), [Fl(4, 6), Int(4, 3, lo=0, hi=4)]))
add("aten.scatter", case(lambda x, i, s: (x.scatter(0, i[:2, :3], 2.5), x.scatter(1, i, s, reduce="add"),
                                       x.scatter(1, i, s, reduce="multiply")),
                         [Fl(4, 6), Int(4, 3, lo=0, hi=4), Fl(4, 5)]),
    # a plain scatter over every row: one Scatter, whose positions are distinct per line (torch leaves repeats undefined)
    case(lambda x, d, s: (x.scatter(1, d.expand(4, 3), s), x.scatter(1, d[:2].expand(4, 2), s * 2), x.mT.scatter(0, d[:, None].expand(3, 4), s.mT)),
         [Fl(4, 6), Distinct(3, 6, negative=False), Fl(4, 6)], raw=True))
add("aten.scatter_add", case(lambda x, i, s: (x.scatter_add(1, i, s), x.scatter_add(0, i[:2], s[:3])),
                             [Fl(4, 6), Int(4, 3, lo=0, hi=4), Fl(4, 5)]))
add("aten.scatter_reduce", case(lambda x, i, s: tuple(x.scatter_reduce(1, i, s, r) for r in ("sum", "prod", "amax", "amin")),
                                [Fl(4, 6), Int(4, 3, lo=0, hi=4), Fl(4, 5)]))
add("aten.index_add", case(lambda x, i, s: (x.index_add(0, i, s), x.index_add(1, i[:2], s[:5, :2], alpha=2)),
                           [Fl(5, 4), Int(6, lo=0, hi=4), Fl(6, 4)], raw=True))
add("aten.index_copy", case(lambda x, s: x.index_copy(0, torch.tensor([3, 0, 1]), s), [Fl(5, 4), Fl(3, 4)], raw=True),
    case(lambda x, i, s: (x.index_copy(2, i, s), x.index_copy(-2, i[:1], s[:, :, 1:2] * 2)),
         [Fl(2, 3, 6, 4), Distinct(3, 6, negative=False), Fl(2, 3, 3, 4)], raw=True))
add("aten.index_fill", case(lambda x, i: (x.index_fill(1, i, -1.0), x.index_fill(0, i[:2], 2.0)), [Fl(4, 5), Int(3, lo=0, hi=4)],
                            raw=True))
add("aten.embedding", case(lambda w, i: (F.embedding(i, w), F.embedding(i[0], w)), [Fl(10, 4), Int(2, 3, lo=0, hi=10)], half=True))


# --- nn ------------------------------------------------------------------------------------------------

add("aten.softmax", case(lambda x: (x.softmax(-1), x.softmax(0), x.transpose(-1, -2).softmax(-1), (x * 50).softmax(-1),
                                    F.softmax(x, 0, dtype=torch.float64)), [Fl(3, 4)], [Fl(2, 3, 5)], half=True))
add("aten._softmax", case(lambda x: (torch.ops.aten._softmax(x, -1, False), torch.ops.aten._softmax(x.mT, 0, False)), [Fl(3, 4)]))
add("aten._log_softmax", case(lambda x: (torch.ops.aten._log_softmax(x, -1, False), torch.ops.aten._log_softmax(x, 0, False)),
                              [Fl(3, 4)]))
add("aten.log_softmax", case(lambda x: (F.log_softmax(x, -1), F.log_softmax(x, 1)), [Fl(3, 4)], [Fl(2, 3, 4)], half=True))
add("aten._safe_softmax", case(lambda x: torch.ops.aten._safe_softmax(x.masked_fill(x > 1, float("-inf")) * torch.tensor(
    [1.0, 1.0, float("inf")]).unsqueeze(1).expand(3, 4).clamp(max=1), -1), [Uni(1.5, 3, 3, 4)]),
    case(lambda x: torch.ops.aten._safe_softmax(x, 0), [Fl(3, 4)]))
add("aten.layer_norm", case(lambda x, w, b: (F.layer_norm(x, (4,), w, b), F.layer_norm(x, (4,)), F.layer_norm(x, (3, 4), eps=1e-3)),
                            [Fl(2, 3, 4), Fl(4), Fl(4)], half=True))
add("aten.native_layer_norm", case(lambda x, w, b: torch.native_layer_norm(x, (4,), w, b, 1e-5), [Fl(2, 3, 4), Fl(4), Fl(4)]))
add("aten.rms_norm", case(lambda x, w: (F.rms_norm(x, (4,), w, 1e-6), F.rms_norm(x, (3, 4)), F.rms_norm(x.transpose(0, 1), (2, 4))),
                          [Fl(2, 3, 4), Fl(4)], half=True))
add("aten.native_group_norm", case(lambda x, w, b: (F.group_norm(x, 2, w, b), F.group_norm(x, 4)), [Fl(2, 4, 3, 3), Fl(4), Fl(4)]))
add("aten._native_batch_norm_legit_no_training",
    case(lambda x, m, v, w, b: (F.batch_norm(x, m, v, w, b, False, eps=1e-3), F.batch_norm(x, m, v)),
         [Fl(2, 3, 4, 4), Fl(3), Pos(3), Fl(3), Fl(3)], [Fl(2, 3, 5), Fl(3), Pos(3), Fl(3), Fl(3)], half=True))


def _sdpa(q, k, v, mb, ma):
    f = F.scaled_dot_product_attention
    return (f(q, k, v), f(q, k, v, is_causal=True), f(q, k, v, attn_mask=mb), f(q, k, v, attn_mask=ma, scale=0.3),
            f(q.transpose(1, 2).transpose(1, 2), k, v, is_causal=True))


def _sdpa_gqa(q, k, v):
    f = F.scaled_dot_product_attention
    return (f(q, k, v, enable_gqa=True, is_causal=True),
            f(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)))


def _sdpa_masked_rows(q, k, v):
    m = torch.ones(4, 4, dtype=torch.bool).tril()
    m[1] = False  # a fully masked row: torch returns zeros there
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


add("aten.scaled_dot_product_attention",
    case(_sdpa, [Fl(2, 3, 4, 8), Fl(2, 3, 5, 8), Fl(2, 3, 5, 6), Bool(2, 1, 4, 5), Fl(4, 5)], half=True),
    case(_sdpa_gqa, [Fl(1, 4, 5, 8), Fl(1, 2, 5, 8), Fl(1, 2, 5, 8)]),
    case(_sdpa_masked_rows, [Fl(1, 2, 4, 8), Fl(1, 2, 4, 8), Fl(1, 2, 4, 8)]))


add("aten.convolution",
    case(lambda x, w, b: (F.conv2d(x, w, b), F.conv2d(x, w, None, stride=2, padding=1), F.conv2d(x, w, b, dilation=2, padding=(2, 1)),
                          F.conv2d(x, w[:, :2].repeat(2, 1, 1, 1), b.repeat(2), groups=2)),
         [Fl(2, 4, 7, 6), Fl(6, 4, 3, 3), Fl(6)], half=True),
    case(lambda x, w, x3, w3: (F.conv1d(x, w, stride=2, padding=2), F.conv3d(x3, w3, padding=1, stride=(1, 2, 1))),
         [Fl(2, 3, 8), Fl(4, 3, 3), Fl(1, 2, 4, 5, 4), Fl(3, 2, 2, 3, 2)]),
    case(lambda x, w, wg: (F.conv_transpose2d(x, w), F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1),
                           F.conv_transpose2d(x, wg, groups=2, dilation=2), F.conv_transpose1d(x[:, :, 0], w[:, :, 0], stride=3)),
         [Fl(2, 4, 5, 4), Fl(4, 3, 3, 3), Fl(4, 2, 2, 3)]))
add("aten.max_pool2d_with_indices",
    case(lambda x: (F.max_pool2d(x, 2), F.max_pool2d(x, 3, 2, 1), F.max_pool2d(x, 2, ceil_mode=True), F.max_pool2d(x, 3, 1, 1, dilation=2)),
         [Fl(2, 3, 7, 6)], half=True),
    case(lambda i: F.max_pool2d(i.float(), 2), [Int(1, 2, 4, 4)]))
add("aten.max_pool3d_with_indices", case(lambda x: F.max_pool3d(x, 2, 1), [Fl(1, 2, 4, 4, 3)]))
add("aten.max_pool1d", case(lambda x: (F.max_pool1d(x, 2), F.max_pool1d(x, 3, 2, 1)), [Fl(2, 3, 7)], raw=True))
add("aten.max_pool2d", case(lambda x: F.max_pool2d(x, 2), [Fl(2, 3, 6, 6)], raw=True))
add("aten.avg_pool2d",
    case(lambda x: (F.avg_pool2d(x, 2), F.avg_pool2d(x, 3, 2, 1), F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
                    F.avg_pool2d(x, 2, ceil_mode=True), F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                    F.avg_pool2d(x, 2, divisor_override=3)), [Fl(2, 3, 7, 6)], half=True))
add("aten.avg_pool1d", case(lambda x: (F.avg_pool1d(x, 2), F.avg_pool1d(x, 3, 2, 1)), [Fl(2, 3, 7)], raw=True))
add("aten.avg_pool3d", case(lambda x: F.avg_pool3d(x, 2, 1, 1), [Fl(1, 2, 4, 4, 3)]))
add("aten._adaptive_avg_pool2d", case(lambda x: (F.adaptive_avg_pool2d(x, 1), F.adaptive_avg_pool2d(x, (3, 4))), [Fl(2, 3, 7, 6)]))
add("aten._adaptive_avg_pool3d", case(lambda x: F.adaptive_avg_pool3d(x, (2, 3, 1)), [Fl(1, 2, 4, 5, 3)]))
add("aten.adaptive_avg_pool1d", case(lambda x: F.adaptive_avg_pool1d(x, 3), [Fl(2, 3, 7)], raw=True))
add("aten.upsample_bilinear2d", case(lambda x: (F.interpolate(x, scale_factor=2, mode="bilinear"), F.interpolate(x, size=(5, 3), mode="bilinear"),
                                                 F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=True)), [Fl(1, 2, 3, 5)]))
add("aten.upsample_linear1d", case(lambda x: (F.interpolate(x, scale_factor=2.5, mode="linear"), F.interpolate(x, size=3, mode="linear",
                                                                                                             align_corners=True)), [Fl(2, 3, 5)], raw=True))
add("aten.upsample_trilinear3d", case(lambda x: F.interpolate(x, scale_factor=2, mode="trilinear"), [Fl(1, 2, 3, 2, 2)], raw=True))
add("aten.upsample_nearest1d", case(lambda x: F.interpolate(x, scale_factor=2), [Fl(2, 3, 5)], raw=True))
add("aten.upsample_nearest2d", case(lambda x: (F.interpolate(x, scale_factor=2), F.interpolate(x, size=(7, 4))), [Fl(1, 2, 3, 5)]))
add("aten.upsample_nearest3d", case(lambda x: F.interpolate(x, scale_factor=(2, 1, 3)), [Fl(1, 2, 3, 2, 2)], raw=True))


# --- creation and conversion ---------------------------------------------------------------------------

add("aten.full", case(lambda x: (x + torch.full((3, 4), 2.5), torch.full((2,), 3, dtype=torch.int64), torch.full((2, 2), True)), [Fl(3, 4)]))
add("aten.full_like", case(lambda x: (torch.full_like(x, 7.0), torch.full_like(x, 2, dtype=torch.int64)), [Fl(3, 4)], raw=True))
add("aten.new_full", case(lambda x: x.new_full((2, 3), 4.0), [Fl(3, 4)], raw=True))
add("aten.zeros", case(lambda x: (x + torch.zeros(4), torch.zeros(2, 3, dtype=torch.bool)), [Fl(3, 4)], raw=True))
add("aten.zeros_like", case(lambda x: torch.zeros_like(x) + x, [Fl(3, 4)], raw=True))
add("aten.new_zeros", case(lambda x: x.new_zeros((2, 3)), [Fl(3, 4)], raw=True))
add("aten.ones", case(lambda x: x + torch.ones(3, 4), [Fl(3, 4)], raw=True))
add("aten.ones_like", case(lambda x: torch.ones_like(x, dtype=torch.int32), [Fl(3, 4)], raw=True))
add("aten.new_ones", case(lambda x: x.new_ones((5,)), [Fl(3, 4)], raw=True))
add("aten.empty", case(lambda x: torch.empty(3, 4).fill_(1.0) + x, [Fl(3, 4)], raw=True))
add("aten.empty_like", case(lambda x: torch.empty_like(x).fill_(2.0) * x, [Fl(3, 4)], raw=True))
add("aten.new_empty", case(lambda x: x.new_empty((3, 4)).fill_(3.0) * x, [Fl(3, 4)], raw=True))
add("aten.new_empty_strided", case(lambda x: x.new_empty_strided((3, 4), (4, 1)).fill_(2.0) * x, [Fl(3, 4)], raw=True))
add("aten.empty_permuted", case(lambda x: torch.empty_permuted((3, 4), (1, 0)).fill_(2.0) * x, [Fl(3, 4)], raw=True))
add("aten.empty_strided", case(lambda x: torch.empty_strided((3, 4), (4, 1)).fill_(1.5) * x, [Fl(3, 4)], raw=True))
add("aten.scalar_tensor", case(lambda x: torch.where(x > 0, x, torch.scalar_tensor(-1.0)), [Fl(3, 4)], raw=True),
    case(lambda x: torch.where(x > 0, x, -1.0), [Fl(3, 4)]))
add("aten.arange", case(lambda x: (x + torch.arange(4), torch.arange(2, 11, 3), torch.arange(0.0, 1.0, 0.1),
                                   torch.arange(5, dtype=torch.float32) * x[0, 0], torch.arange(-3.5, 2.0)), [Fl(3, 4)]))
add("aten._to_copy", case(lambda x, i: (x.to(torch.int32), i.float(), x.double(), (x > 0).long(), x.to(torch.float16), i.bool()),
                          [Uni(-50, 50, 3, 4), Int(3, 4)]))
add("aten.type_as", case(lambda x, i: i.type_as(x) + x, [Fl(3, 4), Int(3, 4)], raw=True))
add("aten._assert_tensor_metadata", case(lambda x: x.to(torch.float32) * 2 + x.to(torch.float64).float(), [Fl(3, 4)]))

# --- quantised weights' custom ops (egraft.frontend.quantize) ----------------------------------------------
from egraft.frontend.quantize import unpack_int4  # noqa: E402  (registers egraft::unpack_int4)

add("egraft.unpack_int4", case(lambda p, x: (unpack_int4(p), unpack_int4(p).to(x.dtype) * x),
                               [Int(3, 32, lo=-128, hi=128, dtype="int8"), Fl(3, 64)]))
