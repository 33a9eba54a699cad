"""Torch lowering rules: one per IR op, each writing ATen calls into the FX graph.

``RULES[op](ctx, node, *args) -> fx.Node``: ``ctx`` is the
:class:`~.emit.Emitter`, ``node`` the IR node, ``args`` the FX values of
its inputs, each held in its IR node's dtype.  A rule may return its result
in a wider dtype (half types are computed in float32, as the reference
interpreter does, accumulations included: a float16 sum or matmul
accumulates in float32); the program converts every result to the node's
own dtype, so rounding happens after each op exactly as in ``ir.evaluate``.

Semantics that needed care (pinned by the conformance and special-value
tests): ``Add``/``Mul`` on bool are ``logical_or``/``logical_and``;
``Mod`` is ``fmod`` (truncated, sign of the dividend; an integer division by
zero raises, as the reference does); ``SumReduce`` passes its dtype to
``sum`` (torch would widen int32 to int64, numpy keeps int32 and wraps);
``MaxReduce`` on bool is ``any``; ``Gather`` and ``Scatter`` need int64 indices;
conversions go through :func:`.emit.convert` (single rounding); a fully
masked attention row is NaN, so attention with a bias operand is never
``scaled_dot_product_attention`` (which returns 0 there).
"""

from __future__ import annotations

from math import prod
from typing import Any, Callable

import torch

from ...ir import dtypes
from ...ir.ops import constant_array
from .emit import TORCH_DTYPES, Emitter, aten, constant_value, convert, from_numpy
from .views import emit_view

# --- elementwise --------------------------------------------------------------------------


def _unary(op) -> Callable:
    def rule(ctx: Emitter, node, x):
        x = ctx.f32(x)
        return ctx.call(op, (x,), ctx.dt(x))
    return rule


def _binary(op, bool_op=None) -> Callable:
    def rule(ctx: Emitter, node, a, b):
        if ctx.dt(a) == "bool" and bool_op is not None:
            return ctx.call(bool_op, (a, b), "bool")
        a, b = ctx.f32(a), ctx.f32(b)
        return ctx.call(op, (a, b), ctx.dt(a))
    return rule


def _nibble(ctx: Emitter, node, a, pos):
    """The IR's Nibble: bits 0-3 (pos even) or 4-7 (pos odd) of int8 `a`, sign-extended, through int32."""
    wide = ctx.call(aten._to_copy.default, (a,), "int32", dtype=torch.int32)
    odd = ctx.call(aten.bitwise_and.Scalar, (ctx.call(aten._to_copy.default, (pos,), "int32", dtype=torch.int32), 1),
                   "int32")
    shift = ctx.call(aten.rsub.Scalar, (ctx.call(aten.mul.Scalar, (odd, 4), "int32"), 28), "int32")
    up = ctx.call(aten.bitwise_left_shift.Tensor, (wide, shift), "int32")
    down = ctx.call(aten.bitwise_right_shift.Tensor_Scalar, (up, 28), "int32")
    return ctx.call(aten._to_copy.default, (down,), "int8", dtype=torch.int8)


def _less(ctx: Emitter, node, a, b):
    return ctx.call(aten.lt.Tensor, (a, b), "bool")  # exact in any dtype: no widening needed


def _where(ctx: Emitter, node, c, a, b):
    return ctx.call(aten.where.self, (c, a, b), ctx.dt(a))


def _cast(ctx: Emitter, node, x):
    return convert(ctx, x, node.dtype)


# --- reductions ---------------------------------------------------------------------------


def _sum(ctx: Emitter, node, x):
    dt = dtypes.compute_name(ctx.dt(x))  # accumulate half in float32
    return ctx.call(aten.sum.dim_IntList, (x, [node.attrs["axis"]], False), dt, dtype=TORCH_DTYPES[dt])


def _max(ctx: Emitter, node, x):
    ax = node.attrs["axis"]
    if ctx.dt(x) == "bool":
        return ctx.call(aten.any.dim, (x, ax, False), "bool")
    return ctx.call(aten.amax.default, (x, [ax], False), ctx.dt(x))  # NaN propagates, as numpy's max


