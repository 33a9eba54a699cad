"""Which axis of each output carries the rows of a varying axis, when rows provably never meet.

A dimension that varies between calls (sequence length, batch, vLLM's
``num_tokens``) can be covered by a few compiles at padded sizes only if
padding is exact: the padded rows must never meet the real ones.
:func:`row_axes` proves that for an :class:`~egraft.ir.graph.Graph` traced
at one size ``N``: given, for some inputs, the axis that varies (its length
``N`` in each), it follows that axis through every node and returns, per
output, the axis that carries the rows (None: the output does not depend on
them), or the reason some node mixes rows:

* elementwise ops (``Group.ELEMENTWISE``) keep each operand's row axis; two
  operands whose rows lie on different axes mix them (a causal mask
  ``i < j`` built from two broadcast positions);
* a reduction (``Group.REDUCE``) or a row idiom (``Group.ROW_IDIOM``:
  softmax, the norms) over the row axis mixes rows; over another axis it
  keeps them;
* ``MatMul`` keeps rows on batch axes, on ``a``'s M and ``b``'s N, and mixes
  them when they are its contraction axis K;
* ``Attention`` keeps rows on batch axes, on ``q``'s and the bias's query
  axis and ``v``'s value axis; rows among the keys (``k``/``v``'s ``Sk``) or
  on the head dim mix (attention across the rows);
* ``Gather`` / ``Scatter`` keep rows off their axis; indexing *along* the
  row axis of the source or target mixes (a lookup into the rows);
* a ``View`` keeps rows when exactly one of its axes walks the row axis
  forwards from row 0 as its outermost digit (:func:`egraft.ir.strided.read_map`):
  reshapes that split or merge other axes, permutes, broadcasts and slices
  of other axes.  Rows may be merged with inner axes (``[B, S, d] ->
  [B*S, d]`` with rows along ``B``): row ``i`` is then block ``i`` of the
  merged axis, and a later reshape may split the block off again; an output
  must hold its rows unmerged.  A view that selects, slices or flips the
  rows, or merges them under an outer axis, is refused;
* ``Iota(N)`` is a row's own index (axis 0: the same value for row ``i`` at
  every ``N``); other leaves are row-free, except a tensor constant with an
  axis of length ``N``: uniform along it, it is a broadcast over the rows,
  else refused (whether it follows the rows cannot be told).  Likewise a
  broadcast (stride 0) view axis of length ``N`` is a row axis: a row-free
  value repeated over the rows, whose sum (``ones(n).sum()``, which counts
  the padded rows) is refused like any sum over the rows;
* every other op is refused by name: a new op joins by its kind's group or
  not at all.

The verdict is about one traced size: row ``i`` of each output depends on
row ``i`` of the inputs only, and on nothing that depends on ``N``.  Hence a
graph traced at a padded size ``N`` gives, on its first ``n`` rows, what the
graph traced at ``n`` gives.  A scalar that equals ``N`` baked into the
program as a value cannot be told apart from a constant here; the caller
(the Dynamo bucket runner) checks that from the program it traced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..errors import InputError
from .graph import Graph, Node
from .op_groups import Group, Op
from .ops import TensorValue
from .shapes import normalize_axis
from .strided import read_map


@dataclass(frozen=True)
class Rows:
    """The verdict: per output the axis carrying the rows (None: row-free), or why rows meet."""

    axes: tuple[int | None, ...]
    length: int  # N, the rows' length in the traced graph
    reason: str = ""  # non-empty: not independent

    @property
    def independent(self) -> bool:
        return not self.reason

    def __bool__(self) -> bool:
        return self.independent


class _Mixed:
    """A value in which rows meet, with the first node that mixed them."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why


