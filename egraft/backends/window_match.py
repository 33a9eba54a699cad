"""Sliding-window recognition: convolution and pooling in a reduction over an ``ir.Graph``.

Backend-neutral (no array library): a backend turns the plans into its own
ops (the JAX backend: ``lax.conv_general_dilated`` / ``lax.reduce_window``).
The torch lowering writes ``conv2d`` as pad -> an overlapping sliding-window
``View`` -> a matmul in primitive form ``SumReduce(Mul(expand cols, expand
w))``; pooling as pad -> window ``View`` -> ``MaxReduce`` / ``SumReduce``
over the window axes.

The recognition is *semantic*, not a match on the exact view chain the
lowering happens to write, so it also survives e-graph rewrites of the
chain.  For each operand of the reduced array we compute its **axis map**
(:func:`axis_map`): walking down the chain of ``View`` nodes, every axis of
the array is split into digits that each walk exactly one dimension of the
source with a fixed step (or are broadcast), exactly, with no carries (the
strided-view analysis, :func:`egraft.ir.strided.read_pieces`).  The two
operands' digits are then refined to common virtual axes
(:func:`egraft.ir.strided.common_axes`).  Each virtual axis has a role given
by which source dimension each operand walks and whether it is reduced; a
convolution is exactly the set of roles

* batch (input dim 0), group (input channel block, weight out-channel block),
  out-channel within the group (weight dim 0), output position i (input dim
  2+i, step = stride), all kept;
* in-channel (input dim 1 and weight dim 1, step 1) and kernel tap i (input
  dim 2+i with step = dilation, weight dim 2+i with step 1), all reduced;

each at most once, with sizes consistent with the weight's shape.  Any other
axis (or a reduced broadcast one) means "not a convolution" and the node
falls back to the ordinary path.  The op's result is then a *view* of the
windowed op's output (``out_view``), so layouts and partial outputs need no
special case.  Constant pads whose fill is the reduction's identity are
peeled into the op's padding (:mod:`.window_pads`).

Exactness: the same products and sums as the IR, only in another order.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ..ir import Op, dtypes
from ..ir.graph import Graph
from ..ir.shapes import contiguous_strides
from ..ir.strided import Piece, VAxis, common_axes, merge_pieces, read_pieces, through_view, view_axes
from ..ir.strided_box import SlicePlan, box_plan
from .window_pads import peel_pads

__all__ = ["AxisMap", "ConvPlan", "PoolPlan", "axis_map", "conv_plan", "peel_pads", "pool_plan", "reduce_chain"]

@dataclass(frozen=True)
class AxisMap:
    """How an array reads the source node ``src`` through a chain of Views (and float casts).

    ``pieces[d]`` lists axis d's digits outer -> inner as ``Piece(size, dim, step)``:
    ``dim`` is the source dimension the digit walks (``None``: broadcast).
    ``offset[j]`` is the source index in dim j where every digit is zero.
    """

    src: int
    pieces: tuple[tuple[Piece, ...], ...]
    offset: tuple[int, ...]


def axis_map(graph: Graph, nid: int) -> AxisMap | None:
    """The exact axis map of node `nid`'s value through its chain of Views, or None."""
    node = graph.nodes[nid]
    shape = tuple(node.shape)
    if node.op == Op.View:
        axes, off, cur = view_axes(shape, node.attrs["strides"]), node.attrs["offset"], node.inputs[0]
    else:
        axes, off, cur = view_axes(shape, contiguous_strides(shape)), 0, nid
    while True:
        c = graph.nodes[cur]
        if c.op == Op.Cast and _float_cast(graph, c):  # elementwise: commutes with views and zero pads
            cur = c.inputs[0]
            continue
        m = read_pieces(tuple(c.shape), axes, off)
        if m is None:
            return None
        if c.op != Op.View:
            return AxisMap(cur, tuple(merge_pieces(p) for p in m.pieces), m.base)
        axes, off = through_view(m, c.attrs["strides"], c.attrs["offset"])
        cur = c.inputs[0]


def _float_cast(graph: Graph, node) -> bool:
    return dtypes.is_float(node.dtype) and dtypes.is_float(graph.nodes[node.inputs[0]].dtype)


@dataclass(frozen=True)
class ConvPlan:
    x: int  # unpadded input node
    w: int  # weight source node
    dtype: str  # the product's dtype (sources are cast to it: casts commute with views and zero pads)
    w_view: tuple  # (shape, strides, offset): the weight as [groups, out/group, in/group, *kernel]
    strides: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    dilation: tuple[int, ...]
    groups: int
    out_view: tuple  # (shape, strides, offset) of the reduce's result as a view of the conv output
    out_shape: tuple[int, ...]

    def deps(self) -> tuple[int, ...]:
        return (self.x, self.w)


