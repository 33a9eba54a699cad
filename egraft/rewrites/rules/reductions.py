"""Reduction rules: factor out what is constant along the axis, shift invariance, split a reduction.

A factor is "constant along axis ax" when its e-class holds a View whose
stride on ax is 0 (a broadcast scalar, a per-row vector expanded, ...).
Then ``sum(c*x) = c*sum(x)``, ``sum(x+c) = sum(x) + n*c`` and
``max(x+c) = max(x) + c`` (exact: rounding is monotone), with c re-viewed
without that axis.  ``split`` rewrites one reduction of size n = p*q into an
outer reduction of an inner one over a reshaped view: the tiling / split-K
form a backend needs for long reductions; it is explosive (each split can be
split again), so it runs once per explosive step.
"""

from __future__ import annotations

import math

from ...ir import shapes
from ..rule import RuleSpec, Witness, drop, pair, program, rand_shape, scalar, term, view_attrs, view_term


def _constant_along(snap, cls, ax):
    """Views in `cls` with stride 0 on `ax`, re-viewed without that axis."""
    for u in snap.nodes_of(cls, "View"):
        shape, strides, off = view_attrs(u)
        if strides[ax] == 0:
            yield view_term(u.children[0], drop(shape, ax), drop(strides, ax), off)


def _pairs(snap, cls, op):
    for m in snap.nodes_of(cls, op):
        a, b = m.children
        yield a, b
        if a != b:
            yield b, a


def sum_factor(snap):
    """sum_ax(x * c) = sum_ax(x) * c when c is constant along ax."""
    for r in snap.by_op("SumReduce"):
        ax = r.attrs["axis"]
        for x, c in _pairs(snap, r.children[0], "Mul"):
            for cv in _constant_along(snap, c, ax):
                yield r.cls, term("Mul", term("SumReduce", x, axis=ax), cv)


def sum_factor_inner(snap):
    """sum_ax(x * (y * c)) = sum_ax(x * y) * c when c is constant along ax: a product against a weight that is
    scaled per output channel (a quantised weight ``q * s``) sums ``x * q`` and scales once."""
    for r in snap.by_op("SumReduce"):
        ax = r.attrs["axis"]
        for x, yc in _pairs(snap, r.children[0], "Mul"):
            for y, c in _pairs(snap, yc, "Mul"):
                for cv in _constant_along(snap, c, ax):
                    yield r.cls, term("Mul", term("SumReduce", term("Mul", x, y), axis=ax), cv)


def sum_shift(snap):
    """sum_ax(x + c) = sum_ax(x) + n*c when c is constant along ax."""
    for r in snap.by_op("SumReduce"):
        ax = r.attrs["axis"]
        dt = snap.dtype[r.cls]
        if not dt.startswith(("float", "bfloat")):
            continue
        n = snap.shape[r.children[0]][ax]
        out_shape = snap.shape[r.cls]
        for x, c in _pairs(snap, r.children[0], "Add"):
            for cv in _constant_along(snap, c, ax):
                yield r.cls, term("Add", term("SumReduce", x, axis=ax), term("Mul", cv, scalar(float(n), dt, out_shape)))


def max_shift(snap):
    """max_ax(x + c) = max_ax(x) + c when c is constant along ax."""
    for r in snap.by_op("MaxReduce"):
        ax = r.attrs["axis"]
        if snap.dtype[r.cls] == "bool":
            continue
        for x, c in _pairs(snap, r.children[0], "Add"):
            for cv in _constant_along(snap, c, ax):
                yield r.cls, term("Add", term("MaxReduce", x, axis=ax), cv)


def split_size(n: int) -> int | None:
    """The inner tile of a split: the largest divisor of n in (1, sqrt(n)], or None for primes."""
    for d in range(int(math.isqrt(n)), 1, -1):
        if n % d == 0:
            return d
    return None


