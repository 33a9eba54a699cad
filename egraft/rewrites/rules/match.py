"""Pattern helpers for the procedural idiom and model rules (:mod:`.idioms`, :mod:`.models_scale`,
:mod:`.models_weights`).

The idiom rules have to recognise primitive programs whatever views sit
between their pieces: the builder writes ``x.max(-1, keepdim=True)`` as a
reduction, a keepdim reshape and later a broadcast, and it composes
consecutive views into one.  So the matchers here reason about *what a view
means* (a broadcast along one axis, a keepdim reshape, a batch broadcast of a
2-D matrix), never about how many view nodes spell it.

:class:`Index` wraps one :class:`~egraft.ir.egraph.Snapshot` with the
lookups the rules need (e-nodes by op, parents, scalar constants); the
right-hand-side terms are built with :mod:`egraft.rewrites.rule`
(``term``, ``view``, ``scalar``, ``contig``).
"""

from __future__ import annotations

import math
import weakref
from collections import defaultdict
from typing import Iterator, Sequence

import numpy as np

from ...ir.egraph import ENode, Snapshot, weight_only_classes
from ...errors import IRError
from ...ir import OPS, Group, Op, dtypes, get_op, shapes
from ...ir.builder import GraphBuilder
from ...ir.evaluate import evaluate
from ..rule import contig, norm_strides, term, view

Shape = tuple[int, ...]
_LAST: list = [None, None]  # (weak reference to the snapshot, its Index): one pass reads one snapshot


def close(a: float, b: float, rel: float = 1e-12) -> bool:
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b))


class _ByOp(defaultdict):
    """op name -> e-nodes: [] for an op with none, an IRError for a name the op table lacks (a typo finds nothing)."""

    def __missing__(self, op):
        get_op(op)
        return super().__missing__(op)


