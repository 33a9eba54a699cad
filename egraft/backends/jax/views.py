"""Realise an IR ``View`` with XLA movement ops instead of a gather.

XLA gathers are slow on CPU and block fusion, while reshape / slice /
transpose / rev / broadcast are free or fuse into their consumer.  A view
whose strides nest is one such chain (the backend-neutral decomposition,
:func:`egraft.ir.strided_box.box_plan`).  Views whose dimensions overlap
(sliding windows, as convolution uses) are split here along their smallest
offending dimension into a stack of nesting views; only if that would take
too many pieces does the plan fall back to one gather from the flat source
with static indices.

The plan is pure shape arithmetic (:func:`egraft.ir.strided_box.plan_view`,
shared with the torch backend), tested without JAX;
:func:`apply_view` runs a plan on a ``jax`` array (this module's emission is
:class:`_JaxOps`, the movement ops in ``jnp`` / ``lax``).
"""

from __future__ import annotations

import numpy as np

from ...ir.strided import gather_index
from ...ir.strided_box import (MAX_STACK_PIECES, GatherPlan, NumpyOps, SlicePlan, StackPlan, ZeroPlan, plan_view,
                               run_box_plan)

__all__ = [
    "GatherPlan", "MAX_STACK_PIECES", "NumpyOps", "SlicePlan", "StackPlan", "ZeroPlan", "apply_view", "gather_index",
    "plan_view",
]


class _JaxOps:
    """The movement ops a plan needs, in jax (``ir.strided_box.NumpyOps`` is the numpy twin tests run)."""

    def __init__(self):
        import jax.numpy as jnp
        from jax import lax

        self.jnp, self.lax = jnp, lax

    def zeros(self, shape, dt):
        return self.jnp.zeros(shape, dt)

    def reshape(self, x, shape):
        return self.jnp.reshape(x, shape)

    def slice(self, x, starts, limits):
        return self.lax.slice(x, tuple(starts), tuple(limits))

    def pad_end(self, x, n):
        return self.jnp.pad(x, (0, n))

    def transpose(self, x, perm):
        return self.jnp.transpose(x, perm)

    def rev(self, x, axes):
        return self.lax.rev(x, tuple(axes))

    def broadcast(self, x, shape, axes):
        return self.lax.broadcast_in_dim(x, shape, tuple(axes))

    def stack(self, xs, axis):
        return self.jnp.stack(xs, axis=axis)

    def take(self, flat, index):
        idx = index.astype(np.int32) if index.max() < 2**31 else index
        return self.jnp.take(flat, self.jnp.asarray(idx), mode="clip")  # static, in range


_JAX_OPS = None


def apply_view(x, plan, ops=None):
    """Run a view plan on the (any-shape) array `x` (jax by default, or ``ops=NumpyOps()``)."""
    global _JAX_OPS
    if ops is None:
        if _JAX_OPS is None:
            _JAX_OPS = _JaxOps()
        ops = _JAX_OPS
    if isinstance(plan, ZeroPlan):
        return ops.zeros(plan.shape, x.dtype)
    return _apply_flat(ops.reshape(x, (-1,)), plan, ops)


def _apply_flat(flat, plan, ops):
    if isinstance(plan, GatherPlan):
        return ops.take(flat, plan.index)
    if isinstance(plan, StackPlan):
        return ops.stack([_apply_flat(flat, p, ops) for p in plan.pieces], plan.axis)
    if isinstance(plan, ZeroPlan):
        return ops.zeros(plan.shape, flat.dtype)
    return run_box_plan(flat, plan, ops)
