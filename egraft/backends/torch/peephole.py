"""Primitive matrix products run as ``bmm``.

The torch lowering (and so every graph before or without the e-graph) writes
``a @ b`` as ``SumReduce(Mul(View_expand(a), View_expand(b)), axis=k)``.
Lowered literally, the ``[..., M, K, N]`` product is materialised before it
is summed.  :func:`find` reads the pattern with the backend-neutral
:func:`egraft.ir.matmul_form.matmul_form` (float dtypes, ``K > 1``, at least
one factor broadcast: an un-broadcast product and sum is no matrix product)
and :func:`emit_dot` runs it as one ``bmm`` over the factors' compact views
(their broadcast axes dropped): batch axes first, then the free axes of each
factor, then the output put back in order and broadcast over the axes
neither factor covers.  Half types are multiplied and summed in float32, as
the ``MatMul`` rule does.  Knob ``peephole``.

A product of two half values widened to float32 whose sum is only ever
rounded back to that half type (``nn.Linear`` of a bfloat16 model, as
traced: ``Cast(SumReduce(Mul(Cast(a), Cast(W))))``) runs as torch's own
product of the half operands (``half`` in the plan; a ``MatMul`` idiom of
the same shape, ``Cast(MatMul(Cast(a), Cast(W)))``, is a :class:`HalfMatMul`
plan): torch multiplies and sums them in float32 and rounds once, which is
the traced value up to the order of summation, and no float32 copy of the
weight is made (torch has no product of float32 by bfloat16, so the
widened form widened the whole weight on every call).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ...ir import Op, dtypes
from ...ir.graph import Graph
from ...ir.matmul_form import Factor, matmul_form
from .emit import Emitter, aten
from .rules import matmul
from .views import emit_view, reshape


@dataclass(frozen=True)
class DotPlan:
    lhs: Factor  # read as its compact view of lhs.src (or lhs.src as is); dims = product axes lhs.axes
    rhs: Factor
    axis: int  # the contracted product axis
    mul_shape: tuple[int, ...]
    half: tuple[int, int] | None = None  # the half-type sources of both widened factors (module docstring)

    def deps(self) -> tuple[int, ...]:
        return self.half or (self.lhs.src, self.rhs.src)


def _dot_plan(graph: Graph, nid: int, users) -> DotPlan | None:
    form = matmul_form(graph, nid)
    if form is None or form.K <= 1 or not dtypes.is_float(form.dtype):
        return None
    if not (form.lhs.broadcast or form.rhs.broadcast):
        return None
    return DotPlan(form.lhs, form.rhs, form.k, form.shape, half_sources(graph, nid, form.lhs.src, form.rhs.src, users))


def half_sources(graph: Graph, nid: int, lhs: int, rhs: int, users=None) -> tuple[int, int] | None:
    """Product `nid`'s factors `lhs` and `rhs` both ``Cast`` to float32 of one half type, and every reader of its
    float32 sum a ``Cast`` back to that type: the half sources (else None; the module docstring)."""
    users = graph.consumers() if users is None else users

    def source(i):
        n = graph.nodes[i]
        return n.inputs[0] if n.op == Op.Cast and n.dtype == "float32" else None

    a, b = source(lhs), source(rhs)
    if a is None or b is None or graph.nodes[nid].dtype != "float32" or nid in graph.outputs:
        return None
    half = graph.nodes[a].dtype
    if not dtypes.is_half(half) or graph.nodes[b].dtype != half or not users[nid]:
        return None
    if any(graph.nodes[u].op != Op.Cast or graph.nodes[u].dtype != half for u in users[nid]):
        return None
    return a, b


@dataclass(frozen=True)
class HalfMatMul:
    """A ``MatMul`` idiom over the half-type sources of its two widened operands (the module docstring)."""

    sources: tuple[int, int]

    def deps(self) -> tuple[int, ...]:
        return self.sources


def find(graph: Graph) -> dict[int, DotPlan | HalfMatMul]:
    """Node id -> plan: every primitive matrix product (at its SumReduce), and every ``MatMul`` of two widened
    half values whose sum is only rounded back."""
    plans = {}
    users = graph.consumers()
    for i, n in enumerate(graph.nodes):
        p = None
        if n.op == Op.SumReduce:
            p = _dot_plan(graph, i, users)
        elif n.op == Op.MatMul:
            half = half_sources(graph, i, *n.inputs, users)
            p = HalfMatMul(half) if half is not None else None
        if p is not None:
            plans[i] = p
    return plans


def emit(ctx: Emitter, plan: DotPlan | HalfMatMul, node, a, b):
    """Plan `plan` of IR node `node` on the values of its deps `a` and `b`."""
    if isinstance(plan, HalfMatMul):
        sa, sb = ctx.in_shapes(node)  # (the sources' shapes: a Cast keeps its operand's)
        return matmul(ctx, a, b, sa, sb, ctx.dt(a))
    return emit_dot(ctx, plan, a, b)


def _operand(ctx: Emitter, f: Factor, src, order: list[int], groups: list[list[int]], sizes, half: bool = False):
    """Factor `f`'s compact value (src through its view), permuted to `order` and reshaped to `groups`; in
    float32 unless `half` (the plan's half sources, read as they are)."""
    if f.view is not None:
        src = emit_view(ctx, src, ctx.graph.nodes[f.src].shape, *f.view)
    src = src if half else ctx.f32(src)
    perm = [f.axes.index(d) for d in order]
    if perm != list(range(len(perm))):
        src = ctx.call(aten.permute.default, (src, perm), ctx.dt(src))
    return reshape(ctx, src, [sizes[d] for d in order], [prod(sizes[d] for d in g) for g in groups])


def emit_dot(ctx: Emitter, plan: DotPlan, a, b):
    """The SumReduce of a DotPlan, as permute / reshape / bmm on the factors' sources `a` and `b`."""
    r, sizes = plan.axis, plan.mul_shape
    batch = [d for d in plan.lhs.axes if d in plan.rhs.axes and d != r]
    a_free = [d for d in plan.lhs.axes if d not in plan.rhs.axes]
    b_free = [d for d in plan.rhs.axes if d not in plan.lhs.axes]
    half = plan.half is not None
    x = _operand(ctx, plan.lhs, a, batch + a_free + [r], [batch, a_free, [r]], sizes, half)
    y = _operand(ctx, plan.rhs, b, batch + [r] + b_free, [batch, [r], b_free], sizes, half)
    dt = ctx.dt(x)
    out = ctx.call(aten.bmm.default, (x, y), dt)
    got = batch + a_free + b_free
    bmn = [prod(sizes[d] for d in g) for g in (batch, a_free, b_free)]
    out = reshape(ctx, out, bmn, [sizes[d] for d in got])
    out_axes = [d for d in range(len(sizes)) if d != r]
    present = [d for d in out_axes if d in got]
    perm = [got.index(d) for d in present]
    if perm != list(range(len(perm))):
        out = ctx.call(aten.permute.default, (out, perm), dt)
    out_shape = [sizes[d] for d in out_axes]
    if len(present) != len(out_axes):  # axes neither factor covers: broadcast
        out = reshape(ctx, out, [sizes[d] for d in present], [sizes[d] if d in present else 1 for d in out_axes])
        out = ctx.call(aten.expand.default, (out, out_shape), dt)
    return out