def row_axes(graph: Graph, varying: Mapping[str, int]) -> Rows:
    """Prove rows along the `varying` axes (input name -> axis) independent (module docstring)."""
    specs = {s.name: s for s in graph.signature.call_inputs}
    if not varying:
        raise InputError("row_axes needs at least one input and its varying axis, e.g. {'x': 0}")
    lengths = {}
    for name, ax in varying.items():
        if name not in specs:
            raise InputError(f"row_axes: {name!r} is not an input of the graph; its inputs are "
                             f"{', '.join(specs) or 'none'}")
        shape = tuple(specs[name].shape)
        if not isinstance(ax, int) or not -len(shape) <= ax < len(shape):
            raise InputError(f"row_axes: axis {ax!r} is out of range for input {name!r} of shape {shape}")
        lengths[name] = shape[normalize_axis(ax, len(shape))]
    if len(set(lengths.values())) != 1:
        raise InputError(f"row_axes: the varying axes have different lengths {lengths}; give the axes of one "
                         "varying size")
    n = lengths.popitem()[1]
    if n < 2:
        return Rows((), n, f"the rows have length {n}: trace at a length of 2 or more to tell them apart")
    state: list = []  # per node: None (row-free), a _Mixed, or (axis, block): row i is block i of that axis
    for i, node in enumerate(graph.nodes):
        ins = [state[j] for j in node.inputs]
        mixed = next((s for s in ins if isinstance(s, _Mixed)), None)
        if mixed is not None:
            state.append(mixed)
            continue
        try:
            state.append(_rule(node, ins, graph, varying, n))
        except _Refused as e:
            state.append(_Mixed(f"node {i} ({node.op} {node.shape}) {e}"))
    axes = []
    for k, o in enumerate(graph.outputs):
        s = state[o]
        if isinstance(s, _Mixed):
            return Rows((), n, f"output {k}: {s.why}")
        if s is not None and s[1] != 1:
            return Rows((), n, f"output {k}: its axis {s[0]} holds the rows merged with another axis "
                               f"({s[1]} elements per row)")
        axes.append(None if s is None else s[0])
    return Rows(tuple(axes), n)


class _Refused(Exception):
    pass


def _one(node: Node, placed: list) -> tuple[int, int] | None:
    """The one (axis, block) every row-carrying operand puts its rows on (None: no operand carries rows)."""
    axes = {a for a in placed if a is not None}
    if len(axes) > 1:
        raise _Refused(f"combines rows lying on (axis, block) {sorted(axes)} (an output element meets several rows)")
    return axes.pop() if axes else None


def _axis(s) -> int | None:
    return None if s is None else s[0]