@dataclass(frozen=True)
class PoolPlan:
    x: int
    dtype: str  # the window view's dtype (the source is cast to it)
    kind: str  # "sum" | "max"
    window: tuple[int, ...]
    strides: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    dilation: tuple[int, ...]
    out_view: tuple
    out_shape: tuple[int, ...]

    def deps(self) -> tuple[int, ...]:
        return (self.x,)


def reduce_chain(graph: Graph, nid: int):
    """A chain of same-kind reductions ending at `nid`: (base node, reduced axes in base coordinates)."""
    op = graph.nodes[nid].op
    chain = []
    cur = nid
    while graph.nodes[cur].op == op:
        chain.append(graph.nodes[cur].attrs["axis"])
        cur = graph.nodes[cur].inputs[0]
    rank = len(graph.nodes[cur].shape)
    reduced: list[int] = []
    for ax in reversed(chain):
        remaining = [d for d in range(rank) if d not in reduced]
        reduced.append(remaining[ax])
    return cur, frozenset(reduced)


def _out_view(vaxes, reduced, base_shape, role_stride, offset):
    """The reduce's result as a view of the op output: kept virtual axes with their output strides."""
    shape, strides = [], []
    for v in vaxes:
        if v.owner in reduced:
            continue
        shape.append(v.size)
        strides.append(role_stride(v))
    out_shape = tuple(n for d, n in enumerate(base_shape) if d not in reduced)
    if not shape:
        shape, strides = [1], [0]
    return (tuple(shape), tuple(strides), int(offset)), out_shape


def _conv_roles(vaxes, reduced):
    """Role of each virtual axis (by the input side's source dim; the weight side only needs coverage)."""
    roles: dict = {}
    for v in vaxes:
        red = v.owner in reduced
        a, b = v.a, v.b
        if a is not None and a[1] <= 0:  # the input is read forwards only (a flipped input: not a conv)
            return None
        if red:
            if a is None or b is None:
                return None
            if a == (1, 1):
                key = ("ichan",)
            elif a[0] >= 2:
                key = ("kern", a[0] - 2)
            else:
                return None
        elif a is None and b is None:
            continue  # broadcast output axis
        elif b is None:
            if a[0] == 0:
                key = ("batch",)
            elif a[0] >= 2:
                key = ("space", a[0] - 2)
            else:
                return None
        elif a is None:
            key = ("ochan",)
        elif a[0] == 1:
            key = ("group",)
        else:
            return None
        if key in roles:
            return None
        roles[key] = v
    return roles