def split(snap):
    """reduce_ax(x) over n = p*q = reduce_ax(reduce_{ax+1}(reshape x to (.., p, q, ..)))."""
    for op in ("SumReduce", "MaxReduce"):  # named, not Group.REDUCE: the split needs an associative reduction
        for r in snap.by_op(op):
            ax = r.attrs["axis"]
            x = r.children[0]
            s = snap.shape[x]
            q = split_size(s[ax])
            if q is None:
                continue
            shape = tuple(s[:ax]) + (s[ax] // q, q) + tuple(s[ax + 1:])
            v = view_term(x, shape, shapes.contiguous_strides(shape), 0)
            yield r.cls, term(op, term(op, v, axis=ax + 1), axis=ax)


# -- witnesses -------------------------------------------------------------------------------

def _w_sum_factor(rng):
    a, n = rand_shape(rng, 2, lo=2)
    return pair(lambda x, c: (x * c.unsqueeze(1)).sum(1), lambda x, c: x.sum(1) * c, (a, n), (a,))


def _w_sum_factor_inner(rng):
    a, n = rand_shape(rng, 2, lo=2)
    return pair(lambda x, q, c: (x * (q * c.unsqueeze(1))).sum(1), lambda x, q, c: (x * q).sum(1) * c,
                (a, n), (a, n), (a,))


def _w_inner(c_full=False, outer=False):
    """x [a, n] times (q [a, n] times c), c [a] along axis 1 (constant along the sum) or (c_full) c [n] along
    axis 0 (a per-input-channel scale: varies along it); `outer`: the other operand orders."""
    def wit(rng):
        a, m = rand_shape(rng, 2, lo=2)

        def fn(x, q, c):
            cb = (c.unsqueeze(0) if c_full else c.unsqueeze(1)).expand((a, m))
            return ((cb * q) * x).sum(1) if outer else (x * (q * cb)).sum(1)
        return Witness(program(fn, (a, m), (a, m), (m,) if c_full else (a,)))
    return wit


def _w_sum_shift(rng):
    a, n = rand_shape(rng, 2, lo=2)
    return pair(lambda x, c: (x + c.unsqueeze(1)).sum(1), lambda x, c: x.sum(1) + c * float(n), (a, n), (a,))


def _w_max_shift(rng):
    a, n = rand_shape(rng, 2, lo=2)
    return pair(lambda x, c: (x + c.unsqueeze(1)).max(1), lambda x, c: x.max(1) + c, (a, n), (a,))


def _w_split(rng):
    a = int(rng.integers(1, 4))
    n = int(rng.choice([4, 6, 8, 9, 12]))
    return pair(lambda x: x.sum(1) + x.max(1), lambda x: x.reshape((a, n // split_size(n), split_size(n))).sum(2).sum(1)
                + x.reshape((a, n // split_size(n), split_size(n))).max(2).max(1), (a, n))


def _w_red(fn, dtype="float32", n=None, c_full=False):
    """fn(x, c) with x [a, n] and c [a] broadcast along axis 1 (constant along it), or (c_full)
    c [n] broadcast along axis 0: a stride-0 view too, but varying along axis 1."""
    def wit(rng):
        a, m = rand_shape(rng, 2, lo=2)
        m = m if n is None else int(rng.choice(n))
        return Witness(program(lambda x, c: fn(x, (c.unsqueeze(0) if c_full else c.unsqueeze(1)).expand((a, m))),
                               (a, m), (m,) if c_full else (a,), dtype=dtype))
    return wit


_PRIMES = (2, 3, 5, 7)
_FORMS = {  # the other operand order of the matched Mul / Add
    "sum-factor": (_w_red(lambda x, c: (c * x).sum(1)),),
    "sum-factor-inner": (_w_inner(outer=True),),
    "sum-shift": (_w_red(lambda x, c: (c + x).sum(1)),),
    "max-shift": (_w_red(lambda x, c: (c + x).max(1)),),
}
_NEAR = {  # c varies along the reduced axis; an int sum (no float shift); a prime size (no split)
    "sum-factor": (_w_red(lambda x, c: (x * c).sum(1), c_full=True),),
    "sum-factor-inner": (_w_inner(c_full=True), _w_inner(c_full=True, outer=True)),  # a per-input-channel scale
    "sum-shift": (_w_red(lambda x, c: (x + c).sum(1), c_full=True), _w_red(lambda x, c: (x + c).sum(1), "int64")),
    "max-shift": (_w_red(lambda x, c: (x + c).max(1), c_full=True),),
    "split": (_w_red(lambda x, c: x.sum(1) + x.max(1), n=_PRIMES),),
}


def _spec(name, fn, wit, doc, explosive=False):
    short = name.split(".")[1]
    return RuleSpec(name, apply=fn, explosive=explosive, witness=wit, doc=doc, witnesses=_FORMS.get(short, ()),
                    near_misses=_NEAR.get(short, ()))


RULES = [
    _spec("reductions.sum-factor", fn=sum_factor, wit=_w_sum_factor,
          doc="sum(x*c) = sum(x)*c, c constant along the axis"),
    _spec("reductions.sum-factor-inner", fn=sum_factor_inner, wit=_w_sum_factor_inner,
          doc="sum(x*(y*c)) = sum(x*y)*c, c constant along the axis (a per-output-channel weight scale)"),
    _spec("reductions.sum-shift", fn=sum_shift, wit=_w_sum_shift,
          doc="sum(x+c) = sum(x) + n*c, c constant along the axis"),
    _spec("reductions.max-shift", fn=max_shift, wit=_w_max_shift,
          doc="max(x+c) = max(x)+c, c constant along the axis"),
    _spec("reductions.split", fn=split, explosive=True, wit=_w_split,
          doc="split a reduction of size p*q into outer(inner) over a reshaped view (tiling / split-K)"),
]
