"""The e-graph as a plain-Python search space, and extraction of programs from it.

A genome is one e-node choice per e-class (an index into ``space.classes[c]``).
``extract`` turns any genome into an ``ir.Graph``; a choice that would close a
cycle is repaired deterministically: the class that closes it falls back to its
*safe* e-node (the one of least height, whose children all have smaller height),
and if that still closes the cycle every class on it does; all-safe choices
are acyclic by construction.  Classes holding a model input or weight always
extract as that ``Input``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import IRError
from ..ir import Group, Op
from ..ir.graph import Graph, Node
from ..ir.egraph import ENode, Snapshot, best_by_cost


@dataclass
class Space:
    nodes: list[ENode]
    classes: list[list[int]]  # e-node indices per class
    shape: list[tuple[int, ...] | None]
    dtype: list[str | None]
    roots: list[int]  # class per graph output
    inputs: list[int]  # class per model input, in the model's order
    input_names: list[str]
    weights: Mapping[str, np.ndarray]
    # the rest of the source graph's signature, which every extraction keeps (``ir.Graph.signature``)
    sources: Mapping[str, str] = field(default_factory=dict)
    aliases: Mapping[int, str] = field(default_factory=dict)
    # derived in __post_init__: extraction rank, safe e-node and extractable e-nodes per class
    rank: list[float] = field(init=False, repr=False)
    safe: list[int] = field(init=False, repr=False)
    usable: list[list[int]] = field(init=False, repr=False)
    _snap: Snapshot = field(init=False, repr=False)

    # -- construction ---------------------------------------------------------------
    @classmethod
    def from_egraph(cls, result) -> "Space":
        """Lift a :class:`egraft.rewrites.SaturationResult` into plain Python."""
        snap: Snapshot = result.snapshot()
        roots = [snap.class_of_handle[h] for h in result.output_handles]
        inputs = [snap.class_of_handle[h] for h in result.input_handles]
        g = result.graph
        return cls.from_snapshot(snap, roots, inputs, g.input_names(), dict(g.weights), g.sources, g.aliases)

    @classmethod
    def from_snapshot(cls, snap: Snapshot, roots, inputs, input_names, weights, sources=None, aliases=None) -> "Space":
        return cls(nodes=snap.nodes, classes=snap.classes, shape=snap.shape, dtype=snap.dtype, roots=list(roots),
                   inputs=list(inputs), input_names=list(input_names), weights=weights, sources=dict(sources or {}),
                   aliases=dict(aliases or {}))

    def __post_init__(self):
        snap = Snapshot(nodes=self.nodes, classes=self.classes, shape=self.shape, dtype=self.dtype,
                        class_of_handle={}, ctx=None)
        self._snap = snap
        rank, safe = best_by_cost(snap, [1.0] * len(self.nodes), "max")
        for c, members in enumerate(self.classes):
            for ni in members:
                if self.nodes[ni].op == Op.Input:
                    safe[c] = ni
        self.rank, self.safe = rank, safe
        # e-nodes whose children are all extractable (finite rank), per class
        self.usable = [[ni for ni in members if all(rank[k] < math.inf for k in self.nodes[ni].children)]
                       for members in self.classes]

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    def stats(self) -> dict:
        return {"classes": self.n_classes, "nodes": self.n_nodes,
                "choices": sum(1 for u in self.usable if len(u) > 1)}

    # -- extraction -----------------------------------------------------------------------
    def _node_choice(self, choices) -> list[int]:
        """Genome (class -> index into classes[c]) to e-node ids, defaults to the safe node."""
        ch = list(self.safe)
        items = choices.items() if isinstance(choices, Mapping) else enumerate(choices or ())
        for c, k in items:
            members = self.classes[c]
            if members and self.safe[c] >= 0 and self.nodes[self.safe[c]].op != Op.Input:
                ni = members[int(k) % len(members)]
                if all(self.rank[x] < math.inf for x in self.nodes[ni].children):
                    ch[c] = ni
        return ch

    def _acyclic(self, ch: list[int]) -> list[int]:
        """Repair `ch` in place until the extraction is acyclic; returns classes in post-order."""
        nodes, safe = self.nodes, self.safe
        while True:
            color: dict[int, int] = {}
            order: list[int] = []
            bad = None
            for root in list(self.inputs) + list(self.roots):
                if color.get(root):
                    continue
                color[root] = 1
                stack = [[root, 0]]
                while stack:
                    top = stack[-1]
                    c, k = top
                    kids = nodes[ch[c]].children
                    if k < len(kids):
                        top[1] = k + 1
                        d = kids[k]
                        col = color.get(d, 0)
                        if col == 0:
                            color[d] = 1
                            stack.append([d, 0])
                        elif col == 1:
                            bad = (c, d, [s for s, _ in stack])
                            break
                    else:
                        color[c] = 2
                        order.append(c)
                        stack.pop()
                if bad:
                    break
            if bad is None:
                return order
            c, d, on_stack = bad
            if ch[c] != safe[c]:
                ch[c] = safe[c]
            else:
                for s in on_stack[on_stack.index(d):]:
                    ch[s] = safe[s]

    def extract(self, choices: Mapping[int, int] | Sequence[int] | None = None) -> Graph:
        """The program picked by `choices` (class -> e-node index within the class) as an ir.Graph."""
        return self.build(self._node_choice(choices))

    def build(self, ch: list[int], recompute: frozenset[int] | set[int] = frozenset()) -> Graph:
        """The program of one e-node id per class (`ch[c]`), repaired to be acyclic (in place).

        A class in `recompute` that the program uses more than once is emitted
        once per use instead of once in all (each consumer recomputes it: the
        materialise-or-recompute choice that tree extraction cannot express);
        its own children are shared unless they are recomputed too.  Leaves
        and views are never duplicated (they cost nothing to share).
        """
        order = self._acyclic(ch)
        nodes = self.nodes
        uses: dict[int, int] = {}
        if recompute:
            for c in order:
                for k in nodes[ch[c]].children:
                    uses[k] = uses.get(k, 0) + 1
            for r in self.roots:
                uses[r] = uses.get(r, 0) + 1
        dup = {c for c in recompute if uses.get(c, 0) > 1 and nodes[ch[c]].op not in Group.LEAF
               and nodes[ch[c]].op not in Group.MOVEMENT}
        ids: dict[int, int] = {}
        out_nodes: list[Node] = []

        def emit(c: int) -> int:
            n = nodes[ch[c]]
            out_nodes.append(Node(n.op, tuple(ref(k) for k in n.children), n.attrs, tuple(self.shape[c]),
                                  self.dtype[c]))
            return len(out_nodes) - 1

        def ref(c: int) -> int:  # a shared node, or a fresh copy of a recomputed one
            return emit(c) if c in dup else ids[c]

        for c in order:
            if c not in dup:
                ids[c] = emit(c)
        try:
            return Graph(out_nodes, [ref(r) for r in self.roots], [ids[c] for c in self.inputs], self.weights,
                         sources=self.sources, aliases=self.aliases)
        except IRError as e:
            raise IRError(f"extraction produced an ill-typed graph (an unsound rule?): {e}") from None

    def shared(self, ch: list[int]) -> list[int]:
        """Classes the program of `ch` computes once and uses several times (materialise candidates)."""
        order = self._acyclic(list(ch))
        uses: dict[int, int] = {}
        for c in order:
            for k in self.nodes[ch[c]].children:
                uses[k] = uses.get(k, 0) + 1
        skip = Group.LEAF | Group.MOVEMENT
        return [c for c in order if uses.get(c, 0) > 1 and self.nodes[ch[c]].op not in skip]

    def sample(self, rng: np.random.Generator | int | None = None) -> Graph:
        """A random acyclic extraction: a uniform e-node choice per class, then repaired."""
        return self.build(self.random_choices(rng))

    def random_choices(self, rng=None) -> list[int]:
        rng = np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng
        ch = list(self.safe)
        for c, usable in enumerate(self.usable):
            if len(usable) > 1 and self.nodes[self.safe[c]].op != Op.Input:
                ch[c] = usable[int(rng.integers(len(usable)))]
        return ch

    def greedy_choice(self, cost_fn: Callable[[ENode, "Space"], float] | None = None) -> list[int]:
        """The e-node id per class of the least tree-cost extraction (default cost: :func:`default_cost`)."""
        fn = cost_fn or default_cost
        floor = 1e-9 if cost_fn is None else 1e-18  # roofline costs are seconds: tiny but meaningful
        costs = [max(float(fn(n, self)), floor) for n in self.nodes]
        for i, n in enumerate(self.nodes):
            if n.op == Op.Input:
                costs[i] = floor * 1e-3
        _, ch = best_by_cost(self._snap, costs, "sum")
        return [x if x >= 0 else s for x, s in zip(ch, self.safe)]

    def greedy(self, cost_fn: Callable[[ENode, "Space"], float] | None = None) -> Graph:
        """Least tree-cost extraction; default cost: :func:`default_cost` (FLOPs + bytes)."""
        return self.build(self.greedy_choice(cost_fn))



_FLOP_WEIGHT = {"Iota": 0.5, "Cast": 0.5}  # ops cheaper than one FLOP per element


def default_cost(node: ENode, space: Space) -> float:
    """A rough FLOPs-plus-bytes estimate of one e-node (a stand-in for the roofline model).

    Views are nearly free (a small bytes charge so needless view chains lose);
    reductions, idioms and elementwise ops pay for the elements they read.
    """
    out = math.prod(space.shape[node.cls] or ())
    if node.op in Group.LEAF:
        return 1e-6
    if node.op in Group.MOVEMENT:
        return 1e-3 * (1 + out / 1e6)
    ins = sum(math.prod(space.shape[c] or ()) for c in node.children)
    if node.op in Group.CONTRACTION:
        a, b = space.shape[node.children[0]], space.shape[node.children[1]]
        flops = 2 * math.prod(a) * b[-1] / 8  # idiom kernels run on matrix units
    elif node.op in Group.ROW_IDIOM:
        flops = 5 * out / 4  # one fused kernel instead of ~8 primitive passes
    elif node.op in Group.ATTENTION:
        q, k, v = (space.shape[c] for c in node.children[:3])
        flops = 2 * math.prod(q) * k[-2] * (1 + v[-1] / q[-1]) / 8
    else:
        flops = max(out, ins) * (1.0 - _FLOP_WEIGHT.get(node.op, 0.0))
    return flops + 0.5 * (ins + out)
