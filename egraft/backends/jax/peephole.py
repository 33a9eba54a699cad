"""Peepholes: primitive patterns the JAX lowering runs as one library op.

A primitive-only graph (straight from the torch lowering, before or without
the e-graph) writes a matrix product as ``SumReduce(Mul(expand a, expand b))``.
Lowered literally, XLA materialises the ``[..., M, K, N]`` product before
reducing it: orders of magnitude slower than a dot.  So the lowering itself
recognises the pattern and emits ``lax.dot_general``:

* ``matmul``: ``SumReduce(axis=r)(Mul(x, y))`` as the IR's
  :func:`~egraft.ir.matmul_form.matmul_form` recognises it, where axis ``r``
  has size > 1 and at least one operand is broadcast (stride 0) along some
  axis (an un-broadcast product and sum fuse well as they are).  Each
  operand is replaced by its *compact* view (the broadcast axes dropped);
  axes both cover are batch dims, ``r`` is contracted, and axes neither
  covers are broadcast back afterwards.
* ``take``: ``Gather(x, View(i))`` whose index is broadcast (stride 0) along
  every axis but the gather axis is ``index_select``: ``jnp.take`` of the
  1-D index along that axis instead of a full ``take_along_axis``.
* ``put``: ``Scatter(x, idx, u)`` whose index is constant along all axes but
  a few (broadcast views, through elementwise ops such as ``index_copy_``'s
  negative-index wrap: the KV-cache write, one slot per row and token) is one
  scatter of whole windows, an index per point of the varying axes
  (``x.at[..., pos, ...].set(u)`` when only the op's axis varies) instead of
  a full grid of one index per element.
* ``slices``: such an index_select whose index is a *folded* integer value
  (``__folded_k``, computed once from constants and iotas: how pad, cat and
  rotate-half are written in the IR) has known values; if they form a few
  runs of consecutive positions it is a concatenation of static slices,
  which XLA fuses, instead of a gather.

* ``conv`` / ``pool`` (module :mod:`.windows`): a reduction over the
  window axes of a sliding-window view (with its constant pads) is
  ``lax.conv_general_dilated`` / ``lax.reduce_window``; knob ``windows``.

All are exact rewrites (the same sums in float32 or wider), selected by the
knob ``peephole``.  The plans are pure graph analysis; :mod:`.program`
emits them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...ir import Op, dtypes
from ...ir.graph import Graph
from ...ir.matmul_form import Factor, invariant_axes, matmul_form
from ...runtime.jax_runner import STATE_BITS
from ..fold import FOLDED_PREFIX
from . import windows


@dataclass(frozen=True)
class DotPlan:
    lhs: Factor  # read as its compact view: lhs.view of lhs.src (or lhs.src as is), dims = Mul-output axes lhs.axes
    rhs: Factor
    axis: int  # the contracted axis of the Mul output
    mul_shape: tuple[int, ...]

    def deps(self) -> tuple[int, ...]:
        return (self.lhs.src, self.rhs.src)


@dataclass(frozen=True)
class TakePlan:
    src: int
    index: int  # node id of the index's source
    index_view: tuple  # 1-D view (shape, strides, offset) of the index source
    axis: int

    def deps(self) -> tuple[int, ...]:
        return (self.src, self.index)


def _dot_plan(graph: Graph, nid: int) -> DotPlan | None:
    form = matmul_form(graph, nid)
    if form is None or form.K <= 1:
        return None
    if not (form.lhs.broadcast or form.rhs.broadcast):  # nothing broadcast: mul+reduce fuses fine
        return None
    return DotPlan(form.lhs, form.rhs, form.k, form.shape)


def _positions(graph: Graph, nid: int) -> tuple[int, tuple] | None:
    """(source, 1-D view) of the index of Gather/Scatter `nid` when it is a View broadcast (stride 0)
    along every axis but the op's: one position vector along that axis."""
    n = graph.nodes[nid]
    ax = n.attrs["axis"]
    idx = graph.nodes[n.inputs[1]]
    if idx.op != Op.View:
        return None
    shape, strides, off = idx.attrs["shape"], idx.attrs["strides"], idx.attrs["offset"]
    if any(st != 0 and sz > 1 for d, (sz, st) in enumerate(zip(shape, strides)) if d != ax):
        return None
    return idx.inputs[0], ((shape[ax],), (strides[ax],), off)


def _take_plan(graph: Graph, nid: int) -> TakePlan | None:
    found = _positions(graph, nid)
    if found is None:
        return None
    n = graph.nodes[nid]
    return TakePlan(n.inputs[0], found[0], found[1], n.attrs["axis"])