def _conv_plan_for(graph: Graph, mul_id: int, reduced, ia: int, ib: int) -> ConvPlan | None:
    mul = graph.nodes[mul_id]
    ma, mb = axis_map(graph, mul.inputs[ia]), axis_map(graph, mul.inputs[ib])
    if ma is None or mb is None:
        return None
    xshape, wshape = tuple(graph.nodes[ma.src].shape), tuple(graph.nodes[mb.src].shape)
    nd = len(xshape) - 2
    if nd < 1:
        return None
    vaxes = common_axes(tuple(mul.shape), (ma.pieces, mb.pieces))
    if vaxes is None:
        return None
    roles = _conv_roles(vaxes, reduced)
    if roles is None or not any(k[0] in ("ichan", "kern") for k in roles):
        return None
    # with kernel taps, some window must slide along an output axis: taps over whole axes with nothing
    # sliding are a matmul (batch-1 attention scores, a linear on one position): dot_general does better
    kern = [k[1] for k in roles if k[0] == "kern"]
    if kern and not any(("space", i) in roles for i in kern):
        return None

    def size(*key):
        return roles[key].size if key in roles else 1

    g, og, cg = size("group"), size("ochan"), size("ichan")
    kernel = tuple(size("kern", i) for i in range(nd))
    n_, c_ = xshape[:2]
    if c_ != g * cg or ma.offset[1] != 0:
        return None
    if g > 1 and roles[("group",)].a[1] != cg:
        return None
    strides, dilation = [], []
    for i in range(nd):
        k, sp = roles.get(("kern", i)), roles.get(("space", i))
        strides.append(sp.a[1] if sp else 1)
        dilation.append(k.a[1] if k else 1)
        if ma.offset[2 + i] % strides[i]:
            return None
    # the weight as [O, Cg, *K]: a view of the weight source through the weight side's digits
    wcs = contiguous_strides(wshape)

    def wstride(*key):
        return roles[key].b[1] * wcs[roles[key].b[0]] if key in roles else 0

    w_view = ((g, og, cg) + kernel,
              (wstride("group"), wstride("ochan"), wstride("ichan")) + tuple(wstride("kern", i) for i in range(nd)),
              sum(o * c for o, c in zip(mb.offset, wcs)))
    # the pads the input side reads through, folded into the convolution
    x, pads = peel_pads(graph, ma.src, "sum")
    if any(ax < 2 for ax in pads):
        x, pads = ma.src, {}
    padding = tuple(tuple(pads.get(2 + i, (0, 0))) for i in range(nd))
    out_sp = [(xshape[2 + i] - dilation[i] * (kernel[i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
    if any(n <= 0 for n in out_sp):
        return None
    ocs = contiguous_strides((n_, g * og, *out_sp))

    def role_stride(v):
        if v.a is None and v.b is None:
            return 0
        if v.b is None and v.a[0] == 0:
            return v.a[1] * ocs[0]
        if v.b is None:
            return ocs[v.a[0]]
        if v.a is None:
            return ocs[1]
        return og * ocs[1]  # group

    offset = ma.offset[0] * ocs[0] + sum(ma.offset[2 + i] // strides[i] * ocs[2 + i] for i in range(nd))
    out_view, out_shape = _out_view(vaxes, reduced, tuple(mul.shape), role_stride, offset)
    return ConvPlan(x, mb.src, mul.dtype, w_view, tuple(strides), padding, tuple(dilation), g, out_view, out_shape)


def conv_plan(graph: Graph, nid: int) -> ConvPlan | None:
    """SumReduce(s) over (in-channel, kernel taps) of Mul(window view of x, view of w) -> ConvPlan."""
    base, reduced = reduce_chain(graph, nid)
    mul = graph.nodes[base]
    if mul.op != Op.Mul or not dtypes.is_float(mul.dtype):
        return None
    return _conv_plan_for(graph, base, reduced, 0, 1) or _conv_plan_for(graph, base, reduced, 1, 0)


def _view_is_cheap(graph: Graph, nid: int) -> bool:
    """Whether a View nests, i.e. realises as movement ops alone (:mod:`egraft.ir.strided_box`)."""
    n = graph.nodes[nid]
    if prod(n.attrs["shape"]) == 0:
        return False
    plan = box_plan(prod(graph.nodes[n.inputs[0]].shape), n.attrs["shape"], n.attrs["strides"], n.attrs["offset"])
    return isinstance(plan, SlicePlan)


def pool_plan(graph: Graph, nid: int) -> PoolPlan | None:
    """Max/SumReduce(s) over the window axes of a sliding-window view -> PoolPlan."""
    node = graph.nodes[nid]
    kind = "sum" if node.op == Op.SumReduce else "max"
    if node.dtype == "bool":
        return None
    base, reduced = reduce_chain(graph, nid)
    bnode = graph.nodes[base]
    if bnode.op != Op.View:
        return None
    m = axis_map(graph, base)
    if m is None:
        return None
    vaxes = common_axes(tuple(bnode.shape), (m.pieces,))
    if vaxes is None:
        return None
    xshape = tuple(graph.nodes[m.src].shape)
    rank = len(xshape)
    win: dict[int, VAxis] = {}
    keep: dict[int, VAxis] = {}
    for v in vaxes:
        red = v.owner in reduced
        if v.a is None:
            if red:
                return None
            continue
        if v.a[1] <= 0:
            return None
        table = win if red else keep
        if v.a[0] in table:
            return None
        table[v.a[0]] = v
    # Non-overlapping windows (kernel == stride pools, reshaped reductions such as a per-head norm) are
    # usually nesting views, i.e. free reshapes/slices before an ordinary reduction: keep those as they are.
    overlap = any(j in keep and keep[j].a[1] < (win[j].size - 1) * win[j].a[1] + 1 for j in win)
    if not overlap and _view_is_cheap(graph, base):
        return None
    window = tuple(win[j].size if j in win else 1 for j in range(rank))
    dilation = tuple(win[j].a[1] if j in win else 1 for j in range(rank))
    strides = tuple(keep[j].a[1] if j in keep and j in win else 1 for j in range(rank))
    if any(m.offset[j] % strides[j] for j in range(rank)):
        return None
    x, pads = peel_pads(graph, m.src, kind)
    padding = tuple(tuple(pads.get(j, (0, 0))) for j in range(rank))
    out = tuple((xshape[j] - dilation[j] * (window[j] - 1) - 1) // strides[j] + 1 for j in range(rank))
    ocs = contiguous_strides(out)

    def role_stride(v):
        if v.a is None:
            return 0
        j, step = v.a
        return ocs[j] * (step // strides[j])

    offset = sum(m.offset[j] // strides[j] * ocs[j] for j in range(rank))
    out_view, out_shape = _out_view(vaxes, reduced, tuple(bnode.shape), role_stride, offset)
    return PoolPlan(x, bnode.dtype, kind, window, strides, padding, dilation, out_view, out_shape)
