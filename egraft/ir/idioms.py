"""Idioms: named compositions of primitives that a backend can run as one kernel.

Each idiom has a direct numpy semantics (``compute``) and a primitive form
(``egraft.ir.idiom_forms``, written with the builder, which sits above this
table: the op registry and so every type check need the table, not the
builder).  The torch lowering writes the primitive form; the e-graph's idiom
rules put the idiom node in the same e-class; a test checks that both agree.  Shapes are explicit: no implicit
broadcasting between operands (a batch dimension is expanded with a View).

* ``MatMul(a, b)``: ``a [..., M, K] @ b [..., K, N]``, equal batch dims.
* ``Softmax(x, axis)``, ``LayerNorm(x, axis, eps)`` (no affine),
  ``RMSNorm(x, axis, eps)`` (no affine).
* ``Attention(q, k, v[, bias], scale, causal)``: q ``[..., Sq, D]``, k ``[..., Sk, D]``,
  v ``[..., Sk, Dv]``, optional additive bias ``[..., Sq, Sk]``; causal masks
  ``j > i`` (top-left aligned, as torch's ``is_causal``).
"""

from __future__ import annotations

import numpy as np

from ..errors import IRError
from . import dtypes
from .ops import OpDef, attrs_of

IDIOMS: dict[str, OpDef] = {}


def _float_dt(op, *ts):
    dts = {t[1] for t in ts}
    if len(dts) != 1:
        raise IRError(f"{op} operands must share one dtype, got {sorted(dts)}")
    dt = dts.pop()
    if not dtypes.is_float(dt):
        raise IRError(f"{op} needs floating-point operands, got {dt}")
    return dt


def _infer_matmul(ts, attrs):
    (a, adt), (b, bdt) = ts
    dt = _float_dt("MatMul", ts[0], ts[1])
    if len(a) < 2 or len(a) != len(b) or a[:-2] != b[:-2] or a[-1] != b[-2]:
        raise IRError(f"MatMul needs [..., M, K] @ [..., K, N] with equal batch dims, got {a} @ {b}")
    return a[:-1] + (b[-1],), dt


def _infer_rowwise(op):
    def infer(ts, attrs):
        (x, dt), = ts
        _float_dt(op, ts[0])
        if not isinstance(attrs["axis"], int) or not 0 <= attrs["axis"] < len(x):
            raise IRError(f"{op} axis {attrs['axis']!r} out of range for shape {x}")
        return x, dt
    return infer


def _infer_attention(ts, attrs):
    q, k, v = ts[0][0], ts[1][0], ts[2][0]
    dt = _float_dt("Attention", *ts)
    if not (len(q) == len(k) == len(v) >= 2) or q[:-2] != k[:-2] or k[:-2] != v[:-2]:
        raise IRError(f"Attention needs q/k/v of one rank with equal batch dims, got {q}, {k}, {v}")
    if q[-1] != k[-1] or k[-2] != v[-2]:
        raise IRError(f"Attention shapes do not line up: q {q}, k {k}, v {v}")
    if len(ts) == 4 and ts[3][0] != q[:-1] + (k[-2],):
        raise IRError(f"Attention bias must have shape {q[:-1] + (k[-2],)}, got {ts[3][0]}")
    return q[:-1] + (v[-1],), dt


def _softmax(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def _attention(q, k, v, *rest):
    attrs = rest[-3]  # rest = ([bias,] attrs, out_shape, np_dtype)
    bias = rest[0] if len(rest) == 4 else None
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * attrs["scale"]
    if bias is not None:
        s = s + bias
    if attrs["causal"]:
        sq, sk = s.shape[-2], s.shape[-1]
        s = np.where(np.tril(np.ones((sq, sk), bool)), s, -np.inf)
    return np.matmul(_softmax(s, -1), v)


def _layernorm(x, attrs, *_):
    ax = attrs["axis"]
    mu = np.mean(x, axis=ax, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=ax, keepdims=True)
    return (x - mu) / np.sqrt(var + attrs["eps"])


def _rmsnorm(x, attrs, *_):
    ax = attrs["axis"]
    return x / np.sqrt(np.mean(x * x, axis=ax, keepdims=True) + attrs["eps"])


def _def(name, kind, arity, attrs, infer, compute, doc):
    IDIOMS[name] = OpDef(name, kind, arity, attrs_of(attrs), infer, compute, doc)


_def("MatMul", "contraction", (2,), "", _infer_matmul, lambda a, b, *_: np.matmul(a, b), "batched matrix product")
_def("Softmax", "row", (1,), "axis:int", _infer_rowwise("Softmax"), lambda x, attrs, *_: _softmax(x, attrs["axis"]),
     "softmax")
_def("LayerNorm", "row", (1,), "axis:int eps:float", _infer_rowwise("LayerNorm"), _layernorm, "layer norm, no affine")
_def("RMSNorm", "row", (1,), "axis:int eps:float", _infer_rowwise("RMSNorm"), _rmsnorm, "RMS norm, no affine")
_def("Attention", "attention", (3, 4), "scale:float causal:bool", _infer_attention, _attention,
     "scaled dot-product attention")
