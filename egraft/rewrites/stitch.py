"""A small e-graph in Python, assembled from saturated pieces, exported as a :class:`Snapshot`.

Repeated-layer saturation (:mod:`egraft.rewrites.repeated`) saturates each
distinct layer once in egglog and then needs the whole model's e-graph:
every occurrence of the layer is a copy of the saturated template with its
boundary classes (the previous layer's output, its own weights) renamed.
Replaying those copies into egglog costs one parsed command per e-node, which
is linear in the layer count and slower than saturating.  Here the copies are
added to a plain-Python e-graph instead: union-find over class ids, a hashcons
of canonical e-nodes, and a congruence rebuild, so that pieces which meet
(the shared model input, constants and constant-only subterms every layer
computes, a layer's output that is the next layer's input) become one class,
exactly as egglog would merge them.

The e-graph is never rewritten here: every union either comes from a template
(already proven by egglog) or is forced by congruence, so it is as sound as
the templates.  A union of classes whose shape or dtype differ can only mean
an unsound template and raises :class:`egraft.errors.SaturationError`.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import SaturationError
from ..ir.graph import Attrs
from .codec import Context
from ..ir.egraph import ENode, Snapshot


class Stitcher:
    """Union-find + hashcons + rebuild: the minimum of an e-graph needed to join templates."""

    def __init__(self):
        self.parent: list[int] = []
        self.shape: list = []
        self.dtype: list = []
        self.ops: list[str] = []
        self.attrs: list[Attrs] = []
        self.kids: list[tuple[int, ...]] = []
        self.cls: list[int] = []
        self.hashcons: dict = {}
        self.unions = 0

    # -- classes ----------------------------------------------------------------------------
    def new_class(self, shape, dtype) -> int:
        self.parent.append(len(self.parent))
        self.shape.append(None if shape is None else tuple(shape))
        self.dtype.append(dtype)
        return len(self.parent) - 1

    def find(self, c: int) -> int:
        parent = self.parent
        root = c
        while parent[root] != root:
            root = parent[root]
        while parent[c] != root:
            parent[c], c = root, parent[c]
        return root

    def union(self, a: int, b: int) -> int:
        a, b = self.find(a), self.find(b)
        if a == b:
            return a
        for what, store in (("shape", self.shape), ("dtype", self.dtype)):
            x, y = store[a], store[b]
            if x is not None and y is not None and x != y:
                raise SaturationError(
                    f"joining saturated layers equated classes of different {what} ({x} vs {y}): a rule "
                    "is unsound. Find it with tests/rewrites (per-rule soundness) or saturate with "
                    "Limits(repeated_layers=False) to compare.")
            if x is None:
                store[a] = y
        if b < a:
            a, b = b, a
        self.parent[b] = a
        self.unions += 1
        return a

    # -- e-nodes ----------------------------------------------------------------------------
    def add(self, op: str, attrs: Attrs, children: Sequence[int], cls: int) -> int:
        """Add e-node `op(children)` to class `cls` (merging with an existing equal e-node)."""
        find = self.find
        kids = tuple(find(k) for k in children)
        key = (op, attrs, kids)
        hit = self.hashcons.get(key)
        if hit is not None:
            return self.union(self.cls[hit], cls)
        self.hashcons[key] = len(self.ops)
        self.ops.append(op)
        self.attrs.append(attrs)
        self.kids.append(kids)
        self.cls.append(cls)
        return find(cls)

    def rebuild(self) -> int:
        """Restore congruence (equal e-nodes in one class, no duplicates); returns the passes run."""
        passes = 0
        while True:
            passes += 1
            before = self.unions
            find = self.find
            hc: dict = {}
            keep: list[int] = []
            ops, attrs, kids, cls = self.ops, self.attrs, self.kids, self.cls
            for i in range(len(ops)):
                k = tuple(find(c) for c in kids[i])
                kids[i] = k
                key = (ops[i], attrs[i], k)
                hit = hc.get(key)
                if hit is None:
                    hc[key] = i
                    keep.append(i)
                else:
                    self.union(cls[hit], cls[i])
            if len(keep) != len(ops):
                self.ops = [ops[i] for i in keep]
                self.attrs = [attrs[i] for i in keep]
                self.kids = [kids[i] for i in keep]
                self.cls = [cls[i] for i in keep]
            if self.unions == before:
                self.hashcons = {(self.ops[i], self.attrs[i], self.kids[i]): i for i in range(len(self.ops))}
                return passes

    # -- export -----------------------------------------------------------------------------
    def snapshot(self, class_of: dict[int, int], ctx: Context) -> Snapshot:
        """The rebuilt e-graph as a Snapshot; `class_of` maps handle -> (any) class id."""
        self.rebuild()
        find = self.find
        dense: dict[int, int] = {}
        for c in range(len(self.parent)):
            r = find(c)
            if r not in dense:
                dense[r] = len(dense)
        nodes = [ENode(op, a, tuple(dense[k] for k in ks), dense[find(c)])
                 for op, a, ks, c in zip(self.ops, self.attrs, self.kids, self.cls)]
        classes: list[list[int]] = [[] for _ in dense]
        for i, n in enumerate(nodes):
            classes[n.cls].append(i)
        shape: list = [None] * len(dense)
        dtype: list = [None] * len(dense)
        for r, d in dense.items():
            shape[d], dtype[d] = self.shape[r], self.dtype[r]
        handles = {h: dense[find(c)] for h, c in class_of.items()}
        return Snapshot(nodes, classes, shape, dtype, handles, ctx)
