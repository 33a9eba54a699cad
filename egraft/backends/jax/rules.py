"""JAX lowering rules, one per IR op (primitives, leaves, View and idioms).

``RULES[op](ctx, node, *args) -> jax array``.  ``args`` are the lowered
inputs; ``ctx`` (a :class:`LowerCtx`) carries the knobs and dtype mapping.
A rule may return its result in a wider dtype (half types are computed in
float32, as the reference interpreter does); the program casts every
result to the node's own dtype, so rounding happens after each op exactly
as in ``ir.evaluate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...ir import dtypes
from ...ir.ops import TensorValue
from .views import StackPlan, apply_view, plan_view

STAT_ZERO = {"view_gathers": 0, "view_stacks": 0, "peephole_dots": 0, "peephole_takes": 0, "peephole_slices": 0,
             "peephole_puts": 0, "peephole_convs": 0, "peephole_pools": 0, "panel_dots": 0, "kernel_dots": 0,
             "view_dots": 0}


@dataclass
class LowerCtx:
    knobs: dict
    x64: bool  # int64/float64 kept as such; otherwise int64 is computed as int32
    stats: dict = field(default_factory=lambda: dict(STAT_ZERO))

    def jdt(self, dt: str):
        """The jax dtype a value of IR dtype `dt` is held in."""
        if dt == "int64" and not self.x64:
            return jnp.int32
        return dtypes.to_numpy(dt)

    @property
    def precision(self):
        return lax.Precision.HIGHEST if self.knobs.get("precision", "highest") == "highest" else lax.Precision.DEFAULT


def compute_f32(x):
    """Half types are computed in float32 (the program rounds the result back)."""
    return x.astype(dtypes.compute_dtype(x.dtype.name)) if dtypes.is_half(x.dtype.name) else x


# --- elementwise ----------------------------------------------------------------

def _unary(fn: Callable) -> Callable:
    return lambda ctx, node, x: fn(compute_f32(x))


def _add(ctx, node, a, b):
    return jnp.logical_or(a, b) if node.dtype == "bool" else compute_f32(a) + compute_f32(b)


def _mul(ctx, node, a, b):
    return jnp.logical_and(a, b) if node.dtype == "bool" else compute_f32(a) * compute_f32(b)


def _mod(ctx, node, a, b):
    return lax.rem(compute_f32(a), compute_f32(b))  # truncated remainder, the IR's Mod


def _nibble(ctx, node, a, pos):
    """The IR's Nibble: bits 0-3 (pos even) or 4-7 (pos odd) of int8 `a`, sign-extended."""
    shift = 28 - 4 * jnp.bitwise_and(pos.astype(jnp.int32), 1)
    return lax.shift_right_arithmetic(lax.shift_left(a.astype(jnp.int32), shift), 28).astype(jnp.int8)


def _less(ctx, node, a, b):
    return lax.lt(a, b)


def _where(ctx, node, c, a, b):
    return lax.select(c, a, b)


def _cast(ctx, node, x):
    dt = node.dtype
    if dt == "bool":
        return x != 0
    # float -> int truncates toward zero in XLA, as numpy's astype after trunc does
    return x.astype(ctx.jdt(dt))


# --- reductions -------------------------------------------------------------------

def _sum(ctx, node, x):
    return jnp.sum(compute_f32(x), axis=node.attrs["axis"])


def _max(ctx, node, x):
    ax = node.attrs["axis"]
    if x.dtype == jnp.bool_:
        return jnp.any(x, axis=ax)
    m = jnp.max(x, axis=ax)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return m
    # XLA:CPU's vectorised max over a long axis (> 512 here) drops NaN; torch.amax and the reference keep it
    return jnp.where(jnp.any(jnp.isnan(x), axis=ax), jnp.array(jnp.nan, m.dtype), m)


# --- index ----------------------------------------------------------------------------

def _iota(ctx, node):
    return lax.iota(ctx.jdt(node.dtype), node.attrs["n"])


def _gather(ctx, node, x, idx):
    # indices are promised in range by the IR; clip keeps a bad index deterministic
    return jnp.take_along_axis(x, idx, axis=node.attrs["axis"], mode="clip")