@dataclass(frozen=True)
class PutPlan:
    """``Scatter(x, idx, upd)`` whose index is constant along every axis but a few (``invariant_axes``), as a
    KV-cache write's is (one slot per row and token, the same for every head and feature): one index per
    point of the varying `axes` (the op's axis among them), each writing the whole window of the other axes,
    instead of a full index grid (one index per element)."""

    src: int
    index: int
    upd: int
    axis: int
    axes: tuple[int, ...]  # the axes the index varies along, ascending
    dtype: str  # the IR dtype of the value written

    def deps(self) -> tuple[int, ...]:
        return (self.src, self.index, self.upd)


def _put_plan(graph: Graph, nid: int) -> PutPlan | None:
    n = graph.nodes[nid]
    ax, rank = n.attrs["axis"], len(n.shape)
    still = invariant_axes(graph, n.inputs[1])
    axes = tuple(d for d in range(rank) if d == ax or d not in still)
    if len(axes) == rank:  # the index varies along every axis: the full grid it is
        return None
    return PutPlan(n.inputs[0], n.inputs[1], n.inputs[2], ax, axes, n.dtype)


@dataclass(frozen=True)
class SlicesPlan:
    src: int
    axis: int
    # pieces concatenated along axis: (start, length, step); step 1 is the slice
    # start:start+length, step 0 repeats position start `length` times (a clamp)
    pieces: tuple[tuple[int, int, int], ...]

    def deps(self) -> tuple[int, ...]:
        return (self.src,)


MAX_PIECES = 16  # more pieces than this: keep the gather


def index_pieces(values) -> tuple[tuple[int, int, int], ...]:
    """Split index values into runs that ascend by one or repeat one position."""
    pieces: list[list[int]] = []  # [start, length, step, last]
    for v in (int(x) for x in values):
        if pieces:
            p = pieces[-1]
            step = v - p[3]
            if step in (0, 1) and (p[1] == 1 or step == p[2]):  # a piece's 2nd element fixes its step
                p[1], p[2], p[3] = p[1] + 1, step, v
                continue
        pieces.append([v, 1, 1, v])
    return tuple((a, n, st) for a, n, st, _ in pieces)


def _slices_plan(graph: Graph, take: TakePlan) -> SlicesPlan | None:
    from .views import gather_index

    node = graph.nodes[take.index]
    if node.op != Op.Input or not node.attrs["name"].startswith(FOLDED_PREFIX) or node.attrs["name"] not in graph.weights:
        return None
    flat = np.asarray(graph.weights[node.attrs["name"]]).reshape(-1)
    values = flat[gather_index(*take.index_view)]
    n = graph.nodes[take.src].shape[take.axis]
    if values.size == 0 or values.min() < 0 or values.max() >= n:
        return None
    pieces = index_pieces(values)
    if len(pieces) > MAX_PIECES:
        return None
    return SlicesPlan(take.src, take.axis, pieces)


def _gather_plan(graph: Graph, nid: int):
    take = _take_plan(graph, nid)
    if take is None:
        return None
    return _slices_plan(graph, take) or take


# per op, the patterns tried in order (the first plan found wins); window patterns
# (convolution, pooling: see .windows) only under the knob ``windows``
PATTERNS = {
    "SumReduce": (windows.conv_plan, windows.pool_plan, _dot_plan),
    "MaxReduce": (windows.pool_plan,),
    "Gather": (_gather_plan,),
    "Scatter": (_put_plan,),
}
WINDOW_PATTERNS = (windows.conv_plan, windows.pool_plan)


def find(graph: Graph, use_windows: bool = True) -> dict:
    """Node id -> plan for every node a peephole applies to."""
    plans = {}
    for i, n in enumerate(graph.nodes):
        for fn in PATTERNS.get(n.op, ()):
            if not use_windows and fn in WINDOW_PATTERNS:
                continue
            p = fn(graph, i)
            if p is not None:
                plans[i] = p
                break
    return plans


