"""Repeated layers: saturate each distinct layer once and stitch the copies together in Python.

A transformer stack repeats one layer N times; saturating the whole graph
costs N times one layer (and the explosive step grows with the graph).
Here the graph is cut into *blocks* and every block is saturated as its own
small graph; blocks that are the same up to input names share one saturation.

1.-2. :mod:`egraft.rewrites.blocks` finds the cut points on the activation
   path and the longest repeating period of the segments between them:
   prefix, repeated layer blocks, suffix.
3. Each block becomes a standalone graph (canonical DFS order, the previous
   cut as a placeholder input ``__in__``, other inputs renamed ``__i<k>``); one
   egglog saturation per distinct block (*template*), all in one egglog
   session (rules parsed once, ``push``/``pop`` around each template), under
   the caller's limits: the time limit is shared, the e-node limit is split in
   proportion to block size so the stitched total stays within it.
4. Stitching (:mod:`egraft.rewrites.stitch`): every block occurrence is a
   copy of its template's e-graph in a plain-Python e-graph, its boundary
   classes mapped onto the classes of that occurrence's real nodes (the
   previous block's output, its own weights); a hashcons and congruence
   rebuild merge what occurrences share (model inputs, constants,
   constant-only subterms).  The result is a ready
   :class:`~egraft.ir.egraph.Snapshot`; nothing is replayed into
   egglog, so the cost after the templates is a few microseconds per
   stitched e-node instead of one parsed egglog command per e-node.

What is lost, and why that is acceptable: a rewrite whose left side spans a
block boundary is never tried, e.g. fusing the residual ``Add`` that ends
layer k with the ``LayerNorm`` that starts layer k+1, or a factorisation that
needs terms of two layers at once.  Every rewrite inside a layer (attention,
MLP, norm idioms, view algebra, the layer's own residual add) is found, and
the classes at a boundary are shared, so any choice per layer combines with
any choice in the next.  The kernels the backends generate do not cross
layers either (a layer boundary is a materialised activation), so the lost
rewrites are ones the search could rarely use, while saturating the whole
stack costs N times one layer and lets the explosive rules' match limits be
shared thinly across N layers.  ``Limits(repeated_layers=False)`` gives the
whole-graph saturation when it is wanted.  Soundness does not depend on any
of this: every stitched union was proven by egglog in a template or follows
by congruence (tests/rewrites/test_repeated.py checks extractions numerically).
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from dataclasses import dataclass, replace

from ..ir import Op
from ..ir.egraph import Snapshot, best_by_cost
from ..ir.graph import Graph
from .blocks import Block, block_graph, layer_blocks
from .codec import Context, encode_graph, input_attrs
from .session import STOP_ORDER, IterationStat, SaturationResult, EGraphSession, run_schedule
from .stitch import Stitcher


@dataclass
class Template:
    """One distinct block, saturated: its e-graph and the class of every block-graph node."""

    snap: Snapshot
    node_class: list[int]  # template class per block-graph node
    order: list[int]  # template e-node indices, children's classes first where possible


def _template(sess, block: Block, limits, t0: float):
    """Saturate one distinct block inside `sess` (between push and pop); (Template, schedule result)."""
    ctx = Context.for_graph(block.graph)
    sess.ctx = ctx
    sess.run("(push)", "starting a layer")
    try:
        text, hs = encode_graph(block.graph, ctx)
        sess.run(text, "encoding a layer")
        sess.analysis()
        res = run_schedule(sess, limits, t0)
        snap = sess.snapshot()
    finally:
        sess.run("(pop)", "finishing a layer")
    rank = best_by_cost(snap, [1.0] * len(snap.nodes), "max")[0]
    order = sorted(range(len(snap.nodes)), key=lambda i: rank[snap.nodes[i].cls])
    return Template(snap, [snap.class_of_handle[h] for h in hs], order), res


def saturate_layered(graph: Graph, rules, limits):
    """Saturation with one egglog run per distinct block, stitched in Python; None when nothing repeats.

    Returns a :class:`~egraft.rewrites.session.SaturationResult` whose ``egraph``
    is None (there is no egglog e-graph of the whole model) and whose snapshot
    is the stitched e-graph; its handles are the graph's node ids.
    """
    t0 = time.perf_counter()
    found = layer_blocks(graph)
    if found is None:
        return None
    block_specs, (start, period, count) = found
    blocks = [block_graph(graph, outs, entry) for outs, entry in block_specs]
    total = sum(len(b.graph.nodes) for b in blocks)
    templates: dict[str, Template | None] = {}
    history = [IterationStat("start", len(graph.nodes), len(graph.nodes), 0.0, 0)]
    stops, iters, sess = [], 0, None
    for b in blocks:
        if b.key in templates:
            continue
        if all(n.op == Op.Input for n in b.graph.nodes):
            templates[b.key] = None  # nothing to saturate: its inputs are added as they are
            continue
        if sess is None:
            sess = EGraphSession(rules, Context())
        share = max(int(limits.nodes * len(b.graph.nodes) / total), 1)
        tpl, sched = _template(sess, b, replace(limits, nodes=share), t0)
        templates[b.key] = tpl
        label = f"t{len(templates) - 1}"
        history += [IterationStat(f"{label}:{h.phase}", h.nodes, h.classes, h.seconds, h.matches)
                    for h in sched.history]
        stops.append(sched.stop_reason)
        iters = max(iters, sched.iterations)
    t_templates = time.perf_counter() - t0

    # the stitch allocates many small acyclic objects: keep them from triggering full collections
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        snap, st = _stitch(graph, blocks, templates)
    finally:
        if gc_was_on:
            gc.enable()
    seconds = time.perf_counter() - t0
    stop = min(stops, key=STOP_ORDER.index) if stops else STOP_ORDER[-1]
    nodes, classes = len(snap.nodes), snap.n_classes
    firings = Counter(sess.firings) if sess is not None else Counter()
    forms = Counter(sess.form_firings) if sess is not None else Counter()
    history.append(IterationStat("stitched", nodes, classes, seconds, 0))
    info = {"blocks": len(blocks), "templates": sum(t is not None for t in templates.values()),
            "period_segments": period, "repeats": count, "template_seconds": round(t_templates, 3),
            "stitch_seconds": round(seconds - t_templates, 3), "stitch_unions": st.unions}
    return SaturationResult(egraph=None, ctx=snap.ctx, graph=graph, output_handles=list(graph.outputs),
                            input_handles=list(graph.input_ids), stop_reason=stop, iterations=iters, nodes=nodes,
                            classes=classes, seconds=seconds, history=history, firings=firings, layers=info, snap=snap,
                            form_firings=forms, parts=[(b, templates[b.key]) for b in blocks])


def _stitch(graph: Graph, blocks: list[Block], templates: dict) -> tuple[Snapshot, Stitcher]:
    """The whole graph's e-graph from its blocks' templates; handles are graph node ids."""
    ctx = Context.for_graph(graph)
    ctx.next_handle = len(graph.nodes)
    st = Stitcher()
    base: dict[int, int] = {}  # graph node -> stitched class
    for v in list(graph.input_ids) + [i for i, n in enumerate(graph.nodes) if n.op == Op.Input]:
        if v not in base:
            n = graph.nodes[v]
            base[v] = st.new_class(n.shape, n.dtype)
            st.add("Input", input_attrs(n.attrs["name"], n.shape, n.dtype, n.attrs["role"]), (), base[v])
    for b in blocks:
        tpl = templates[b.key]
        if tpl is not None:
            ctx.constants.update(tpl.snap.ctx.constants)
            _instantiate(st, tpl, b, base)
    return st.snapshot(base, ctx), st


def _instantiate(st: Stitcher, tpl: Template, block: Block, base: dict[int, int]) -> None:
    """Copy a template's e-graph onto one block occurrence in the stitched e-graph."""
    snap = tpl.snap
    m: dict[int, int] = {}  # template class -> stitched class
    for k, v in enumerate(block.order):  # the block's own nodes land in their graph nodes' classes
        ct = tpl.node_class[k]
        g = base.get(v)
        if g is None:
            g = base[v] = st.new_class(snap.shape[ct], snap.dtype[ct])
        m[ct] = st.union(m[ct], g) if ct in m else g

    def cls(c: int) -> int:
        g = m.get(c)
        if g is None:
            g = m[c] = st.new_class(snap.shape[c], snap.dtype[c])
        return g

    nodes = snap.nodes
    for i in tpl.order:
        n = nodes[i]
        attrs = n.attrs
        if n.op == Op.Input:
            real = block.names[attrs["name"]]
            if not real:
                continue  # the placeholder: its class is the previous block's output
            attrs = input_attrs(real, attrs["shape"], attrs["dtype"], attrs["role"])
        st.add(n.op, attrs, [cls(c) for c in n.children], cls(n.cls))
