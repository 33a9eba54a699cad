"""Graph -> kernels: which nodes are materialised, and what each kernel fuses.

A partition is the set of *materialised* nodes: graph outputs, plus every
anchor (reduction, matmul, row idiom, attention) that cannot be fused into
its consumer.  Each materialised node is the root of one kernel, which
inlines everything between it and the materialised tensors it reads:
elementwise ops, views and gathers always (they are cheap index arithmetic
and recomputing them beats a round trip through memory), anchors only where
the kernel's tile can hold them:

* a reduction whose result is broadcast back along the kernel's column axis
  (``x - x.max(-1, keepdim=True)``) shares the row tile when a whole row
  fits (``persistent``): softmax / norms in primitive form become one kernel;
* a reduction whose result *is* the kernel's output shape (the root or its
  elementwise epilogue) gets a reduction tile axis;
* one matmul or attention per kernel, with an elementwise epilogue; their
  operands are prologue (elementwise + views), never other anchors;
* a ``Scatter`` is always a kernel of its own (``scatter.py``): its operands
  are inlined, and it is never inlined into a consumer.

Everything else is materialised.  Knobs force cuts: ``fuse_epilogue``
(anchors never fused into consumers), ``fuse_prologue`` (computed operands
of anchors materialised), ``persistent_rows`` and ``fuse_<id>`` per anchor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...ir import Group, Op, get_op
from ...ir.graph import Graph
from .matmul import DotForm, dot_form
from ...ir.strided import digit_map

NULLARY = frozenset(op for op in Group.ALL if get_op(op).arity == (0,))  # Input, Constant, Iota: never "computed"
MAX_ROW = 16384  # widest row a persistent-row kernel holds in one tile


def pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass
class KernelPlan:
    root: int
    kind: str  # tile | dot | attention | scatter
    col_dim: int | None  # the root's dimension walked by tile axis 1
    inputs: list = field(default_factory=list)  # materialised node ids it reads
    persistent: bool = False  # has reductions sharing the row tile
    reduce_k: int = 0  # largest reduced extent on a reduction tile axis (0: none)
    dots: dict = field(default_factory=dict)  # node id -> DotForm
    main: int | None = None  # the dot / attention node


def anchor_kind(graph: Graph, nid: int) -> str | None:
    n = graph.nodes[nid]
    if n.op in Group.REDUCE:
        return "dot" if dot_form(graph, nid) is not None else "reduce"
    if n.op in Group.CONTRACTION:
        return "dot"
    if n.op in Group.ROW_IDIOM:
        return "row"
    if n.op in Group.ATTENTION:
        return "attention"
    return None


def is_leaf_buffer(graph: Graph, nid: int) -> bool:
    n = graph.nodes[nid]
    return n.op == Op.Input or (n.op == Op.Constant and n.shape != ())


def anchors(graph: Graph) -> list[int]:
    alive = graph.live()
    return [i for i in range(len(graph.nodes)) if alive[i] and anchor_kind(graph, i)]


def _col_dim(graph: Graph, root: int) -> int | None:
    n = graph.nodes[root]
    if not n.shape:
        return None
    if n.op in Group.ROW_IDIOM:
        return n.attrs["axis"]
    return len(n.shape) - 1


def _row_fits(graph, knobs, nid, col):
    n = graph.nodes[nid]
    axis = n.attrs["axis"]
    src = graph.nodes[n.inputs[0]]
    return knobs.get("persistent_rows", True) and axis == col and pow2(src.shape[axis]) <= MAX_ROW


def _view_mode(graph: Graph, n, mode):
    """The index mode of a View's source, given the View's own mode.

    A mode is a tuple naming, per dimension, which root dimension's tile
    index it is (None: the constant 0), or "red"/"other"/"operand" for
    indices that are not the root's.  Only per-digit views with unit
    coefficients and zero base keep a tuple mode.
    """
    if not isinstance(mode, tuple):
        return mode
    src = graph.nodes[n.inputs[0]]
    dm = digit_map(src.shape, n.attrs["shape"], n.attrs["strides"], n.attrs["offset"])
    if dm is None:
        return "other"
    out = []
    for j, (base, terms) in enumerate(dm):
        if src.shape[j] == 1:
            out.append(None)
        elif base == 0 and not terms:
            out.append(None)
        elif base == 0 and len(terms) == 1 and terms[0][1] == 1:
            out.append(mode[terms[0][0]])
        else:
            return "other"
    return tuple(out)


def _grow(graph: Graph, root: int, mat: set, knobs: dict):
    """The kernel rooted at `root`: (plan, region, anchors to materialise)."""
    rnode = graph.nodes[root]
    col = _col_dim(graph, root)
    ident = tuple(range(len(rnode.shape)))
    rk = anchor_kind(graph, root)
    kind = "scatter" if rnode.op == Op.Scatter else {"dot": "dot", "attention": "attention"}.get(rk, "tile")
    plan = KernelPlan(root=root, kind=kind, col_dim=col)
    if rk == "dot":
        plan.dots[root] = dot_form(graph, root)
        plan.main = root
    if rk == "attention":
        plan.main = root
    must: set = set()
    region: set = set()
    inputs: set = set()
    seen: set = set()
    has_reduce = rk in ("reduce", "row")
    stack = [(root, ident)]
    prologue_cut = not knobs.get("fuse_prologue", True)

    def fusable(nid):
        return knobs.get("fuse_epilogue", True) and knobs.get(f"fuse_{nid}", True)

    def shares_row(nid, mode):
        """A reduction at `mode` whose input, with the column index put back, is the root's tile."""
        n = graph.nodes[nid]
        ax = n.attrs["axis"]
        if not isinstance(mode, tuple) or col is None or col in mode or not _row_fits(graph, knobs, nid, col):
            return False
        full = mode[:ax] + (col,) + mode[ax:]
        return full == ident and graph.nodes[n.inputs[0]].shape == rnode.shape

    while stack:
        nid, mode = stack.pop()
        if (nid, mode) in seen:
            continue
        seen.add((nid, mode))
        n = graph.nodes[nid]
        if nid != root and (nid in mat or is_leaf_buffer(graph, nid)):
            inputs.add(nid)
            continue
        if n.op == Op.Scatter:
            if nid != root:  # written where its index says, not read at ours: always its own kernel
                must.add(nid)
                continue
            region.add(nid)
            stack.extend((j, "other") for j in n.inputs)  # its operands are read at the lines' indices
            continue
        ak = anchor_kind(graph, nid)
        if nid != root and ak is not None:
            ok = False
            if ak == "reduce" and kind == "tile" and fusable(nid):
                if shares_row(nid, mode):
                    ok, child_mode = True, ident
                    plan.persistent = True
                elif mode == ident:
                    ok, child_mode = True, "red"
                    plan.reduce_k = max(plan.reduce_k, graph.nodes[n.inputs[0]].shape[n.attrs["axis"]])
            elif ak == "row" and kind == "tile" and mode == ident and fusable(nid) and _row_fits(graph, knobs, nid, col):
                ok, child_mode = True, ident
                plan.persistent = True
            elif ak in ("dot", "attention") and mode == ident and kind == "tile" and not has_reduce and fusable(nid):
                ok, child_mode = True, "operand"
                kind = plan.kind = ak
                plan.main = nid
                if ak == "dot":
                    plan.dots[nid] = dot_form(graph, nid)
            if not ok:
                must.add(nid)
                continue
            if ak in ("reduce", "row"):
                has_reduce = True
            region.add(nid)
            _push_anchor_children(graph, nid, ak, child_mode, stack, prologue_cut, must, mat, plan)
            continue
        region.add(nid)
        if nid == root and ak is not None:
            if ak in ("dot", "attention"):
                _push_anchor_children(graph, nid, ak, "operand", stack, prologue_cut, must, mat, plan)
            elif ak == "row":
                _push_anchor_children(graph, nid, ak, ident, stack, prologue_cut, must, mat, plan)
                plan.persistent = True
            else:  # a reduction root: its input gets a reduction tile axis
                plan.reduce_k = max(plan.reduce_k, graph.nodes[n.inputs[0]].shape[n.attrs["axis"]])
                _push_anchor_children(graph, nid, ak, "red", stack, prologue_cut, must, mat, plan)
            continue
        if n.op == Op.View:
            stack.append((n.inputs[0], _view_mode(graph, n, mode)))
        elif n.op == Op.Gather:
            stack.append((n.inputs[0], "other" if isinstance(mode, tuple) else mode))
            stack.append((n.inputs[1], mode))
        else:
            for j in n.inputs:
                stack.append((j, mode))
    plan.inputs = sorted(inputs)
    return plan, region, must


