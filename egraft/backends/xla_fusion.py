"""An XLA-like fusion model: the kernels the ``jax`` and ``torch`` backends' compilers make of a graph.

The cost model (``egraft.search.cost``) prices a backend's :class:`~.base.KernelPlan`;
the JAX and torch backends cannot ask XLA or Inductor which kernels they will
emit, so their plan is this approximation (rules in :func:`xla_roots`): the
per-call graph after weight folding (``fold.plan``), idioms expanded first
under knob ``idioms="primitive"``, ``SumReduce(Mul(..))`` products run as
dots under knob ``peephole`` (the default); under ``stream="llvm"`` a folded
widening of a weight (``fold.widened``) is read in the weight's stored dtype
(the generated product widens it in registers).  Other knobs do not change
the work.  Causal attention is priced as full attention.
"""

from __future__ import annotations

from ..ir import Group, Op
from ..ir.decompose import decompose
from ..ir.graph import Graph
from ..ir.matmul_form import matmul_form
from .base import KernelPlan
from .fold import plan as fold_plan
from .fold import widened

_CONTRACTING = Group.CONTRACTION | Group.ATTENTION


def dot_operands(graph: Graph, i: int) -> tuple[int, int] | None:
    """The two factors of a ``SumReduce(Mul(a, b))`` that is a matrix product (the Mul itself is not run)."""
    form = matmul_form(graph, i)
    if form is None or form.K <= 1 or not (form.lhs.broadcast or form.rhs.broadcast):
        return None  # an un-broadcast product and sum is a plain fused reduction
    return form.lhs.node, form.rhs.node


def _operands(graph: Graph, i: int, dots: dict) -> tuple[int, ...]:
    return dots[i] if i in dots else graph.nodes[i].inputs


XLA_ROOTS = Group.CONTRACTION | Group.ATTENTION | Group.ROW_IDIOM | Group.REDUCE | (Group.INDEX - {Op.Iota})


def xla_roots(graph: Graph, knobs: dict) -> tuple[set, dict]:
    """(materialised nodes, recognised primitive products) under an XLA-like fusion.

    * kernel roots: contractions (``MatMul``, and ``SumReduce(Mul(..))`` that
      the JAX peephole runs as ``dot_general``), ``Attention``, row idioms,
      reductions, gathers and scatters;
    * elementwise ops (and ``Iota``) fuse into the kernel of their consumers;
      views are free and transparent: consumers are counted through them;
    * materialised besides: a value read by several kernels (several
      consumers inside one kernel fuse, as in XLA's loop fusion) and a
      computed operand of a contraction or attention (XLA's dot reads
      buffers; a transposing view of one is taken as free: it becomes the
      dot's dimension numbers);
    * a graph output is written once: a computed one by its kernel, a view
      output by a copy kernel (reading only the elements it shows);
    * knob ``peephole=False`` (JAX): a product ``Mul`` is materialised
      before its reduction, as the JAX backend then runs it.
    """
    nodes = graph.nodes
    peephole = knobs.get("peephole", True)
    dots, products = {}, set()
    for i, n in enumerate(nodes):
        if n.op == Op.SumReduce and (ops := dot_operands(graph, i)) is not None:
            if peephole:
                dots[i] = ops
            else:
                products.add(n.inputs[0])
    used = graph.needed(lambda i: _operands(graph, i, dots))
    base = list(range(len(nodes)))
    for i, n in enumerate(nodes):
        if n.op == Op.View:
            base[i] = base[n.inputs[0]]
    consumers: dict[int, set] = {}
    operands = set()
    for i, n in enumerate(nodes):
        if not used[i] or n.op == Op.View:
            continue
        for j in _operands(graph, i, dots):
            consumers.setdefault(base[j], set()).add(i)
            if n.op in _CONTRACTING or i in dots:
                operands.add(base[j])
    outs = set(graph.outputs)
    for o in outs:
        if nodes[o].op == Op.View:  # a view output is written by a copy kernel of its own
            consumers.setdefault(base[o], set()).add(o)
    mat: set = set()
    owner: dict[int, int] = {}  # computed node -> the kernel (root) it runs in
    for i in range(len(nodes) - 1, -1, -1):  # consumers before producers
        n = nodes[i]
        if not used[i] or n.op in Group.LEAF or (n.op == Op.View and i not in outs):
            continue
        kernels_of_users = {owner[c] for c in consumers.get(i, ())}
        if n.op in XLA_ROOTS or i in outs or i in operands or i in products or len(kernels_of_users) != 1:
            mat.add(i)
            owner[i] = i
        else:
            owner[i] = kernels_of_users.pop()
    return mat, dots


def plan(graph: Graph, knobs: dict) -> KernelPlan:
    """The kernels one call of `graph` runs under XLA-like fusion (the ``jax`` and ``torch`` backends' plan)."""
    wide = knobs.get("fold_widened", True)  # (the torch backend's knob; the JAX backend's: fold_growing)
    folded = fold_plan(graph, wide, grow=wide and knobs.get("fold_growing", True))
    main = folded.main
    if knobs.get("idioms", "library") == "primitive":
        main = decompose(main)
    mat, dots = xla_roots(main, knobs)
    stored = {}
    if knobs.get("stream") == "llvm":  # the JAX backend's generated products read a widened weight as stored
        wide = widened(folded)
        stored = {i: wide[n.attrs["name"]].dtype for i, n in enumerate(main.nodes)
                  if n.op == Op.Input and n.attrs["name"] in wide}
    return KernelPlan(main, frozenset(mat), dots, stored=stored)