# --- index ----------------------------------------------------------------------------------


def _iota(ctx: Emitter, node):
    n, dt = node.attrs["n"], node.dtype
    if dtypes.is_int(dt):
        return ctx.call(aten.arange.default, (n,), dt, dtype=TORCH_DTYPES[dt], device=ctx.device)
    x = ctx.call(aten.arange.default, (n,), "int64", dtype=torch.int64, device=ctx.device)
    # the reference: arange(n) in int64, converted to the compute dtype (float32 for half types)
    return convert(ctx, x, dtypes.compute_name(dt))


def _gather(ctx: Emitter, node, x, idx):
    if ctx.dt(idx) != "int64":
        idx = convert(ctx, idx, "int64")
    return ctx.call(aten.gather.default, (x, node.attrs["axis"], idx), ctx.dt(x))


def scatter_functional(ctx: Emitter, node, x, idx, upd):
    """``Scatter`` as a new tensor: ``aten.scatter.src`` (out of place; indices int64, distinct per line)."""
    if ctx.dt(idx) != "int64":
        idx = convert(ctx, idx, "int64")
    return ctx.call(aten.scatter.src, (x, node.attrs["axis"], idx, upd), ctx.dt(x))


# --- leaves and movement -------------------------------------------------------------------


def _constant(ctx: Emitter, node):
    arr = constant_array(node.attrs, node.shape, dtypes.to_numpy(node.dtype))  # rounded once to the dtype
    if arr.size == 1 and ctx.knobs.get("mode") == "inductor":
        # a literal Inductor folds into the kernels that read it
        return ctx.full(node.shape, constant_value(arr, node.dtype), node.dtype)
    return ctx.tensor(from_numpy(arr).to(ctx.device), node.dtype, "const")


def _view(ctx: Emitter, node, x):
    return emit_view(ctx, x, ctx.in_shapes(node)[0], node.attrs["shape"], node.attrs["strides"], node.attrs["offset"])


def _input(ctx: Emitter, node):  # pragma: no cover - the program binds inputs and weights itself
    raise AssertionError("Input nodes are bound by the program, not lowered by a rule")


# --- idioms (library form) ------------------------------------------------------------------


def matmul(ctx: Emitter, a, b, a_shape, b_shape, dt: str):
    """``a [..., M, K] @ b [..., K, N]`` (equal batch dims) as ``mm`` / ``bmm``."""
    if len(a_shape) == 2:
        return ctx.call(aten.mm.default, (a, b), dt)
    if len(a_shape) == 3:
        return ctx.call(aten.bmm.default, (a, b), dt)
    batch = list(a_shape[:-2])
    nb = prod(batch)
    a3 = ctx.call(aten.reshape.default, (a, [nb, *a_shape[-2:]]), dt)
    b3 = ctx.call(aten.reshape.default, (b, [nb, *b_shape[-2:]]), dt)
    out = ctx.call(aten.bmm.default, (a3, b3), dt)
    return ctx.call(aten.reshape.default, (out, batch + [a_shape[-2], b_shape[-1]]), dt)


def _matmul(ctx: Emitter, node, a, b):
    a, b = ctx.f32(a), ctx.f32(b)
    sa, sb = ctx.in_shapes(node)
    return matmul(ctx, a, b, sa, sb, ctx.dt(a))


def _softmax(ctx: Emitter, node, x):
    x = ctx.f32(x)
    return ctx.call(aten._softmax.default, (x, node.attrs["axis"], False), ctx.dt(x))


def _last_axis(ctx: Emitter, node, x, fn):
    """`fn` applied over the last axis, with the node's axis moved there and back (a permuted view)."""
    x = ctx.f32(x)
    dt, rank, ax = ctx.dt(x), len(node.shape), node.attrs["axis"]
    if ax == rank - 1:
        return fn(x, dt)
    perm = [d for d in range(rank) if d != ax] + [ax]
    inv = [perm.index(d) for d in range(rank)]
    y = fn(ctx.call(aten.permute.default, (x, perm), dt), dt)
    return ctx.call(aten.permute.default, (y, inv), dt)


