"""Witnesses of the idiom rules (:mod:`.idioms`): one per form, and the near-misses.

Kept apart from the matchers so each module stays short; like :mod:`.match`
this is not a family (it has no ``RULES``).
"""

from __future__ import annotations

import numpy as np

from ...ir.builder import GraphBuilder, Tensor
from ..rule import Witness, dims

def _w_matmul(rng):
    b = GraphBuilder()
    batch = dims(rng, int(rng.integers(0, 3)))
    m, k, n = dims(rng, 3, 2, 6)
    x = b.input("x", batch + (m, k), "float32")
    w = b.weight("w", rng.standard_normal((n, k)).astype(np.float32))
    return Witness(b.build([x @ w.T]))


def _w_rowwise(kind):
    def wit(rng):
        b = GraphBuilder()
        sh = dims(rng, int(rng.integers(1, 4)), 2, 6)
        x = b.input("x", sh, "float32")
        eps = float(rng.choice([1e-5, 1e-6, 0.1]))
        out = {"softmax": lambda: x.softmax(-1), "layernorm": lambda: x.layer_norm(eps),
               "rmsnorm": lambda: x.rms_norm(eps)}[kind]()
        return Witness(b.build([out]))
    return wit


def _w_attention(rng):
    """q @ k^T * scale [+ bias] [causal] -> Softmax idiom -> @ v, with MatMul/Softmax nodes
    already present (the matmul and softmax rules put them there in a full run)."""
    b = GraphBuilder()
    batch = dims(rng, int(rng.integers(0, 3)))
    sq, sk, d, dv = dims(rng, 4, 2, 6)
    causal = bool(rng.integers(2))
    q = b.input("q", batch + (sq, d), "float32")
    k = b.input("k", batch + (sk, d), "float32")
    v = b.input("v", batch + (sk, dv), "float32")
    s = b.add("MatMul", [q, k.transpose(-2, -1)]) * float(rng.uniform(0.1, 1))
    if rng.integers(2):
        s = s + b.input("bias", batch + (sq, sk), "float32")
    if causal:
        i = b.iota(sq, "int64").reshape((sq, 1))
        j = b.iota(sk, "int64").reshape((1, sk))
        s = Tensor.where(j <= i, s, float("-inf"))
    p = b.add("Softmax", [s], axis=len(batch) + 1)
    return Witness(b.build([b.add("MatMul", [p, v])]))


def _w_online(rng):
    b = GraphBuilder()
    batch = dims(rng, int(rng.integers(0, 3)))
    sq, dv = dims(rng, 2, 1, 5)
    sk = int(rng.choice([4, 6, 8, 12]))
    s = b.input("s", batch + (sq, sk), "float32")
    v = b.input("v", batch + (sk, dv), "float32")
    p = b.add("Softmax", [s], axis=len(batch) + 1)
    if rng.integers(2):  # some fully masked tiles: a causal-style -inf fill
        i = b.iota(sq, "int64").reshape((sq, 1))
        j = b.iota(sk, "int64").reshape((1, sk))
        p = b.add("Softmax", [Tensor.where(j <= i, s, float("-inf"))], axis=len(batch) + 1)
    return Witness(b.build([b.add("MatMul", [p, v])]))


# --- the other forms and the near-misses -----------------------------------------------------------

def _w_row(build, min_rank=1):
    """A witness of build(x, y) over x, y [.., N] (rank min_rank..3)."""
    def wit(rng):
        b = GraphBuilder()
        x = b.input("x", dims(rng, int(rng.integers(min_rank, 4)), 2, 6), "float32")
        return Witness(b.build([build(x, b.input("y", x.shape, "float32"))]))
    return wit


def _row_stat(t, op):
    return getattr(t, op)(-1, keepdim=True)


_ROW_FORMS = {  # the operand orders the builder's forms do not use
    "softmax": (lambda x, y: _row_stat((x - _row_stat(x, "max")).exp(), "sum").recip() * (x - _row_stat(x, "max")).exp(),),
    "layernorm": (lambda x, y: (_row_stat(_sq(x - _row_stat(x, "mean")), "mean") + 1e-5).rsqrt() * (x - _row_stat(x, "mean")),),
    "rmsnorm": (lambda x, y: (_row_stat(x * x, "mean") + 1e-5).rsqrt() * x,),
}
_ROW_NEAR = {  # the shift / statistic is of the wrong tensor or axis
    "softmax": (lambda x, y: _softmax_shift(x, x.max(0, keepdim=True)), lambda x, y: _softmax_shift(x, _row_stat(y, "max"))),
    "layernorm": (lambda x, y: (x - _row_stat(x, "mean")) * (_row_stat(x * x, "mean") + 1e-5).rsqrt(),),
    "rmsnorm": (lambda x, y: x * (_row_stat(y * y, "mean") + 1e-5).rsqrt(),),
}


