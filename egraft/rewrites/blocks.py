"""Where a graph repeats: cut points, blocks and the repeating period (pure graph analysis).

Used by :mod:`egraft.rewrites.repeated` to saturate each distinct layer once.

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
   cut as a placeholder input ``__in__``, other inputs renamed ``__i<k>``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import Op
from ..ir.analysis import weight_only
from ..ir.graph import Attrs, Graph, Node

MIN_NODES = 120  # below this, plain saturation is cheap enough


def _stream(graph: Graph, inputs: bool = False, primary: int | None = None) -> list[bool]:
    """Per node: does it depend on a model input (with `inputs`, model inputs count themselves)?  With `primary`
    (an input's node id): does it depend on that input (itself included)?"""
    if primary is not None:
        flag = [False] * len(graph.nodes)
        flag[primary] = True
        for i, n in enumerate(graph.nodes):  # node ids are in topological order
            if not flag[i] and any(flag[j] for j in n.inputs):
                flag[i] = True
        return flag
    flag = [not w for w in weight_only(graph)]
    if not inputs:
        for i, n in enumerate(graph.nodes):
            if n.op == Op.Input:
                flag[i] = False
    return flag


def dfs_order(graph: Graph, roots=None) -> list[int]:
    """Post-order DFS from the outputs (or `roots`; arguments left to right): layer after layer."""
    seen, order = set(), []
    for root in graph.outputs if roots is None else roots:
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


def early_order(graph: Graph) -> list[int]:
    """``dfs_order`` with every node the first output does not need moved to just after its last input: an output
    computed inside a layer (a cache update no later node reads) stays in its layer instead of trailing the
    whole graph, where its edges would jump over every later layer."""
    order = dfs_order(graph)
    pos = {v: float(k) for k, v in enumerate(order)}
    needed = set(dfs_order(graph, graph.outputs[:1]))
    key = {}
    for v in sorted(pos):  # node ids are in topological order
        key[v] = pos[v] if v in needed else max((key[j] for j in graph.nodes[v].inputs), default=-1.0) + 0.5
    return sorted(order, key=lambda v: (key[v], pos[v]))


def cut_points(graph: Graph, inputs: bool = False, primary: int | None = None,
               order: list[int] | None = None) -> list[int]:
    """Stream nodes no stream edge jumps over, in DFS order (graph outputs reach the end).

    With `inputs`, model inputs are stream nodes (their edges count and they can be cuts).  With `primary`, the
    stream is what depends on that input, and an output reaches only as far as its uses (it belongs to the block
    that computes it: a layer's cache update, see ``_blocks_from_cuts``); `order` is its ``early_order``, when
    the caller has it.
    """
    stream = _stream(graph, inputs, primary)
    if order is None:
        order = dfs_order(graph) if primary is None else early_order(graph)
    pos = {v: k for k, v in enumerate(order)}
    reach = {}
    for v in order:
        for j in graph.nodes[v].inputs:
            if stream[j]:
                reach[j] = max(reach.get(j, -1), pos[v])
    for o in graph.outputs if primary is None else ():
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
            if v == entry or n.op == Op.Input:
                if v == entry:
                    name, role = "__in__", "input"
                else:
                    # a state is a plain input of a block (its update is the whole program's business)
                    name, role = f"__i{len(names)}", "weight" if n.attrs["role"] == "weight" else "input"
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


def _blocks_from_cuts(graph: Graph, cuts: list[int], order: list[int] | None = None):
    """(blocks, (start, period, count), covered nodes) for one reading of the cut points, or None.

    With `order` (the ``early_order`` the cuts were found in), a graph output computed between two cuts (a layer's
    cache update in a generation step) is an output of that segment's block, so every layer's block holds its own
    updates and the layers still repeat; the outputs after the last repeated block go to the suffix."""
    inner_outputs = order is not None
    if len(cuts) < 3:
        return None
    segment = [[] for _ in cuts]  # per segment: the graph outputs computed inside it (inner_outputs)
    after = []  # outputs after the last cut
    if inner_outputs:
        pos = {v: k for k, v in enumerate(order)}
        ends = [pos[c] for c in cuts]
        for o in graph.outputs:  # (a cut that is an output belongs to the segment it ends)
            k = next((k for k, e in enumerate(ends) if pos[o] <= e), None)
            (after if k is None else segment[k]).append(o)
    segs = [block_graph(graph, [c, *[o for o in segment[k] if o != c]], cuts[k - 1] if k else None)
            for k, c in enumerate(cuts)]
    per = find_period([b.key for b in segs])
    if per is None:
        return None
    start, p, count = per
    covered = count * sum(len(b.graph.nodes) for b in segs[start:start + p])
    bounds = []  # (entry, first segment, last segment) per block
    if start > 0:
        bounds.append((None, 0, start - 1))
    for j in range(count):
        lo = start + j * p
        bounds.append((cuts[lo - 1] if lo > 0 else None, lo, lo + p - 1))
    last = start + count * p - 1
    blocks = [([cuts[hi], *[o for k in range(lo, hi + 1) for o in segment[k] if o != cuts[hi]]], entry)
              for entry, lo, hi in bounds]
    if inner_outputs:
        rest = {o for k in range(last + 1, len(cuts)) for o in segment[k]} | set(after)
        tail_outputs = [o for o in graph.outputs if o in rest] or None
    else:
        tail_outputs = list(graph.outputs) if list(graph.outputs) != [cuts[last]] else None
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
    # a third reading per model input: the stream is what depends on that input alone, so values every layer reads
    # that other inputs compute (a rotary embedding's cos / sin from the positions, masks) do not hide the cuts, and
    # outputs inside a layer (its cache update) belong to the layer's block
    early = early_order(graph)
    for i in graph.input_ids:
        if graph.nodes[i].attrs.get("role", "input") == "input":
            found = _blocks_from_cuts(graph, cut_points(graph, primary=i, order=early), early)
            if found is not None and (best is None or found[2] > best[2]):
                best = found
    return None if best is None else best[:2]