def scatter_functional(ctx, node, x, idx, upd):
    """``Scatter`` as a new array (``put_along_axis``): `x` with `upd` at `idx` along the axis.

    The index grid is `idx` on the axis and an iota on every other axis; the IR promises the indices in
    range and distinct per line (``unique_indices``), and ``drop`` keeps a bad index deterministic.
    """
    ax = node.attrs["axis"]
    grid = tuple(idx if d == ax else lax.broadcasted_iota(idx.dtype, idx.shape, d) for d in range(idx.ndim))
    return x.at[grid].set(upd.astype(x.dtype), mode="drop", unique_indices=True)


# --- leaves and movement -------------------------------------------------------------

def _constant(ctx, node):
    v = node.attrs["value"]
    arr = v.array if isinstance(v, TensorValue) else np.asarray(v)
    arr = arr.astype(dtypes.to_numpy(node.dtype))
    if node.dtype == "int64" and not ctx.x64:
        arr = arr.astype(np.int32)
    x = jnp.asarray(arr)
    if dtypes.is_float(node.dtype) and arr.size == 1 and float(arr.item()) == 0 and not np.signbit(float(arr.item())):
        # XLA folds x + 0.0 to x, which is wrong for x = -0.0 (IEEE: -0.0 + 0.0 = +0.0); hide the zero
        x = lax.optimization_barrier(x)
    return jnp.broadcast_to(x, node.shape)


def realise_view(ctx, x, shape, strides, offset):
    """A view of `x` as XLA movement ops (views.plan_view); counts the pieces that needed more."""
    plan = plan_view(int(np.prod(x.shape)), shape, strides, offset)
    if plan.is_gather:
        ctx.stats["view_gathers"] += 1
    elif isinstance(plan, StackPlan):
        ctx.stats["view_stacks"] += 1
    return apply_view(x, plan)


def _view(ctx, node, x):
    return realise_view(ctx, x, node.attrs["shape"], node.attrs["strides"], node.attrs["offset"])


def _input(ctx, node):  # pragma: no cover - the program binds inputs and weights itself
    raise AssertionError("Input nodes are bound by the program, not lowered by a rule")


# --- idioms (library form) -----------------------------------------------------------

def _batch_dims(rank):
    return tuple(range(rank - 2))


def _matmul(ctx, node, a, b):
    r = a.ndim
    dims = (((r - 1,), (r - 2,)), (_batch_dims(r), _batch_dims(r)))
    pref = dtypes.compute_dtype(a.dtype.name) if dtypes.is_half(a.dtype.name) else None
    return lax.dot_general(a, b, dims, precision=ctx.precision, preferred_element_type=pref)


def _softmax(ctx, node, x):
    return jax.nn.softmax(compute_f32(x), axis=node.attrs["axis"])


def _layernorm(ctx, node, x):
    x = compute_f32(x)
    ax, eps = node.attrs["axis"], node.attrs["eps"]
    d = x - jnp.mean(x, axis=ax, keepdims=True)
    return d * lax.rsqrt(jnp.mean(d * d, axis=ax, keepdims=True) + eps)


def _rmsnorm(ctx, node, x):
    x = compute_f32(x)
    ax, eps = node.attrs["axis"], node.attrs["eps"]
    return x * lax.rsqrt(jnp.mean(x * x, axis=ax, keepdims=True) + eps)


def _attention(ctx, node, q, k, v, bias=None):
    """softmax(q k^T * scale + bias, causal mask) v as two dot_generals, f32 inside."""
    q, k, v = compute_f32(q), compute_f32(k), compute_f32(v)
    r = q.ndim
    b = _batch_dims(r)
    s = lax.dot_general(q, k, (((r - 1,), (r - 1,)), (b, b)), precision=ctx.precision) * node.attrs["scale"]
    if bias is not None:
        s = s + compute_f32(bias)
    if node.attrs["causal"]:
        sq, sk = s.shape[-2], s.shape[-1]
        keep = lax.broadcasted_iota(jnp.int32, (sq, sk), 1) <= lax.broadcasted_iota(jnp.int32, (sq, sk), 0)
        s = jnp.where(keep, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return lax.dot_general(p, v, (((r - 1,), (r - 2,)), (b, b)), precision=ctx.precision)


_UNARY = {"Exp2": jnp.exp2, "Log2": jnp.log2, "Sin": jnp.sin, "Sqrt": jnp.sqrt, "Recip": jnp.reciprocal}

# one entry per op (tests/backends/test_rule_tables.py checks every op of Group.ALL has one)
RULES: dict[str, Callable[..., Any]] = {
    **{op: _unary(fn) for op, fn in _UNARY.items()},
    "Add": _add,
    "Mul": _mul,
    "Mod": _mod,
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