def emit_dot(ctx, plan: DotPlan, a, b, view_fn):
    """dot_general for a DotPlan; `a`/`b` are the operands' sources, `view_fn` realises a view."""
    import jax.numpy as jnp
    from jax import lax

    from .rules import compute_f32

    if plan.lhs.view is not None:
        a = view_fn(a, *plan.lhs.view)
    if plan.rhs.view is not None:
        b = view_fn(b, *plan.rhs.view)
    r = plan.axis
    batch = [d for d in plan.lhs.axes if d in plan.rhs.axes and d != r]
    a_free = [d for d in plan.lhs.axes if d not in plan.rhs.axes]
    b_free = [d for d in plan.rhs.axes if d not in plan.lhs.axes]
    dims = (
        ((plan.lhs.axes.index(r),), (plan.rhs.axes.index(r),)),
        (tuple(plan.lhs.axes.index(d) for d in batch), tuple(plan.rhs.axes.index(d) for d in batch)),
    )
    half = dtypes.is_half(a.dtype.name)
    kw = {"preferred_element_type": dtypes.compute_dtype(a.dtype.name)} if half else {}
    if jnp.issubdtype(a.dtype, jnp.floating):
        kw["precision"] = ctx.precision
    y = lax.dot_general(a, b, dims, **kw)
    y = place_output(y, batch + a_free + b_free, plan)  # y axes: batch, a_free, b_free (as Mul-output axes)
    ctx.stats["peephole_dots"] += 1
    return compute_f32(y) if half else y


def place_output(y, got: list[int], plan: DotPlan):
    """A product `y` whose axes are the Mul-output axes `got`, as the SumReduce's output: in its axis order,
    the contracted axis dropped, broadcast along the axes neither factor covers."""
    import jax.numpy as jnp
    from jax import lax

    out_axes = [d for d in range(len(plan.mul_shape)) if d != plan.axis]
    present = [d for d in out_axes if d in got]
    perm = [got.index(d) for d in present]
    if perm != list(range(len(perm))):
        y = jnp.transpose(y, perm)
    out_shape = tuple(plan.mul_shape[d] for d in out_axes)
    if tuple(y.shape) != out_shape:
        y = lax.broadcast_in_dim(y, out_shape, tuple(out_axes.index(d) for d in present))
    return y


def emit_take(ctx, plan: TakePlan, x, idx_src, view_fn):
    import jax.numpy as jnp

    idx = view_fn(idx_src, *plan.index_view)
    ctx.stats["peephole_takes"] += 1
    return jnp.take(x, idx, axis=plan.axis, mode="clip")


def emit_slices(ctx, plan: SlicesPlan, x):
    import jax.numpy as jnp
    from jax import lax

    out = []
    for start, length, step in plan.pieces:
        if step == 1:
            out.append(lax.slice_in_dim(x, start, start + length, axis=plan.axis))
        else:
            one = lax.slice_in_dim(x, start, start + 1, axis=plan.axis)
            shape = list(one.shape)
            shape[plan.axis] = length
            out.append(jnp.broadcast_to(one, tuple(shape)))
    ctx.stats["peephole_slices"] += 1
    return out[0] if len(out) == 1 else jnp.concatenate(out, axis=plan.axis)


def emit_put(ctx, plan: PutPlan, x, idx, upd, view_fn):
    """A PutPlan as a new array (the functional Scatter): `x` with `upd` at the positions along the axis.

    The positions are the index at the first element of every constant axis
    (XLA fuses that slice into the index's elementwise ops).  One varying
    axis: ``x.at[..., pos, ...].set(upd)``.  Several: one ``lax.scatter``
    whose index points are the varying axes' (an iota on each but the op's
    axis, the positions on it) and whose windows are the other axes, whole
    (a Scatter's update covers every other axis of `x`).  An index outside
    the axis drops its window, as the full grid's ``mode="drop"`` drops its
    elements.  A half-type `x` may come as its bits (``int16``: a cache the
    program holds so, ``function.program_dtype``); the update is then written
    as bits too, the same values.
    """
    import jax.numpy as jnp
    from jax import lax

    axes = plan.axes
    pos = idx[tuple(slice(None) if d in axes else 0 for d in range(idx.ndim))]
    ctx.stats["peephole_puts"] += 1
    if x.dtype == STATE_BITS and dtypes.is_half(plan.dtype):  # a cache held as its bits
        upd = lax.bitcast_convert_type(upd.astype(ctx.jdt(plan.dtype)), STATE_BITS)
    upd = upd.astype(x.dtype)
    if axes == (plan.axis,):
        at = (slice(None),) * plan.axis + (pos,)
        return x.at[at].set(upd, mode="drop", unique_indices=True)
    points = jnp.stack([pos if d == plan.axis else lax.broadcasted_iota(pos.dtype, pos.shape, k)
                        for k, d in enumerate(axes)], axis=-1)
    dims = lax.ScatterDimensionNumbers(update_window_dims=tuple(d for d in range(x.ndim) if d not in axes),
                                       inserted_window_dims=axes, scatter_dims_to_operand_dims=axes)
    return lax.scatter(x, points, upd, dims, unique_indices=True, mode=lax.GatherScatterMode.FILL_OR_DROP)
