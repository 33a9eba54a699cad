"""Repeated layers: saturate each distinct layer once and stitch the copies together in Python.

A transformer stack repeats one layer N times; saturating the whole graph
costs N times one layer (and the explosive step grows with the graph).
Here the graph is cut into *blocks* and every block is saturated as its own
small graph; blocks that are the same up to input names share one saturation.

1. Cut points: a node v on the activation path ("stream": depends on a model
   input) is a cut when no stream edge jumps over it in the graph's
   topological order (edges from weights and constant-only subgraphs don't
   count).  The residual stream between layers is such a point.  Two
   readings are tried -- model inputs are stream nodes themselves (so the
   first layer, whose residual edge starts at the model input, cuts like the
   others) or they are ignored like weights (so an input every layer reads,
   such as a mask, does not hide the cuts) -- and the one whose repeated
   blocks cover more of the graph wins.
2. The fine segments between cuts get a hash of their structure with input
   names anonymised; the longest run of a repeating period in that sequence
   gives the layers: prefix, P-segment blocks repeated `count` times, suffix.
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
   :class:`~egraft.egraph.Snapshot`; nothing is replayed into
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
by congruence (tests/rewrites/test_layers.py checks extractions numerically).
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from dataclasses import dataclass, replace

from ..ir.graph import Attrs, Graph, Node
from . import encode as E
from ..egraph import Snapshot, best_by_cost
from .stitch import Stitcher

MIN_NODES = 120  # below this, plain saturation is cheap enough


def _is_model_input(n: Node) -> bool:
    return n.op == "Input" and n.attrs["role"] == "input"


def _stream(graph: Graph, inputs: bool = False) -> list[bool]:
    """Per node: does it depend on a model input (with `inputs`, model inputs count themselves)?"""
    flag = [False] * len(graph.nodes)
    for i, n in enumerate(graph.nodes):
        if n.op == "Input":
            flag[i] = inputs and _is_model_input(n)
            continue
        flag[i] = any(flag[j] or (graph.nodes[j].op == "Input" and graph.nodes[j].attrs["role"] == "input")
                      for j in n.inputs)
    return flag


def dfs_order(graph: Graph) -> list[int]:
    """Post-order DFS from the outputs (arguments left to right): layer after layer."""
    seen, order = set(), []
    for root in graph.outputs:
        stack = [(root, False)]
        while stack:
            v, done = stack.pop()
            if done:
                order.append(v)
                continue
            if v in seen:
                continue
            seen.add(v)
            stack.append((v, True))
            for j in reversed(graph.nodes[v].inputs):
                if j not in seen:
                    stack.append((j, False))
    return order


def cut_points(graph: Graph, inputs: bool = False) -> list[int]:
    """Stream nodes no stream edge jumps over, in DFS order (graph outputs reach the end).

    With `inputs`, model inputs are stream nodes (their edges count and they can be cuts).
    """
    stream = _stream(graph, inputs)
    order = dfs_order(graph)
    pos = {v: k for k, v in enumerate(order)}
    reach = {}
    for v in order:
        for j in graph.nodes[v].inputs:
            if stream[j]:
                reach[j] = max(reach.get(j, -1), pos[v])
    for o in graph.outputs:
        reach[o] = len(order)
    cuts, far = [], -1
    for k, v in enumerate(order):
        if not stream[v]:
            continue
        if far <= k:
            cuts.append(v)
        far = max(far, reach.get(v, -1))
    return cuts


@dataclass
class Block:
    graph: Graph  # anonymised standalone graph
    order: list[int]  # original node id per block-graph node (entry for the placeholder)
    names: dict[str, str]  # anonymised input name -> real name
    key: str  # structural hash of the anonymised graph


def block_graph(graph: Graph, outputs: list[int], entry: int | None) -> Block:
    """A standalone graph of what `outputs` compute above `entry`, in canonical DFS order."""
    ids: dict[int, int] = {}
    nodes: list[Node] = []
    order: list[int] = []
    names: dict[str, str] = {}
    input_ids: list[int] = []
    for root in outputs:
        stack = [(root, False)]
        while stack:
            v, done = stack.pop()
            if v in ids:
                continue
            n = graph.nodes[v]
            if v == entry or n.op == "Input":
                if v == entry:
                    name, role = "__in__", "input"
                else:
                    name, role = f"__i{len(names)}", n.attrs["role"]
                names[name] = n.attrs["name"] if v != entry else ""
                attrs = Attrs({"name": name, "shape": n.shape, "dtype": n.dtype, "role": role})
                ids[v] = len(nodes)
                nodes.append(Node("Input", (), attrs, n.shape, n.dtype))
                order.append(v)
                if role == "input":
                    input_ids.append(ids[v])
                continue
            if done:
                ids[v] = len(nodes)
                nodes.append(Node(n.op, tuple(ids[j] for j in n.inputs), n.attrs, n.shape, n.dtype))
                order.append(v)
                continue
            stack.append((v, True))
            for j in reversed(n.inputs):
                if j not in ids:
                    stack.append((j, False))
    g = Graph(nodes, [ids[o] for o in outputs], input_ids)
    return Block(g, order, names, g.structural_hash())


def find_period(seq: list[str]) -> tuple[int, int, int] | None:
    """(start, period, count) of the longest run of a repeating block (count >= 2), or None."""
    m = len(seq)
    best = None
    for p in range(1, m // 2 + 1):
        run = 0
        for i in range(m - p - 1, -1, -1):
            run = run + 1 if seq[i] == seq[i + p] else 0
            count = run // p + 1
            if count >= 2:
                cover = count * p
                if best is None or cover > best[1] * best[2] or (cover == best[1] * best[2] and p < best[1]):
                    best = (i, p, count)
    return best


def _blocks_from_cuts(graph: Graph, cuts: list[int]):
    """(blocks, (start, period, count), covered nodes) for one reading of the cut points, or None."""
    if len(cuts) < 3:
        return None
    segs = [block_graph(graph, [c], cuts[k - 1] if k else None) for k, c in enumerate(cuts)]
    per = find_period([b.key for b in segs])
    if per is None:
        return None
    start, p, count = per
    covered = count * sum(len(b.graph.nodes) for b in segs[start:start + p])
    bounds = []  # (entry, exit) per block
    if start > 0:
        bounds.append((None, cuts[start - 1]))
    for j in range(count):
        lo = start + j * p
        bounds.append((cuts[lo - 1] if lo > 0 else None, cuts[lo + p - 1]))
    last = start + count * p - 1
    tail_outputs = list(graph.outputs) if list(graph.outputs) != [cuts[last]] else None
    blocks = [([exit_], entry) for entry, exit_ in bounds]
    if tail_outputs is not None:
        blocks.append((tail_outputs, cuts[last]))
    return blocks, (start, p, count), covered


def layer_blocks(graph: Graph):
    """[(outputs, entry)] per block: prefix, repeated layers, suffix; None when nothing repeats."""
    if len(graph.nodes) < MIN_NODES:
        return None
    stream = _stream(graph)
    if any(not stream[o] for o in graph.outputs):
        return None
    best = None
    for inputs in (True, False):
        found = _blocks_from_cuts(graph, cut_points(graph, inputs))
        if found is not None and (best is None or found[2] > best[2]):
            best = found
    return None if best is None else best[:2]


@dataclass
class Template:
    """One distinct block, saturated: its e-graph and the class of every block-graph node."""

    snap: Snapshot
    node_class: list[int]  # template class per block-graph node
    order: list[int]  # template e-node indices, children's classes first where possible


def _template(sess, block: Block, limits, t0: float):
    """Saturate one distinct block inside `sess` (between push and pop); (Template, schedule result)."""
    from .saturate import run_schedule

    ctx = E.Context.for_graph(block.graph)
    sess.ctx = ctx
    sess.run("(push)", "starting a layer")
    try:
        text, hs = E.encode_graph(block.graph, ctx)
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

    Returns a :class:`~egraft.rewrites.saturate.SaturationResult` whose ``egraph``
    is None (there is no egglog e-graph of the whole model) and whose snapshot
    is the stitched e-graph; its handles are the graph's node ids.
    """
    from .saturate import STOP_ORDER, IterationStat, SaturationResult, Session

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
        if all(n.op == "Input" for n in b.graph.nodes):
            templates[b.key] = None  # nothing to saturate: its inputs are added as they are
            continue
        if sess is None:
            sess = Session(rules, E.Context())
        share = max(int(limits.nodes * len(b.graph.nodes) / total), 1)
        tpl, (stop, it, _, _, _, hist) = _template(sess, b, replace(limits, nodes=share), t0)
        templates[b.key] = tpl
        label = f"t{len(templates) - 1}"
        history += [IterationStat(f"{label}:{h.phase}", h.nodes, h.classes, h.seconds, h.matches) for h in hist]
        stops.append(stop)
        iters = max(iters, it)
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
    history.append(IterationStat("stitched", nodes, classes, seconds, 0))
    info = {"blocks": len(blocks), "templates": sum(t is not None for t in templates.values()),
            "period_segments": period, "repeats": count, "template_seconds": round(t_templates, 3),
            "stitch_seconds": round(seconds - t_templates, 3), "stitch_unions": st.unions}
    return SaturationResult(None, snap.ctx, graph, list(graph.outputs), list(graph.input_ids), stop, iters,
                            nodes, classes, seconds, history, firings, layers=info, _snap=snap)