def _sq(t):
    return t * t


def _softmax_shift(x, m):
    e = (x - m).exp()
    return e * _row_stat(e, "sum").recip()


def _w_matmul_swapped(rng, full=False):
    """sum(expand(b) * expand(a), -2): the other Mul order; near-miss (full): nothing is broadcast."""
    b = GraphBuilder()
    m, k, n = dims(rng, 3, 2, 6)
    x = b.input("x", (m, k), "float32")
    w = b.input("w", (k, n), "float32")
    if full:
        y = b.input("y", (m, n), "float32").unsqueeze(1).expand((m, k, n))  # a stride-0 view that varies along M
        return Witness(b.build([(y * x.unsqueeze(-1).expand((m, k, n))).sum(-2)]))
    return Witness(b.build([(w.unsqueeze(0).expand((m, k, n)) * x.unsqueeze(-1).expand((m, k, n))).sum(-2)]))


def _w_attention_form(causal, bias, scaled, bias_first=False, fill=float("-inf"), anti=False):
    """q @ k^T [* scale] [+ bias] [causal] as Softmax @ v; near-misses: a non -inf fill, a mask
    that is not causal (j >= i)."""
    def wit(rng):
        b = GraphBuilder()
        sq, sk, d, dv = dims(rng, 4, 2, 6)
        q, k, v = (b.input(nm, sh, "float32") for nm, sh in (("q", (sq, d)), ("k", (sk, d)), ("v", (sk, dv))))
        s = b.add("MatMul", [q, k.transpose(-2, -1)])
        s = s * float(rng.uniform(0.1, 1)) if scaled else s
        if bias:
            bb = b.input("bias", (sq, sk), "float32")
            s = bb + s if bias_first else s + bb
        if causal:
            i = b.iota(sq, "int64").reshape((sq, 1))
            j = b.iota(sk, "int64").reshape((1, sk))
            s = Tensor.where((i <= j) if anti else (j <= i), s, fill)
        return Witness(b.build([b.add("MatMul", [b.add("Softmax", [s], axis=1), v])]))
    return wit


def _w_online_form(masked, sizes=(4, 6, 8, 12)):
    def wit(rng):
        b = GraphBuilder()
        sq, dv = dims(rng, 2, 1, 5)
        sk = int(rng.choice(sizes))
        s, v = b.input("s", (sq, sk), "float32"), b.input("v", (sk, dv), "float32")
        if masked:
            s = Tensor.where(b.iota(sk, "int64").reshape((1, sk)) <= b.iota(sq, "int64").reshape((sq, 1)), s, float("-inf"))
        return Witness(b.build([b.add("MatMul", [b.add("Softmax", [s], axis=1), v])]))
    return wit


_ATT_FORMS = [_w_attention_form(*f) for f in
              [(False, False, False), (True, False, True), (False, True, True), (True, True, False), (False, True, True, True)]]
_ATT_NEAR = [_w_attention_form(True, False, True, fill=0.0), _w_attention_form(True, False, True, anti=True)]


def _near_matmul(rng):
    return _w_matmul_swapped(rng, full=True)


_PRIMES = (5, 7, 11)
# rule short name -> (first witness, other forms, near-misses)
WITNESSES = {
    "matmul": (_w_matmul, (_w_matmul_swapped,), (_near_matmul,)),
    "softmax": (_w_rowwise("softmax"), (), ()),
    "layernorm": (_w_rowwise("layernorm"), (), ()),
    "rmsnorm": (_w_rowwise("rmsnorm"), (), ()),
    "attention": (_w_attention, tuple(_ATT_FORMS), tuple(_ATT_NEAR)),
    "online-softmax": (_w_online, (_w_online_form(False), _w_online_form(True)),
                       (_w_online_form(False, _PRIMES), _w_online_form(True, _PRIMES))),
}


def witnesses(short: str) -> dict:
    """RuleSpec keyword arguments ``witness``, ``witnesses``, ``near_misses`` for idioms.<short>."""
    first, forms, near = WITNESSES[short]
    forms = tuple(forms) + tuple(_w_row(f) for f in _ROW_FORMS.get(short, ()))
    near = tuple(near) + tuple(_w_row(f, min_rank=2) for f in _ROW_NEAR.get(short, ()))  # axis 0 is not the row
    return dict(witness=first, witnesses=forms, near_misses=near)
