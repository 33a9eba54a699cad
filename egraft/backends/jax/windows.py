"""Sliding-window peepholes: convolution and pooling as one XLA op.

The torch lowering writes ``conv2d`` as pad (Iota + Gather + Where, folded
at build into constant index/mask weights) -> an overlapping sliding-window
``View`` -> a matmul in primitive form ``SumReduce(Mul(expand cols, expand
w))``; pooling as pad -> window ``View`` -> ``MaxReduce`` / ``SumReduce``
over the window axes.  Lowered literally, the window view becomes a stack
of slices (im2col) feeding a dot; XLA's own ``conv_general_dilated`` /
``reduce_window`` are faster and never materialise the columns.

The recognition is *semantic*, not a match on the exact view chain the
lowering happens to write, so it also survives e-graph rewrites of the
chain.  For each operand of the reduced array we compute its **axis map**:
walking down the chain of ``View`` nodes, every axis of the array is split
into *pieces* (mixed-radix digits), each of which walks exactly one
dimension of the source with a fixed step (or is broadcast).  A split is
only accepted when no piece can carry into the next coarser dimension
(checked with the offset: ``offset digit + sum of (size-1)*step < dim``),
so the map is exact, not a guess.  The two operands' splits are then
refined to common digits ("virtual axes").  Each virtual axis has a role
given by which source dimension each operand walks and whether it is
reduced; a convolution is exactly the set of roles

* batch (input dim 0), group (input channel block, weight out-channel block),
  out-channel within the group (weight dim 0), output position i (input dim
  2+i, step = stride), all kept;
* in-channel (input dim 1 and weight dim 1, step 1) and kernel tap i (input
  dim 2+i with step = dilation, weight dim 2+i with step 1), all reduced;

each at most once, with sizes consistent with the weight's shape.  Any other
axis (or a reduced broadcast one) means "not a convolution" and the node
falls back to the ordinary path.  The op's result is then a *view* of the
XLA op's output (realised with :func:`.rules.realise_view`: free
transposes/reshapes), so layouts and partial outputs need no special case.

Pads: a chain ``Where(mask, Gather(x, idx, axis), fill)`` whose mask and
index are known at build (folded weights or constants) and equal those of a
constant pad (mask ``[F]*lo + [T]*n + [F]*hi``, index ``arange(n)`` where the
mask holds) is peeled into the op's padding when the fill is the
reduction's identity (0 for a sum / convolution, the lowest value for a
max), which is exactly how XLA pads.

Exactness: the same products and sums as the IR (float32 accumulation for
half types, as the reference), only in another order.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from ...ir import dtypes
from ...ir.graph import Graph
from ...ir.ops import TensorValue
from ...ir.shapes import contiguous_strides
from ..fold import FOLDED_PREFIX

REDUCE_OPS = ("SumReduce", "MaxReduce")


# --- axis maps --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AxisMap:
    """How an array of shape ``shape`` reads the source node ``src``.

    ``pieces[d]`` lists axis d's digits outer -> inner as ``(size, dim, step)``:
    ``dim`` is the source dimension the digit walks (``None``: broadcast).
    ``offset[j]`` is the source index in dim j where every digit is zero.
    """

    src: int
    pieces: tuple[tuple[tuple[int, int | None, int], ...], ...]
    offset: tuple[int, ...]


def _split(size: int, stride: int, shape, cs):
    """Split an axis of `size` moving `stride` through a contiguous array into per-dimension digits."""
    out = []  # inner first
    while size > 1:
        j = next((j for j in range(len(shape)) if shape[j] > 1 and cs[j] <= stride < cs[j] * shape[j]), None)
        if j is None or stride % cs[j]:
            return None
        step = stride // cs[j]
        run = -(-shape[j] // step)  # digits that fit inside dim j
        if size <= run:
            out.append((size, j, step))
            break
        if shape[j] % step or size % run:
            return None
        out.append((run, j, step))
        size //= run
        stride *= run
    return out[::-1]


def _digits(offset: int, shape) -> list[int] | None:
    n = prod(shape)
    if not 0 <= offset < max(n, 1):
        return None
    return [int(v) for v in np.unravel_index(offset, shape)] if shape else []


def _decompose(axes, offset, shape):
    """Pieces ``[size, stride]`` of flat positions into an array of `shape` -> ``(size, dim, step)``, digits."""
    cs = contiguous_strides(shape)
    digits = _digits(offset, shape)
    if digits is None:
        return None
    out = []
    hi, lo = list(digits), list(digits)
    for pieces in axes:
        mine = []
        for size, stride in pieces:
            if stride is None or size == 1:
                mine.append((size, None, 0))
                continue
            parts = _split(size, abs(stride), shape, cs)
            if parts is None:
                return None
            if stride < 0:  # walks backwards from the offset: the same digits, negated
                parts = [(sz, j, -st) for sz, j, st in parts]
            for sz, j, st in parts:
                if st > 0:
                    hi[j] += (sz - 1) * st
                else:
                    lo[j] += (sz - 1) * st
            mine.extend(parts)
        out.append(mine)
    # every digit stays inside its dimension, so no position can carry: the map is exact
    if any(h >= n for h, n in zip(hi, shape)) or any(v < 0 for v in lo):
        return None
    return out, digits


def axis_map(graph: Graph, nid: int) -> AxisMap | None:
    """The exact axis map of node `nid`'s value through its chain of Views, or None."""
    node = graph.nodes[nid]
    shape = tuple(node.shape)
    if node.op == "View":
        st, off = node.attrs["strides"], node.attrs["offset"]
        axes = [[(n, (s if s != 0 else None))] if n > 1 else [] for n, s in zip(shape, st)]
        cur = node.inputs[0]
    else:
        cs = contiguous_strides(shape)
        axes = [[(n, s)] if n > 1 else [] for n, s in zip(shape, cs)]
        off, cur = 0, nid
    while True:
        c = graph.nodes[cur]
        if c.op == "Cast" and _float_cast(graph, c):  # elementwise: commutes with views and zero pads
            cur = c.inputs[0]
            continue
        got = _decompose(axes, off, tuple(c.shape))
        if got is None:
            return None
        pieces, digits = got
        if c.op != "View":
            return AxisMap(cur, tuple(tuple(_merge(p)) for p in pieces), tuple(digits))
        t = c.attrs["strides"]
        off = c.attrs["offset"] + sum(d * s for d, s in zip(digits, t))
        axes = [[(sz, (st * t[j] if j is not None and t[j] != 0 else None)) for sz, j, st in p] for p in pieces]
        cur = c.inputs[0]


