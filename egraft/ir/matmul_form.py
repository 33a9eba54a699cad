"""Recognising a matrix product written in primitives, for any backend.

The builder (and the torch lowering) writes ``a @ b`` as
``SumReduce(Mul(View_expand(a), View_expand(b)), axis=k)`` over a product
of shape ``[..., M, K, N]``.  Run literally, that materialises the whole
product before reducing it, so every backend looks for this form and runs
it as a dot instead.  :func:`matmul_form` is the one place that reads the
pattern off a :class:`~egraft.ir.graph.Graph`: which node is each factor,
what it reads through its view, and along which product axes it varies.
What a backend then accepts (only true broadcasts, only ``[..., M, N]``
outputs, only float dtypes) is its own policy, written over the
:class:`MatmulForm` it gets here.

A factor *varies* along a product axis unless it provably does not: the
axis has size 1, the factor is a ``View`` with stride 0 there, or it is an
elementwise op all of whose operands do not vary there (a cast or a scale
of a broadcast operand).
"""

from __future__ import annotations

from dataclasses import dataclass

from .graph import Graph
from .op_groups import Group, Op


@dataclass(frozen=True)
class Factor:
    """One operand of the product, as read from the graph."""

    node: int  # the Mul's operand
    src: int  # the node it reads: the View's source, or `node` itself when it is not a View
    view: tuple | None  # (shape, strides, offset) of src without the broadcast dims; None: src as it is
    axes: tuple[int, ...]  # the product axes the dims of `view` (or of src) stand for, in order
    invariant: frozenset[int]  # product axes along which the factor provably does not vary
    broadcast: bool  # a View that repeats values (stride 0 along an axis of size > 1)

    def varies(self, axis: int) -> bool:
        return axis not in self.invariant


@dataclass(frozen=True)
class MatmulForm:
    """``out = SumReduce(Mul(lhs, rhs), axis=k)``: a contraction over product axis `k`.

    Product axes other than `k` are *batch* (both factors vary along them),
    *M* (only `lhs` varies), *N* (only `rhs` varies) or broadcast (neither
    does).  Output axis ``i`` is product axis ``i`` below `k`, ``i + 1`` from it on.
    """

    node: int  # the SumReduce
    mul: int  # the Mul
    k: int  # the contracted product axis
    shape: tuple[int, ...]  # the product's shape
    dtype: str
    lhs: Factor
    rhs: Factor

    @property
    def K(self) -> int:
        return self.shape[self.k]

    def _axes(self, lhs: bool, rhs: bool) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.shape)) if d != self.k and self.shape[d] > 1
                     and self.lhs.varies(d) == lhs and self.rhs.varies(d) == rhs)

    @property
    def batch_axes(self) -> tuple[int, ...]:
        return self._axes(True, True)

    @property
    def m_axes(self) -> tuple[int, ...]:
        return self._axes(True, False)

    @property
    def n_axes(self) -> tuple[int, ...]:
        return self._axes(False, True)

    @property
    def broadcast_axes(self) -> tuple[int, ...]:
        return self._axes(False, False)

    def product_axis(self, out_axis: int) -> int:
        return out_axis if out_axis < self.k else out_axis + 1

    def swapped(self) -> "MatmulForm":
        return MatmulForm(self.node, self.mul, self.k, self.shape, self.dtype, self.rhs, self.lhs)

    def oriented(self, m: int, n: int) -> "MatmulForm | None":
        """This form with the factor constant along product axis `n` as lhs and the one constant along `m` as rhs.

        The factors are swapped if they come the other way round; None if
        neither order fits (then the product is not an ``[.., M, K] @ [.., K, N]``
        over those axes).
        """
        if not self.lhs.varies(n) and not self.rhs.varies(m):
            return self
        if not self.rhs.varies(n) and not self.lhs.varies(m):
            return self.swapped()
        return None


MAX_DEPTH = 64  # elementwise ops looked through; deeper, a factor counts as varying (never wrong, only slower)


def invariant_axes(graph: Graph, nid: int) -> frozenset[int]:
    """Axes along which node `nid`'s value provably does not vary: size 1, a View's stride-0 axes, and through
    elementwise ops (up to MAX_DEPTH deep) the axes invariant in every operand."""
    memo: dict[tuple[int, int], bool] = {}
    rank = len(graph.nodes[nid].shape)

    def invariant(i: int, axis: int, depth: int) -> bool:
        key = (i, axis)
        if key not in memo:
            n = graph.nodes[i]
            if n.shape[axis] == 1:
                memo[key] = True
            elif n.op == Op.View:
                memo[key] = n.attrs["strides"][axis] == 0
            elif n.op in Group.ELEMENTWISE and depth < MAX_DEPTH:
                memo[key] = all(invariant(j, axis, depth + 1) for j in n.inputs)
            else:
                memo[key] = False
        return memo[key]

    return frozenset(d for d in range(rank) if invariant(nid, d, 0))


def _factor(graph: Graph, nid: int) -> Factor:
    n = graph.nodes[nid]
    invariant = invariant_axes(graph, nid)
    if n.op != Op.View:
        return Factor(nid, nid, None, tuple(range(len(n.shape))), invariant, False)
    shape, strides, off = n.attrs["shape"], n.attrs["strides"], n.attrs["offset"]
    axes = tuple(d for d, (sz, st) in enumerate(zip(shape, strides)) if sz > 1 and st != 0)
    if len(axes) == len(shape):
        return Factor(nid, n.inputs[0], (tuple(shape), tuple(strides), off), axes, invariant, False)
    view = (tuple(shape[d] for d in axes), tuple(strides[d] for d in axes), off)
    broadcast = any(sz > 1 and st == 0 for sz, st in zip(shape, strides))
    return Factor(nid, n.inputs[0], view, axes, invariant, broadcast)


def matmul_form(graph: Graph, nid: int) -> MatmulForm | None:
    """The contraction node `nid` computes, or None if it is not ``SumReduce(Mul(x, y))`` over a shared K.

    K is shared when both factors vary along the reduced axis (or it has
    size 1); a reduce along an axis one factor is broadcast over is a row
    sum scaled by that factor, not a matrix product.
    """
    n = graph.nodes[nid]
    if n.op != Op.SumReduce:
        return None
    mul = graph.nodes[n.inputs[0]]
    if mul.op != Op.Mul:  # (SumReduce is not defined on bool, so neither is this Mul)
        return None
    k = n.attrs["axis"]
    lhs, rhs = _factor(graph, mul.inputs[0]), _factor(graph, mul.inputs[1])
    if mul.shape[k] > 1 and not (lhs.varies(k) and rhs.varies(k)):
        return None
    return MatmulForm(nid, n.inputs[0], k, tuple(mul.shape), n.dtype, lhs, rhs)
