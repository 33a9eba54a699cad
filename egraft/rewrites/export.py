"""The e-graph as plain Python: a :class:`Snapshot` of one moment of an egglog e-graph.

Read through egglog's frozen e-graph (one table per constructor: input
values, output e-class value), which is fast (~0.1 s for 40k e-nodes) and,
unlike the JSON serialisation, gives children as e-class values.  Class
values are renumbered to dense ints ``0..n_classes-1``; they index one
snapshot only (egglog's value ids change between runs).

Procedural rules read a Snapshot; ``egraft.search.Space`` is built from one.
Handle nodes ``(H i)`` are not e-nodes of the program: they are read into
``class_of_handle`` and dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ir.graph import Attrs
from .encode import HANDLE, SIGS, Context, Decoder


@dataclass(frozen=True)
class ENode:
    op: str
    attrs: Attrs
    children: tuple[int, ...]
    cls: int

    def key(self):
        return (self.op, self.attrs, self.children)


@dataclass
class Snapshot:
    nodes: list[ENode]
    classes: list[list[int]]  # e-node indices per class
    shape: list[tuple[int, ...] | None]
    dtype: list[str | None]
    class_of_handle: dict[int, int]
    ctx: Context
    values: list[Any] = field(repr=False, default_factory=list)  # egglog Value per class
    _index: dict | None = field(default=None, repr=False)
    _handle_of: dict | None = field(default=None, repr=False)
    _by_op: dict | None = field(default=None, repr=False)

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    def lookup(self, op: str, attrs, children) -> int | None:
        """The class holding an e-node with this op/attrs/children, if one exists."""
        if self._index is None:
            self._index = {n.key(): n.cls for n in self.nodes}
        return self._index.get((op, Attrs(attrs) if not isinstance(attrs, Attrs) else attrs, tuple(children)))

    def handle_of(self, cls: int) -> int | None:
        if self._handle_of is None:
            self._handle_of = {}
            for h, c in sorted(self.class_of_handle.items()):
                self._handle_of.setdefault(c, h)
        return self._handle_of.get(cls)

    def by_op(self, op: str) -> list[ENode]:
        """All e-nodes with this IR op."""
        if self._by_op is None:
            self._by_op = {}
            for n in self.nodes:
                self._by_op.setdefault(n.op, []).append(n)
        return self._by_op.get(op, [])

    def nodes_of(self, cls: int, op: str | None = None) -> list[ENode]:
        if op is not None:
            return [self.nodes[i] for i in self.classes[cls] if self.nodes[i].op == op]
        return [self.nodes[i] for i in self.classes[cls]]

    def parents(self) -> list[list[int]]:
        """e-node indices using each class as a child."""
        ps: list[list[int]] = [[] for _ in self.classes]
        for i, n in enumerate(self.nodes):
            for c in set(n.children):
                ps[c].append(i)
        return ps


def snapshot(egraph, ctx: Context) -> Snapshot:
    """Read the whole e-graph (after its analysis has run) into a Snapshot."""
    frozen = egraph.freeze()
    dec = Decoder(egraph, ctx)
    ids: dict[Any, int] = {}
    values: list[Any] = []

    def cid(v) -> int:
        i = ids.get(v)
        if i is None:
            i = ids[v] = len(values)
            values.append(v)
        return i

    nodes: list[ENode] = []
    for ctor in SIGS:
        fn = frozen.functions.get(ctor)
        if fn is None:
            continue
        for row in fn.rows:
            if row.subsumed:
                continue
            op, attrs, kids = dec.row(ctor, row.inputs)
            nodes.append(ENode(op, attrs, tuple(cid(k) for k in kids), cid(row.output)))
    class_of_handle = {}
    hf = frozen.functions.get(HANDLE)
    for row in (hf.rows if hf else []):
        class_of_handle[dec.prim("i64", row.inputs[0])] = cid(row.output)
    n = len(values)
    classes: list[list[int]] = [[] for _ in range(n)]
    for i, node in enumerate(nodes):
        classes[node.cls].append(i)
    shape: list = [None] * n
    dtype: list = [None] * n
    for fname, store, kind in (("shape", shape, "IVec"), ("dtype", dtype, "String")):
        fn = frozen.functions.get(fname)
        for row in (fn.rows if fn else []):
            c = ids.get(row.inputs[0])
            if c is not None:
                store[c] = dec.prim(kind, row.output)
    return Snapshot(nodes, classes, shape, dtype, class_of_handle, ctx, values)


def best_by_cost(snap: Snapshot, node_cost, combine: str = "sum") -> tuple[list[float], list[int]]:
    """Least cost per class and the e-node achieving it (Knuth's generalised Dijkstra).

    ``combine="sum"`` gives tree cost (node cost + children's costs),
    ``"max"`` gives height-like ranks.  With positive node costs the chosen
    e-nodes always form an acyclic extraction: a chosen node's children
    have strictly smaller cost than its class.  Classes with no finite-cost
    node (only reachable through cycles) keep cost inf and choice -1.
    """
    import heapq

    nodes = snap.nodes
    inf = float("inf")
    best = [inf] * snap.n_classes
    choice = [-1] * snap.n_classes
    pending = [len(set(n.children)) for n in nodes]
    parents = snap.parents()
    cost = node_cost if isinstance(node_cost, list) else [node_cost(n) for n in nodes]
    heap = [(cost[i], i) for i, n in enumerate(nodes) if not n.children]
    heapq.heapify(heap)
    summing = combine == "sum"
    while heap:
        val, ni = heapq.heappop(heap)
        c = nodes[ni].cls
        if choice[c] >= 0:
            continue
        best[c], choice[c] = val, ni
        for pi in parents[c]:
            pending[pi] -= 1
            if pending[pi] == 0:
                kids = [best[k] for k in nodes[pi].children]
                v = cost[pi] + (sum(kids) if summing else max(kids))
                heapq.heappush(heap, (v, pi))
    return best, choice
