"""Repeated layers: saturate each distinct layer once and copy its e-graph into the others.

A transformer stack repeats one layer N times; saturating the whole graph
costs N times one layer (and the explosive step grows with the graph).
Here the graph is cut into *blocks* and every block is saturated as its own
small graph; blocks that are the same up to input names share one saturation.

1. Cut points: a node v on the activation path ("stream": depends on a model
   input) is a cut when no stream edge jumps over it in the graph's
   topological order (edges from Inputs, weights and constant-only subgraphs
   don't count).  The residual stream between layers is such a point.
2. The fine segments between cuts get a hash of their structure with input
   names anonymised; the longest run of a repeating period in that sequence
   gives the layers: prefix, P-segment blocks repeated `count` times, suffix.
3. Each block becomes a standalone graph (canonical DFS order, the previous
   cut as a placeholder input ``__in__``, other inputs renamed ``__i<k>``); one
   saturation per distinct block, under the same limits (time shared).
4. The full graph is encoded once, then every block's saturated template is
   instantiated into it: each template e-node is re-emitted with the block's
   real input names and its classes mapped onto the block's own handles.

Rewrites that span a block boundary (for example fusing across the residual
add between two layers) are not found; everything inside a layer is.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from ..ir.graph import Attrs, Graph, Node
from . import encode as E
from .export import snapshot

MIN_NODES = 120  # below this, plain saturation is cheap enough


def _stream(graph: Graph) -> list[bool]:
    flag = [False] * len(graph.nodes)
    for i, n in enumerate(graph.nodes):
        if n.op == "Input":
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


def cut_points(graph: Graph) -> list[int]:
    """Stream nodes no stream edge jumps over, in DFS order (graph outputs reach the end)."""
    stream = _stream(graph)
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


def layer_blocks(graph: Graph):
    """[(outputs, entry)] per block: prefix, repeated layers, suffix; None when nothing repeats."""
    if len(graph.nodes) < MIN_NODES:
        return None
    cuts = cut_points(graph)
    if len(cuts) < 3:
        return None
    stream = _stream(graph)
    if any(not stream[o] for o in graph.outputs):
        return None
    # fine segments (cut_{k-1}, cut_k]
    keys = []
    for k, c in enumerate(cuts):
        keys.append(block_graph(graph, [c], cuts[k - 1] if k else None).key)
    per = find_period(keys)
    if per is None:
        return None
    start, p, count = per
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
    return blocks, (start, p, count)


def saturate_layered(graph: Graph, rules, limits):
    """Saturation with one run per distinct block; None when the graph has no repeated layers."""
    from .saturate import Session, SaturationResult, IterationStat, run_schedule

    t0 = time.perf_counter()
    found = layer_blocks(graph)
    if found is None:
        return None
    block_specs, (start, period, count) = found
    blocks = [block_graph(graph, outs, entry) for outs, entry in block_specs]
    templates: dict[str, tuple] = {}
    firings: Counter = Counter()
    stops, iters = [], 0
    for b in blocks:
        if b.key in templates:
            continue
        ctx = E.Context.for_graph(b.graph)
        sess = Session(rules, ctx)
        text, hs = E.encode_graph(b.graph, ctx)
        sess.run(text, "encoding a layer")
        sess.analysis()
        remaining = max(limits.seconds - (time.perf_counter() - t0), 0.0)
        from dataclasses import replace

        stop, it, *_ = run_schedule(sess, replace(limits, seconds=remaining), time.perf_counter())
        stops.append(stop)
        iters = max(iters, it)
        firings.update(sess.firings)
        templates[b.key] = (snapshot(sess.eg, ctx), hs)
    t_templates = time.perf_counter() - t0

    ctx = E.Context.for_graph(graph)
    big = Session(rules, ctx)
    text, hs_big = E.encode_graph(graph, ctx)
    lines = [text]
    for b in blocks:
        snap, hs_t = templates[b.key]
        lines.extend(_instantiate(snap, hs_t, b, hs_big, ctx))
    big.run("\n".join(lines), "instantiating repeated layers")
    big.analysis()
    nodes, classes = big.sizes()
    seconds = time.perf_counter() - t0
    order = ["time limit", "node limit", "iteration limit", "saturated"]
    stop = min(stops, key=order.index) if stops else "saturated"
    history = [IterationStat("start", len(graph.nodes), len(graph.nodes), 0.0, 0),
               IterationStat("layers", nodes, classes, seconds, sum(firings.values()))]
    info = {"blocks": len(blocks), "templates": len(templates), "period_segments": period,
            "repeats": count, "template_seconds": round(t_templates, 3),
            "assembly_seconds": round(seconds - t_templates, 3)}
    return SaturationResult(big.eg, ctx, graph, [hs_big[o] for o in graph.outputs],
                            [hs_big[i] for i in graph.input_ids], stop, iters, nodes, classes, seconds,
                            history, firings, layers=info)


def _instantiate(snap, hs_t, block: Block, hs_big, ctx: E.Context) -> list[str]:
    """egglog unions that copy a saturated template onto one block of the big e-graph."""
    cls_handle: dict[int, int] = {}
    lines = []
    for i, orig in enumerate(block.order):
        c = snap.class_of_handle[hs_t[i]]
        h = hs_big[orig]
        if c in cls_handle:
            if cls_handle[c] != h:
                lines.append(f"(union {E.handle(cls_handle[c])} {E.handle(h)})")
        else:
            cls_handle[c] = h

    def ref(c: int) -> str:
        h = cls_handle.get(c)
        if h is None:
            h = cls_handle[c] = ctx.new_handle()
        return E.handle(h)

    for n in snap.nodes:
        if n.op == "Input":
            real = block.names[n.attrs["name"]]
            if not real:
                continue  # the placeholder: its class is the previous block's output
            attrs = dict(n.attrs.as_dict(), name=real)
        else:
            attrs = n.attrs
        lines.append(f"(union {ref(n.cls)} {E.encode_op(n.op, attrs, [ref(k) for k in n.children], ctx)})")
    return lines