def _float_cast(graph: Graph, node) -> bool:
    return dtypes.is_float(node.dtype) and dtypes.is_float(graph.nodes[node.inputs[0]].dtype)


def _merge(pieces):
    """Canonical digits: adjacent broadcast digits, or digits continuing each other in one dim, merge."""
    out: list[tuple] = []
    for size, dim, step in pieces:  # outer -> inner
        if out:
            ps, pd, pst = out[-1]
            if pd is None and dim is None:
                out[-1] = (ps * size, None, 0)
                continue
            if pd is not None and pd == dim and pst == step * size:
                out[-1] = (ps * size, dim, step)
                continue
        out.append((size, dim, step))
    return out


def _cuts(pieces) -> list[int]:
    """Cumulative digit sizes from the inner end (the positions where an axis splits)."""
    out, p = [], 1
    for size, _, _ in reversed(pieces[1:]):
        p *= size
        out.append(p)
    return out


def _refine(pieces, bounds):
    """Re-express digits on the finer boundaries `bounds` (inner-cumulative sizes, ascending, last = total)."""
    spans = []  # (lo, hi, dim, step): the digit covers cumulative range [lo, hi)
    p = 1
    for size, dim, step in reversed(pieces):
        spans.append((p, p * size, dim, step))
        p *= size
    out = []
    lo = 1
    for hi in bounds:
        span = next(s for s in spans if s[0] <= lo and hi <= s[1])
        out.append((hi // lo, span[2], span[3] * (lo // span[0]) if span[2] is not None else 0))
        lo = hi
    return out[::-1]


@dataclass(frozen=True)
class VAxis:
    owner: int  # axis of the reduced array
    size: int
    a: tuple[int, int] | None  # (source dim, step) in operand a, None: broadcast
    b: tuple[int, int] | None


def common_axes(shape, maps) -> list[VAxis] | None:
    """The operands' digits refined to common virtual axes (outer -> inner within each owner axis)."""
    out = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        plist = [m.pieces[d] for m in maps]
        cuts = sorted(set(c for p in plist for c in _cuts(p)) | {n})
        if any(b % a for a, b in zip([1] + cuts, cuts)):
            return None
        ref = [_refine(p, cuts) for p in plist]
        for k in range(len(cuts)):
            roles = [(r[k][1], r[k][2]) if r[k][1] is not None else None for r in ref]
            out.append(VAxis(d, ref[0][k][0], roles[0], roles[1] if len(roles) > 1 else None))
    return out


# --- pads -------------------------------------------------------------------------------------------

def _known(graph: Graph, nid: int):
    """Values known at build: a folded weight or a constant."""
    n = graph.nodes[nid]
    if n.op == "Input" and n.attrs["name"].startswith(FOLDED_PREFIX) and n.attrs["name"] in graph.weights:
        return np.asarray(graph.weights[n.attrs["name"]])
    if n.op == "Constant":
        v = n.attrs["value"]
        return np.broadcast_to(v.array if isinstance(v, TensorValue) else np.asarray(v), n.shape)
    return None


def _along(graph: Graph, nid: int, axis: int):
    """A known-valued node broadcast along every axis but `axis`: its 1-D values along `axis`."""
    n = graph.nodes[nid]
    if n.op == "View":
        shape, st, off = n.attrs["shape"], n.attrs["strides"], n.attrs["offset"]
        if any(s != 0 and sz > 1 for d, (sz, s) in enumerate(zip(shape, st)) if d != axis):
            return None
        vals = _known(graph, n.inputs[0])
        if vals is None:
            return None
        return vals.reshape(-1)[off + np.arange(shape[axis]) * st[axis]]
    vals = _known(graph, nid)
    if vals is None:
        return None
    sl = tuple(slice(None) if d == axis else 0 for d in range(vals.ndim))
    line = vals[sl]
    return line if np.all(np.moveaxis(vals, axis, -1) == line) else None


def _fill(graph: Graph, nid: int):
    """The scalar a node holds everywhere, if known, else None."""
    n = graph.nodes[nid]
    if n.op == "View" and all(s == 0 for s in n.attrs["strides"]):
        vals = _known(graph, n.inputs[0])
    else:
        vals = _known(graph, nid)
    if vals is None or vals.size == 0:
        return None
    flat = np.asarray(vals).reshape(-1)
    return flat[0] if np.all(flat == flat[0]) else None


def _is_identity(v, kind: str, dt: str) -> bool:
    if kind == "sum":
        return v == 0 and not np.signbit(v)
    if dtypes.is_float(dt):
        return bool(np.isneginf(v))
    return int(v) == int(np.iinfo(dtypes.to_numpy(dt)).min)


def peel_pads(graph: Graph, nid: int, kind: str):
    """Strip constant pads whose fill is the reduction's identity: (unpadded node, {axis: [lo, hi]})."""
    pads: dict[int, list[int]] = {}
    while True:
        n = graph.nodes[nid]
        if n.op != "Where":
            break
        cond, g, fill = n.inputs
        gn = graph.nodes[g]
        if gn.op != "Gather" or tuple(gn.shape) != tuple(n.shape):
            break
        v = _fill(graph, fill)
        if v is None or not _is_identity(v, kind, n.dtype):
            break
        ax = gn.attrs["axis"]
        mask, idx = _along(graph, cond, ax), _along(graph, gn.inputs[1], ax)
        if mask is None or idx is None or mask.dtype != np.bool_:
            break
        src = gn.inputs[0]
        sshape = graph.nodes[src].shape
        if any(a != b for d, (a, b) in enumerate(zip(sshape, n.shape)) if d != ax):
            break
        total, length = n.shape[ax], sshape[ax]
        lo = int(np.argmax(mask)) if mask.any() else total
        hi = total - lo - length
        if hi < 0 or not mask[lo:lo + length].all() or mask[:lo].any() or mask[lo + length:].any():
            break
        if not np.array_equal(idx[lo:lo + length], np.arange(length)):
            break
        p = pads.setdefault(ax, [0, 0])
        p[0] += lo
        p[1] += hi
        nid = src
    return nid, pads


# --- plans --------------------------------------------------------------------------------------------

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
    vaxes = common_axes(tuple(mul.shape), (ma, mb))
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
    if mul.op != "Mul" or not dtypes.is_float(mul.dtype):
        return None
    return _conv_plan_for(graph, base, reduced, 0, 1) or _conv_plan_for(graph, base, reduced, 1, 0)


def _view_is_cheap(graph: Graph, nid: int) -> bool:
    """Whether a View realises as movement ops alone (see .views), not a stack of slices or a gather."""
    from .views import SlicePlan, plan_view

    n = graph.nodes[nid]
    plan = plan_view(prod(graph.nodes[n.inputs[0]].shape), n.attrs["shape"], n.attrs["strides"], n.attrs["offset"])
    return isinstance(plan, SlicePlan)


def pool_plan(graph: Graph, nid: int) -> PoolPlan | None:
    """Max/SumReduce(s) over the window axes of a sliding-window view -> PoolPlan."""
    node = graph.nodes[nid]
    kind = "sum" if node.op == "SumReduce" else "max"
    if node.dtype == "bool":
        return None
    base, reduced = reduce_chain(graph, nid)
    bnode = graph.nodes[base]
    if bnode.op != "View":
        return None
    m = axis_map(graph, base)
    if m is None:
        return None
    vaxes = common_axes(tuple(bnode.shape), (m,))
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


# --- emission ------------------------------------------------------------------------------------------

def emit_conv(ctx, plan: ConvPlan, x, w, view_fn):
    from jax import lax

    from .rules import compute_f32

    dt = ctx.jdt(plan.dtype)
    shape, strides, offset = plan.w_view
    w = view_fn(w, shape, strides, offset)
    w = w.reshape((shape[0] * shape[1],) + tuple(shape[2:]))
    x, w = compute_f32(x.astype(dt)), compute_f32(w.astype(dt))
    r = x.ndim
    dn = lax.ConvDimensionNumbers(tuple(range(r)), tuple(range(r)), tuple(range(r)))
    y = lax.conv_general_dilated(
        x, w, window_strides=plan.strides, padding=plan.padding, rhs_dilation=plan.dilation,
        dimension_numbers=dn, feature_group_count=plan.groups, precision=ctx.precision)
    ctx.stats["peephole_convs"] += 1
    return _finish(y, plan, view_fn)


def emit_pool(ctx, plan: PoolPlan, x, view_fn):
    import jax.numpy as jnp
    from jax import lax

    from .rules import compute_f32

    x = x.astype(ctx.jdt(plan.dtype))
    if plan.kind == "sum":
        x = compute_f32(x)
        init, op = np.array(0, x.dtype), lax.add
    else:
        init = np.array(-np.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min, x.dtype)
        op = lax.max
    y = lax.reduce_window(x, init, op, plan.window, plan.strides, plan.padding, window_dilation=plan.dilation)
    ctx.stats["peephole_pools"] += 1
    return _finish(y, plan, view_fn)


def _finish(y, plan, view_fn):
    import jax.numpy as jnp

    shape, strides, offset = plan.out_view
    if tuple(y.shape) != tuple(shape) or tuple(strides) != tuple(contiguous_strides(shape)) or offset:
        y = view_fn(y, shape, strides, offset)
    return jnp.reshape(y, plan.out_shape)