def _rule(node: Node, ins: list, graph: Graph, varying: Mapping[str, int], n: int):
    op, a = node.op, node.attrs
    if op == Op.Input:
        name = a["name"]
        return (normalize_axis(varying[name], len(node.shape)), 1) if name in varying else None
    if op == Op.Constant:
        return _constant(node, n)
    if op == Op.Iota:  # i*K + j for row i: the same at every N
        return (0, a["n"] // n) if a["n"] % n == 0 and a["n"] else None
    if op == Op.View:
        return _view(node, ins[0], graph.nodes[node.inputs[0]].shape, n)
    if op in Group.ELEMENTWISE:
        return _one(node, ins)
    if op in Group.REDUCE:
        r = ins[0]
        if r is None:
            return None
        if r[0] == a["axis"]:
            raise _Refused(f"reduces over the rows (axis {r[0]})")
        return (r[0] - (a["axis"] < r[0]), r[1])
    if op in Group.ROW_IDIOM:
        if _axis(ins[0]) == a["axis"]:
            raise _Refused(f"normalises along the rows (axis {a['axis']})")
        return ins[0]
    rule = _RULES.get(op)
    if rule is None:
        raise _Refused("is an op whose effect on rows is not known here (only ops of known kinds are proven)")
    return rule(node, [_axis(s) for s in ins], ins)


def _constant(node: Node, n: int):
    """A constant is row-free, unless it has an axis of the rows' length: along it, it must be uniform, and is
    then a broadcast over the rows (so a later sum over that axis counts the padded rows too, and is refused)."""
    v = node.attrs["value"]
    if not isinstance(v, TensorValue):
        return None
    arr = v.array
    axes = [d for d, size in enumerate(arr.shape) if size == n]
    for d in axes:
        if arr.size and not np.all(arr == np.take(arr, [0], axis=d)):
            raise _Refused(f"is a constant whose values vary along axis {d}, of the rows' length {n}: "
                           "whether it follows the rows cannot be told")
    if len(axes) > 1:
        raise _Refused(f"is a constant with several axes of the rows' length ({axes})")
    return (axes[0], 1) if axes else None


def _view(node: Node, r, src_shape: tuple[int, ...], n: int):
    a = node.attrs
    # a broadcast (stride 0) axis of the rows' length repeats one value over the rows: it is a row axis, so
    # a sum over it (which would count the padded rows) is refused like any sum over the rows
    spread = [d for d, (size, st) in enumerate(zip(a["shape"], a["strides"])) if st == 0 and size == n]
    if r is None:
        if len(spread) > 1:
            raise _Refused(f"broadcasts over the rows' length along several axes {spread}")
        return (spread[0], 1) if spread else None
    ra, block = r
    m = read_map(src_shape, a["shape"], a["strides"], a["offset"])
    if m is None:
        raise _Refused("is a view whose reads cannot be mapped digit by digit")
    # the row digit walks the row axis from row 0 in steps of `step`, a divisor of the block (the whole block
    # in one digit, or a reshape that splits each row's block off); every other digit on the row axis stays
    # inside one step (a slice or select within each row)
    row = [(d, k, p.step) for d, pieces in enumerate(m.pieces) for k, p in enumerate(pieces)
           if p.dim == ra and p.step > 0 and block % p.step == 0 and p.size == n * (block // p.step)]
    if len(row) != 1:
        raise _Refused(f"selects, slices, flips or strides across the rows (axis {ra}, {block} element(s) per "
                       f"row): it reads {[[tuple(p) for p in ps] for ps in m.pieces]} from {m.base}")
    d, k, step = row[0]
    inner = [p for e, pieces in enumerate(m.pieces) for j, p in enumerate(pieces) if p.dim == ra and (e, j) != (d, k)]
    lo = m.base[ra] + sum(min(0, (p.size - 1) * p.step) for p in inner)
    hi = m.base[ra] + sum(max(0, (p.size - 1) * p.step) for p in inner)
    if lo < 0 or hi >= step:
        raise _Refused(f"reads across the blocks of the rows (axis {ra}, {block} element(s) per row): "
                       f"{[[tuple(p) for p in ps] for ps in m.pieces]} from {m.base}")
    if k:
        raise _Refused(f"puts the rows (axis {ra}) inside a merged axis {d}, under {m.pieces[d][:k]}")
    if [e for e in spread if e != d]:
        raise _Refused(f"broadcasts the rows (axis {d}) along another axis of their length")
    return (d, block // step * int(np.prod([p.size for p in m.pieces[d][1:]], dtype=np.int64)))


def _matmul(node: Node, ax: list, ins: list):
    rank = len(node.shape)
    if ax[0] == rank - 1 or ax[1] == rank - 2:
        raise _Refused("contracts over the rows (they are its K axis)")
    return _one(node, ins)


def _attention(node: Node, ax: list, ins: list):
    rank = len(node.shape)
    q, k, v = ax[:3]
    bias = ax[3] if len(ax) == 4 else None
    if q == rank - 1 or k == rank - 1:
        raise _Refused("contracts over the rows (they are the head dim of q or k)")
    if k == rank - 2 or v == rank - 2 or bias == rank - 1:
        raise _Refused("attends across the rows (they are the keys)")
    return _one(node, ins)


def _gather(node: Node, ax: list, ins: list):
    if ax[0] is not None and ax[0] == node.attrs["axis"]:
        raise _Refused(f"indexes along the rows (axis {ax[0]})")
    return _one(node, ins)


def _scatter(node: Node, ax: list, ins: list):
    if node.attrs["axis"] in ax:
        raise _Refused(f"writes along the rows (axis {node.attrs['axis']})")
    return _one(node, ins)


_RULES = {Op.MatMul: _matmul, Op.Attention: _attention, Op.Gather: _gather, Op.Scatter: _scatter}

__all__ = ["Rows", "row_axes"]
