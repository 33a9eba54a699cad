"""An IR ``View`` as ATen movement ops.

A view reads the row-major flattening of its source.  When its strides nest
(:func:`egraft.ir.strided_box.box_plan`) it is a chain of ``reshape``,
``slice``, ``permute``, ``flip`` and ``expand`` (and a ``constant_pad_nd``
when the box overhangs the buffer), run by the shared
:func:`~egraft.ir.strided_box.run_box_plan` on FX values: in eager mode all
but ``flip`` and the pad are views of the source, and Inductor turns them
into index arithmetic.  A view whose dims overlap (a sliding window) is split
along its shortest offending dim into a ``stack`` of nesting views; past
:data:`egraft.ir.strided_box.MAX_STACK_PIECES` pieces it is one ``index_select`` of static flat
indices (the reference definition, :func:`egraft.ir.strided.gather_index`).
``as_strided`` is not used: its offset is relative to the storage, which an
intermediate value's does not promise under Inductor's graph passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch

from ...ir.shapes import contiguous_strides
from ...ir.strided_box import StackPlan, SlicePlan, plan_view, run_box_plan
from .emit import TORCH_DTYPES, Emitter, aten


@dataclass(frozen=True)
class _Val:
    """An FX value with its (static) shape, the interface ``run_box_plan`` reads."""

    node: torch.fx.Node
    shape: tuple[int, ...]


class _FxOps:
    """The movement ops of a box plan, emitted as ATen calls (``ir.strided_box.NumpyOps`` is the numpy twin)."""

    def __init__(self, ctx: Emitter, dt: str):
        self.ctx, self.dt = ctx, dt

    def _call(self, op, args, shape) -> _Val:
        return _Val(self.ctx.call(op, args, self.dt), tuple(shape))

    def reshape(self, x: _Val, shape) -> _Val:
        shape = tuple(int(n) for n in shape)
        while x.node.op == "call_function" and "egraft_reshaped" in x.node.meta:  # a reshape of a reshape is one
            x = _Val(x.node.args[0], x.node.meta["egraft_reshaped"])
        if shape == x.shape:
            return x
        out = self._call(aten.reshape.default, (x.node, list(shape)), shape)
        out.node.meta["egraft_reshaped"] = x.shape  # the source's shape
        return out

    def slice(self, x: _Val, starts, limits) -> _Val:
        for d, (a, b) in enumerate(zip(starts, limits)):
            if (a, b) != (0, x.shape[d]):
                shape = x.shape[:d] + (b - a,) + x.shape[d + 1:]
                x = self._call(aten.slice.Tensor, (x.node, d, a, b, 1), shape)
        return x

    def pad_end(self, x: _Val, n) -> _Val:
        return self._call(aten.constant_pad_nd.default, (x.node, [0, int(n)], 0), (x.shape[0] + n,))

    def transpose(self, x: _Val, perm) -> _Val:
        return self._call(aten.permute.default, (x.node, list(perm)), tuple(x.shape[p] for p in perm))

    def rev(self, x: _Val, axes) -> _Val:
        return self._call(aten.flip.default, (x.node, list(axes)), x.shape)

    def broadcast(self, x: _Val, shape, axes) -> _Val:
        full = [1] * len(shape)
        for a, n in zip(axes, x.shape):
            full[a] = n
        return self._call(aten.expand.default, (self.reshape(x, full).node, list(shape)), shape)


def _run(ctx: Emitter, flat: _Val, plan, dt: str) -> _Val:
    if isinstance(plan, SlicePlan):
        return run_box_plan(flat, plan, _FxOps(ctx, dt))
    if isinstance(plan, StackPlan):
        axis = plan.axis
        parts = [_run(ctx, flat, p, dt) for p in plan.pieces]
        shape = parts[0].shape[:axis] + (len(parts),) + parts[0].shape[axis:]
        return _Val(ctx.call(aten.stack.default, ([p.node for p in parts], axis), dt), shape)
    index = plan.index  # a GatherPlan (zero-size views return before planning)
    idx = ctx.tensor(torch.from_numpy(index.reshape(-1).copy()).to(ctx.device), "int64", "view_index")
    taken = ctx.call(aten.index_select.default, (flat.node, 0, idx), dt)
    return _Val(ctx.call(aten.reshape.default, (taken, list(index.shape)), dt), tuple(index.shape))


def emit_view(ctx: Emitter, x: torch.fx.Node, src_shape, shape, strides, offset) -> torch.fx.Node:
    """``View(x, shape, strides, offset)`` as ATen ops on the FX value `x` of shape `src_shape`."""
    dt = ctx.dt(x)
    shape, strides = tuple(int(n) for n in shape), tuple(int(s) for s in strides)
    if prod(shape) == 0:
        return ctx.call(aten.zeros.default, (list(shape),), dt, dtype=TORCH_DTYPES[dt], device=ctx.device)
    numel = prod(src_shape)
    if tuple(src_shape) == shape and int(offset) == 0 and all(
            s == c for n, s, c in zip(shape, strides, contiguous_strides(shape)) if n > 1):
        return x  # the identity view
    flat = _Val(x, tuple(src_shape))
    if len(src_shape) != 1:
        flat = _FxOps(ctx, dt).reshape(flat, (numel,))
    return _run(ctx, flat, plan_view(numel, shape, strides, int(offset)), dt).node


def reshape(ctx: Emitter, x: torch.fx.Node, x_shape, shape) -> torch.fx.Node:
    """``reshape`` of the FX value `x` (of shape `x_shape`); a reshape of a reshape is emitted as one."""
    return _FxOps(ctx, ctx.dt(x)).reshape(_Val(x, tuple(x_shape)), shape).node