def _stitch(graph: Graph, blocks: list[Block], templates: dict) -> tuple[Snapshot, Stitcher]:
    """The whole graph's e-graph from its blocks' templates; handles are graph node ids."""
    ctx = E.Context.for_graph(graph)
    ctx.next_handle = len(graph.nodes)
    st = Stitcher()
    base: dict[int, int] = {}  # graph node -> stitched class
    for v in list(graph.input_ids) + [i for i, n in enumerate(graph.nodes) if n.op == "Input"]:
        if v not in base:
            n = graph.nodes[v]
            base[v] = st.new_class(n.shape, n.dtype)
            st.add("Input", _input_attrs(n.attrs["name"], n.shape, n.dtype, n.attrs["role"]), (), base[v])
    for b in blocks:
        tpl = templates[b.key]
        if tpl is not None:
            ctx.constants.update(tpl.snap.ctx.constants)
            _instantiate(st, tpl, b, base)
    return st.snapshot(base, ctx), st


def _input_attrs(name: str, shape, dtype: str, role: str) -> Attrs:
    """An Input's attrs as the e-graph decoder returns them (see encode.Decoder.row)."""
    return Attrs({"name": name, "shape": tuple(int(x) for x in shape), "dtype": dtype, "role": role})


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
        if n.op == "Input":
            real = block.names[attrs["name"]]
            if not real:
                continue  # the placeholder: its class is the previous block's output
            attrs = _input_attrs(real, attrs["shape"], attrs["dtype"], attrs["role"])
        st.add(n.op, attrs, [cls(c) for c in n.children], cls(n.cls))