def _push_anchor_children(graph, nid, ak, child_mode, stack, prologue_cut, must, mat, plan):
    n = graph.nodes[nid]
    if ak == "dot":
        form: DotForm = plan.dots.get(nid) or dot_form(graph, nid)
        kids = [form.a, form.b]
    else:
        kids = list(n.inputs)
    for j in kids:
        jn = graph.nodes[j]
        computed = jn.op not in Group.MOVEMENT | NULLARY and j not in mat
        if prologue_cut and computed:
            must.add(j)
        stack.append((j, child_mode))


def partition(graph: Graph, knobs: dict) -> list[KernelPlan]:
    """Kernels (in launch order) for a graph whose weight-only parts are already folded."""
    alive = graph.live()
    mat = {o for o in graph.outputs if not is_leaf_buffer(graph, o)}
    for a in anchors(graph):
        if knobs.get(f"fuse_{a}", True) is False:
            mat.add(a)
    while True:
        plans, owner, grow_more = {}, {}, set()
        shared = set()
        for root in sorted(mat):
            plan, region, must = _grow(graph, root, mat, knobs)
            plans[root] = plan
            grow_more |= must
            for nid in region:
                if nid != root and anchor_kind(graph, nid):
                    if nid in owner and owner[nid] != root:
                        shared.add(nid)  # an anchor two kernels would compute: compute it once
                    owner[nid] = root
        new = (grow_more | shared) - mat
        if not new:
            break
        mat |= new
    return [plans[r] for r in sorted(mat) if alive[r] or r in graph.outputs]