def _layernorm(ctx: Emitter, node, x):
    n, eps = node.shape[node.attrs["axis"]], node.attrs["eps"]
    return _last_axis(ctx, node, x, lambda v, dt: ctx.item(
        ctx.call(aten.native_layer_norm.default, (v, [n], None, None, eps), dt), 0, dt))


def _rmsnorm(ctx: Emitter, node, x):
    n, eps = node.shape[node.attrs["axis"]], node.attrs["eps"]
    return _last_axis(ctx, node, x, lambda v, dt: ctx.item(
        ctx.call(aten._fused_rms_norm.default, (v, [n], None, eps), dt), 0, dt))


def _attention(ctx: Emitter, node, q, k, v, bias=None):
    """``softmax(q k^T * scale + bias, causal mask) v`` in float32 (float64 stays float64).

    Under the knob ``attention="sdpa"`` (the default) a bias-free attention
    is one ``scaled_dot_product_attention`` call (its causal mask is top-left
    aligned, as the IR's, so no row is fully masked); with a bias it is
    composed, because sdpa returns 0 for a fully masked row where the IR
    (and ``torch.softmax``) give NaN.
    """
    q, k, v = ctx.f32(q), ctx.f32(k), ctx.f32(v)
    dt = ctx.dt(q)
    scale, causal = node.attrs["scale"], node.attrs["causal"]
    if bias is None and ctx.knobs.get("attention", "sdpa") == "sdpa":
        return ctx.call(aten.scaled_dot_product_attention.default, (q, k, v, None, 0.0, causal), dt, scale=scale)
    qs, ks, vs = ctx.in_shapes(node)[:3]
    r = len(qs)
    kt = ctx.call(aten.transpose.int, (k, r - 2, r - 1), dt)
    kts = ks[:-2] + (ks[-1], ks[-2])
    s = ctx.call(aten.mul.Tensor, (matmul(ctx, q, kt, qs, kts, dt), scale), dt)
    if bias is not None:
        s = ctx.call(aten.add.Tensor, (s, ctx.f32(bias)), dt)
    if causal:
        sq, sk = qs[-2], ks[-2]
        row = ctx.call(aten.arange.default, (sq,), "int64", dtype=torch.int64, device=ctx.device)
        col = ctx.call(aten.arange.default, (sk,), "int64", dtype=torch.int64, device=ctx.device)
        keep = ctx.call(aten.le.Tensor, (ctx.call(aten.reshape.default, (col, [1, sk]), "int64"),
                                         ctx.call(aten.reshape.default, (row, [sq, 1]), "int64")), "bool")
        s = ctx.call(aten.where.ScalarOther, (keep, s, float("-inf")), dt)
    p = ctx.call(aten._softmax.default, (s, r - 1, False), dt)
    return matmul(ctx, p, v, qs[:-1] + (ks[-2],), vs, dt)


_UNARY = {"Exp2": aten.exp2.default, "Log2": aten.log2.default, "Sin": aten.sin.default,
          "Sqrt": aten.sqrt.default, "Recip": aten.reciprocal.default}

# one entry per op (tests/backends/test_rule_tables.py checks every op of Group.ALL has one)
RULES: dict[str, Callable[..., Any]] = {
    **{op: _unary(fn) for op, fn in _UNARY.items()},
    "Add": _binary(aten.add.Tensor, aten.logical_or.default),
    "Mul": _binary(aten.mul.Tensor, aten.logical_and.default),
    "Mod": _binary(aten.fmod.Tensor),  # truncated remainder, the IR's Mod
    "Nibble": _nibble,
    "LessThan": _less,
    "Where": _where,
    "SumReduce": _sum,
    "MaxReduce": _max,
    "Iota": _iota,
    "Gather": _gather,
    "Scatter": scatter_functional,
    "Cast": _cast,
    "Input": _input,
    "Constant": _constant,
    "View": _view,
    "MatMul": _matmul,
    "Softmax": _softmax,
    "LayerNorm": _layernorm,
    "RMSNorm": _rmsnorm,
    "Attention": _attention,
}
