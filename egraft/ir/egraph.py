"""The e-graph as plain Python: e-nodes, a :class:`Snapshot` of e-classes, extraction by cost.

A leaf module (it imports only the IR's ``Attrs``): the rewrites build
snapshots from egglog and read them in procedural rules, the stitcher
assembles repeated layers into one, and ``egraft.search.Space`` extracts
programs from one.  Class ids are dense ints ``0..n_classes-1`` that index
one snapshot only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .graph import Attrs
from .op_groups import Op


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
    ctx: Any  # the encoding context (constants, roles) of the saturation it came from
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


def weight_only_classes(nodes: list[ENode], n_classes: int) -> list[bool]:
    """Per class: does it hold a program that reads only weights, constants and ``Iota``?

    Such values are computed once when an executable is built or loaded
    (``backends/fold.py``), so rules that move work onto weights check it and
    the cost model does not charge it per call.  A worklist fixpoint: a class
    is weight-only once one of its e-nodes has only weight-only children.
    """
    wo = [False] * n_classes
    pending = [len(set(n.children)) for n in nodes]
    parents: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        for c in set(n.children):
            parents.setdefault(c, []).append(i)
    work = [i for i, n in enumerate(nodes) if not n.children and (n.op != Op.Input or n.attrs.get("role") == "weight")]
    while work:
        c = nodes[work.pop()].cls
        if wo[c]:
            continue
        wo[c] = True
        for p in parents.get(c, ()):
            pending[p] -= 1
            if pending[p] == 0:
                work.append(p)
    return wo