class Index:
    """Lookups over one snapshot, built once per procedural-rule pass (see :meth:`of`)."""

    @classmethod
    def of(cls, snap: Snapshot) -> "Index":
        """The Index of `snap`, shared by every rule that reads the same snapshot."""
        ref, ix = _LAST
        if ref is None or ref() is not snap:
            ix = cls(snap)
            _LAST[:] = [weakref.ref(snap), ix]
        return ix

    def __init__(self, snap: Snapshot):
        self.snap = snap
        self.by_op: dict[str, list[ENode]] = _ByOp(list)
        self._users: dict[int, list[ENode]] | None = None
        self._memo: dict[tuple, object] = {}
        self._cls_op: dict[tuple[int, str], list[ENode]] = defaultdict(list)
        for n in snap.nodes:
            self.by_op[n.op].append(n)
            self._cls_op[(n.cls, n.op)].append(n)

    # -- basic facts -----------------------------------------------------------------
    def shape(self, c: int) -> Shape:
        return tuple(self.snap.shape[c] or ())

    def dtype(self, c: int) -> str:
        return self.snap.dtype[c] or ""

    def nodes(self, c: int, op: str | None = None) -> list[ENode]:
        if op is None:
            return self.snap.nodes_of(c)
        got = self._cls_op.get((c, op))
        return got if got is not None else [] if op in OPS else get_op(op)

    def users(self, c: int) -> list[ENode]:
        if self._users is None:
            self._users = defaultdict(list)
            for n in self.snap.nodes:
                for k in set(n.children):
                    self._users[k].append(n)
        return self._users.get(c, [])

    def is_float(self, c: int) -> bool:
        return dtypes.is_float(self.dtype(c)) if self.dtype(c) else False

    # -- constants ----------------------------------------------------------------------
    def memo(self, key: tuple, make):
        """``make()`` computed once per snapshot under `key` (for matchers kept in rule modules)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def scalar(self, c: int) -> float | None:
        """The value of a class that is a scalar constant or a stride-0 broadcast of one."""
        key = ("scalar", c)
        if key not in self._memo:
            self._memo[key] = self._scalar(c)
        return self._memo[key]

    def _scalar(self, c: int) -> float | None:
        for n in self.nodes(c):
            if n.op == Op.Constant and tuple(n.attrs["shape"]) == () and not hasattr(n.attrs["value"], "array"):
                return n.attrs["value"]
            if n.op == Op.View and not any(n.attrs["strides"]):
                for m in self.nodes(n.children[0], Op.Constant):
                    if tuple(m.attrs["shape"]) == () and not hasattr(m.attrs["value"], "array"):
                        return m.attrs["value"]
        return None

    def scaled(self, c: int) -> Iterator[tuple[int, float]]:
        """(a, v) for every ``Mul(a, scalar v)`` (either operand order) in class c."""
        for n in self.nodes(c, Op.Mul):
            x, y = n.children
            for a, s in ((x, y), (y, x)):
                v = self.scalar(s)
                if v is not None and isinstance(v, float):
                    yield a, v

    # -- broadcasts along one axis ----------------------------------------------------------
    def bcast_axes(self, c: int) -> list[int]:
        """Axes ax for which class c is a broadcast along ax of something (cheap pre-filter)."""
        key = ("axes", c)
        if key not in self._memo:
            self._memo[key] = [ax for ax in range(len(self.shape(c))) if self.bcast_sources(c, ax)]
        return self._memo[key]

    def level_alts(self, c: int, ax: int) -> list[int]:
        """Classes equal to c up to a keepdim reshape at axis ``ax`` (c itself first).

        A reduced tensor ``r`` (shape S\\ax) and its keepdim reshape (S with a 1
        at ax) hold the same values, and a pattern may be spelt at either
        level; this lets a matcher look at both.
        """
        key = ("alts", c, ax)
        if key in self._memo:
            return self._memo[key]
        out = [c]
        sc = self.shape(c)
        for n in self.nodes(c, Op.View):
            src = n.children[0]
            if self._keep_reshape(self.shape(src), n.attrs, ax):
                out.append(src)
        for n in self.users(c):
            if n.op == Op.View and self._keep_reshape(sc, n.attrs, ax):
                out.append(n.cls)
        out = self._memo[key] = list(dict.fromkeys(out))
        return out

    @staticmethod
    def _keep_reshape(src_shape, attrs, ax) -> bool:
        """Is the view a reshape between a reduced shape and its keepdim form (either way)?"""
        src_shape, shape = tuple(src_shape), tuple(attrs["shape"])
        if attrs["offset"] != 0 or norm_strides(shape, attrs["strides"]) != contig(shape):
            return False
        lo, hi = (src_shape, shape) if len(shape) == len(src_shape) + 1 else (shape, src_shape)
        return len(hi) == len(lo) + 1 and 0 <= ax < len(hi) and hi[ax] == 1 and hi[:ax] + hi[ax + 1:] == lo

    def bcast_sources(self, c: int, ax: int) -> list[int]:
        """Classes r such that c is r broadcast along axis ``ax`` (r reduced or keepdim)."""
        key = ("bcast", c, ax)
        if key in self._memo:
            return self._memo[key]
        full = self.shape(c)
        out = self._memo[key] = []
        for n in self.nodes(c, Op.View):
            src = n.children[0]
            ss = self.shape(src)
            if n.attrs["offset"] != 0 or tuple(n.attrs["shape"]) != full:
                continue
            st = tuple(n.attrs["strides"])
            if ss == full[:ax] + full[ax + 1:]:
                cs = list(shapes.contiguous_strides(ss))
                cs.insert(ax, 0)
                if norm_strides(full, st) == norm_strides(full, cs):
                    out.append(src)
            elif ss == full[:ax] + (1,) + full[ax + 1:]:
                cs = list(shapes.contiguous_strides(ss))
                cs[ax] = 0
                if norm_strides(full, st) == norm_strides(full, cs):
                    out.append(src)
        return out

    def find(self, c: int, ax: int, op: str) -> Iterator[ENode]:
        """e-nodes of `op` in c or in its keepdim-level alternatives."""
        for a in self.level_alts(c, ax):
            yield from self.nodes(a, op)

    def reduced_of(self, c: int, ax: int, op: str, child: int | None = None) -> Iterator[int]:
        """x such that c (at either level) holds ``op(x, axis=ax)`` (x == child if given)."""
        for n in self.find(c, ax, op):
            if n.attrs["axis"] == ax and (child is None or n.children[0] == child):
                yield n.children[0]

    def mean_of(self, c: int, ax: int) -> Iterator[int]:
        """x such that c is ``SumReduce(x, ax) * (1/n)`` (at either level), n = x.shape[ax]."""
        for a in self.level_alts(c, ax):
            for s, v in self.scaled(a):
                for x in self.reduced_of(s, ax, "SumReduce"):
                    if close(v, 1.0 / self.shape(x)[ax]):
                        yield x

    # -- matrices ------------------------------------------------------------------------------
    def is_weight(self, c: int) -> bool:
        return any(n.op == Op.Input and n.attrs.get("role") == "weight" for n in self.nodes(c))

    def weight_only(self, c: int) -> bool:
        """Does class c have a program that reads only weights, constants and Iota?

        Such values are computed once at load time (backends/fold.py), so the
        rules that move work onto weights only fire when the moved work is
        weight-only.
        """
        wo = self._memo.get("weight_only")
        if wo is None:
            wo = weight_only_classes(self.snap.nodes, self.snap.n_classes)
            self._memo["weight_only"] = wo
        return wo[c]

    def weight_matrices(self, c: int) -> list[tuple[int, Shape, int]]:
        """(w, (s_k, s_n), offset) for each way class c ``[..., K, N]`` is a batch broadcast
        of a 2-D strided view of weight w (plain weights included)."""
        sh = self.shape(c)
        if len(sh) < 2:
            return []
        out = []
        if len(sh) == 2 and self.is_weight(c):
            out.append((c, contig(sh), 0))
        for n in self.nodes(c, Op.View):
            st = norm_strides(sh, n.attrs["strides"])
            src = n.children[0]
            if any(st[:-2]) or not self.is_weight(src):
                continue
            out.append((src, tuple(st[-2:]), int(n.attrs["offset"])))
        return out

    def matrix_term(self, w: int, kn: Sequence[int], st: Sequence[int], off: int):
        return view(w, self.shape(w), tuple(kn), st, off)


def matmuls(ix: Index) -> Iterator[tuple[ENode, int, int]]:
    """(node, a, b) for every ``MatMul(a, b)`` e-node."""
    for n in ix.by_op[Op.MatMul]:
        yield n, n.children[0], n.children[1]


def batch_bcast(t, kn: Sequence[int], batch: Sequence[int]):
    """A 2-D matrix term ``[K, N]`` broadcast (stride 0) over leading batch dims."""
    k, n = kn
    if not batch:
        return t
    return term("View", t, shape=tuple(batch) + (k, n), strides=norm_strides(tuple(batch) + (k, n), (0,) * len(batch) + (n, 1)), offset=0)


def const_mask(ix: Index, c: int, limit: int = 64) -> np.ndarray | None:
    """Evaluate a constant-only class (Iota/Constant/views/compares) to a numpy array.

    Used to recognise a causal mask whatever primitives spell it.  Returns
    None when the class depends on an input or needs more than `limit` nodes.
    """
    b = GraphBuilder()
    memo: dict[int, object] = {}
    budget = [limit]

    def build(k: int, depth: int):
        if k in memo:
            return memo[k]
        if depth > 24 or budget[0] <= 0:
            return None
        memo[k] = None  # cycle guard
        for n in sorted(ix.nodes(k), key=lambda n: len(n.children)):
            if n.op == Op.Input or n.op in Group.IDIOM:
                continue
            kids = []
            for ch in n.children:
                t = build(ch, depth + 1)
                if t is None:
                    break
                kids.append(t)
            else:
                budget[0] -= 1
                try:
                    t = b.add(n.op, kids, **n.attrs.as_dict())
                except IRError:
                    continue
                memo[k] = t
                return t
        return None

    t = build(c, 0)
    if t is None:
        return None
    g = b.build([t])
    try:
        return evaluate(g, [])[0]
    except IRError:  # e.g. an integer Mod by zero or a Gather index out of range
        return None


def is_causal_mask(ix: Index, c: int) -> bool:
    """Is class c (bool ``[..., Sq, Sk]``) the top-left causal mask ``j <= i`` broadcast over batch?"""
    sh = ix.shape(c)
    if len(sh) < 2 or ix.dtype(c) != "bool":
        return False
    sq, sk = sh[-2:]
    want = np.tril(np.ones((sq, sk), bool))
    cands = [c]
    for n in ix.nodes(c, Op.View):  # peel a batch broadcast before evaluating
        st = norm_strides(sh, n.attrs["strides"])
        if not any(st[:-2]):
            src = n.children[0]
            if ix.shape(src) == (sq, sk) and st[-2:] == contig((sq, sk)) and n.attrs["offset"] == 0:
                cands.insert(0, src)
    if math.prod(sh) > 1 << 16 and len(cands) == 1:
        return False
    for k in cands:
        m = const_mask(ix, k)
        if m is None:
            continue
        m = np.asarray(m).reshape(ix.shape(k))
        if m.shape == (sq, sk):
            return bool(np.array_equal(m, want))
        return bool(np.array_equal(m, np.broadcast_to(want, m.shape)))
    return False
